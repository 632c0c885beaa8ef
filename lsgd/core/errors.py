"""Exceptions raised by lsgd before or during a run."""


class ConfigError(ValueError):
    """An invalid configuration, raised in the main process before any worker starts.

    The message names the offending config key and the allowed values (or how to fix it),
    e.g. ``algo.local_steps must be an integer >= 1, got 0``.
    """

