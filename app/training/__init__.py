"""Training: the LightningModule, its callbacks, optimiser and loss, and the ``train(cfg)`` task.

Entry point: :func:`app.training.task.train`. Everything here may import Lightning and Hydra; the
models, attention and decoding packages it trains never do.
"""
