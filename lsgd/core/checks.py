"""Checks of one config value, each raising :class:`lsgd.core.errors.ConfigError` that names the key
and what is allowed (``algo.local_steps must be an integer >= 1, got 0``).

``cfg`` is the plain dict of one config block and ``where`` the key's prefix (``"algo."``), so the
message names the key as the user types it.
"""

from __future__ import annotations

from lsgd.core.errors import ConfigError


def int_at_least(cfg: dict, key: str, minimum: int, where: str = "") -> None:
    value = cfg.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{where}{key} must be an integer >= {minimum}, got {value!r}")


def positive(cfg: dict, key: str, where: str) -> None:
    value = cfg.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(f"{where}{key} must be a number > 0, got {value!r}")


def choice(cfg: dict, key: str, allowed, where: str) -> None:
    if cfg.get(key) not in allowed:
        raise ConfigError(f"{where}{key}={cfg.get(key)!r} is not allowed; allowed: {', '.join(map(str, allowed))}")


def number_at_least(cfg: dict, key: str, minimum: float, where: str) -> None:
    value = cfg.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= minimum:
        raise ConfigError(f"{where}{key} must be a number >= {minimum:g}, got {value!r}")


def in_interval(cfg: dict, key: str, lo: float, hi: float, where: str, lo_open: bool = True) -> None:
    value = cfg.get(key)
    ok = not isinstance(value, bool) and isinstance(value, (int, float))
    ok = ok and (lo < value if lo_open else lo <= value) and value <= hi
    if not ok:
        raise ConfigError(f"{where}{key} must be in {'(' if lo_open else '['}{lo:g}, {hi:g}], got {value!r}")


def in_half_open(cfg: dict, key: str, lo: float, hi: float, where: str) -> None:
    """``cfg[key]`` is a number in [lo, hi)."""
    value = cfg.get(key)
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and lo <= value < hi
    if not ok:
        raise ConfigError(f"{where}{key} must be a number in [{lo:g}, {hi:g}), got {value!r}")
