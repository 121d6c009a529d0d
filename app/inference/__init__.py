"""Inference: the :class:`~app.inference.torch_engine.TorchEngine`, the ``translate.py`` command line and
test-set evaluation. Nothing here imports Lightning or Hydra."""
