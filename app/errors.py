"""The error a config that cannot work raises: :class:`ConfigError`.

Every check of a config value raises it with the key, the value and the valid choices, so ``train.py``
(and the other entry points) can tell a user's mistake from a bug: a ``ConfigError`` ends the run with one
``error:`` line and exit status 2, anything else with its traceback.
"""

from __future__ import annotations

__all__ = ["ConfigError"]


class ConfigError(ValueError):
    """A config value that cannot work, named by its key with the valid choices."""
