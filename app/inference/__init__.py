"""Inference: the :class:`~app.inference.translator.Translator`, the ``translate.py`` command line and
test-set evaluation. Nothing here imports Lightning or Hydra."""
