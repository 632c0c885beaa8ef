"""Typed config blocks: a dataclass declares a block's keys once, with their defaults, types and
allowed values; :func:`parse` checks a composed block against it.

An algorithm or a compressor declares its keys as a dataclass whose fields are :func:`option` s::

    @dataclass
    class LocalSGDConfig(AlgoConfig):
        local_steps: int = option(8, at_least=1, doc="H: local steps between averagings")
        buffer_policy: str = option("maintain", choices=("reset", "maintain", "average"))

The same dataclass is Hydra's schema of the config group (:func:`lsgd.config.schemas.register_schemas`
stores it in Hydra's ConfigStore; ``conf/algo/<name>.yaml`` is a preset of it that lists only what
it changes), so the defaults live in one place, and :func:`parse` is the validation in the main
process before any worker starts: a key the dataclass does not declare, a value of the wrong type or
outside the allowed values is a :class:`~lsgd.core.errors.ConfigError` that names the key and what
is allowed.

Written here rather than taken from a library: Hydra's own structured-config checks run while the
config is composed and raise Hydra's errors (and accept an unknown key added with ``+``); pydantic
would be a new dependency for the few checks below (types, choices, bounds) and words its errors its
own way, while lsgd's errors name the key as the user types it (``algo.local_steps``).
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Mapping
from typing import Any

from lsgd.core.errors import ConfigError


def option(default: Any = dataclasses.MISSING, *, choices: tuple | None = None, at_least: float | None = None,
           above: float | None = None, at_most: float | None = None, below: float | None = None,
           doc: str = "", symbol: str | tuple[str, str] | dict[str, str] | None = None,
           default_factory: Any = dataclasses.MISSING) -> Any:
    """A field of a typed config block with its default and constraints.

    Args:
        default: the value when the config does not set the key (lists: ``default_factory``).
        choices: the allowed values (strings, or any values compared with ``==``).
        at_least, above, at_most, below: bounds of a number (``>=``, ``>``, ``<=``, ``<``).
        doc: what the key means (its symbol in the paper, its unit); shown in the docs.
        symbol: how the report's labels and the loggers' run names write the key
            (:meth:`lsgd.algorithms.base.Algorithm.label_facts`): a name, ``"H"`` (``H=8``; the
            symbols of docs/glossary.md); ``""``: the value alone (``ring``); for a bool, the words
            for true and false, ``("blocking", "non-blocking")``; for a choice, a word per value,
            ``{"lockstep": "lock-step", "virtual_time": "asynchronous"}`` (a value not in it: the
            value alone). None (the default): the key's name with spaces for ``_`` (``buffer
            policy=reset``).
    """
    meta = {"choices": tuple(choices) if choices is not None else None, "at_least": at_least, "above": above,
            "at_most": at_most, "below": below, "doc": doc, "symbol": symbol}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def fields(cls: type) -> dict[str, dataclasses.Field]:
    """The fields of config dataclass ``cls`` by name, in declaration order."""
    return {f.name: f for f in dataclasses.fields(cls)}


def defaults(cls: type) -> dict[str, Any]:
    """``{key: default}`` of config dataclass ``cls``."""
    return dataclasses.asdict(cls())


def _type_name(tp: Any) -> str:
    if tp is type(None):
        return "null"
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is list:
        (arg,) = typing.get_args(tp) or (Any,)
        return f"a list of {_type_name(arg)}" if arg is not Any else "a list"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(tp, getattr(tp, "__name__", str(tp)))


def _matches(value: Any, tp: Any) -> bool:
    if tp is Any:
        return True
    if tp is type(None):
        return value is None
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, a) for a in typing.get_args(tp))
    if origin is list:
        args = typing.get_args(tp)
        return isinstance(value, (list, tuple)) and all(_matches(v, args[0]) for v in value) if args else isinstance(value, (list, tuple))
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is str:
        return isinstance(value, str)
    return isinstance(value, tp)


def _bounds_text(meta: Mapping) -> str:
    parts = []
    for key, op in (("at_least", ">="), ("above", ">"), ("at_most", "<="), ("below", "<")):
        if meta.get(key) is not None:
            parts.append(f"{op} {meta[key]:g}")
    return " and ".join(parts)


def check_value(key: str, value: Any, field: dataclasses.Field, tp: Any) -> None:
    """Check one value against its field's type, choices and bounds.

    Raises:
        ConfigError: naming ``key`` (as the user types it) and what is allowed.
    """
    meta = field.metadata
    choices = meta.get("choices")
    if choices is not None and value is not None:
        if value not in choices or not _matches(value, tp):
            raise ConfigError(f"{key}={value!r} is not allowed; allowed: {', '.join(map(str, choices))}")
        return
    if not _matches(value, tp):
        raise ConfigError(f"{key} must be {_type_name(tp)}, got {value!r}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        lo, gt, hi, lt = meta.get("at_least"), meta.get("above"), meta.get("at_most"), meta.get("below")
        if (lo is not None and not value >= lo) or (gt is not None and not value > gt) or \
                (hi is not None and not value <= hi) or (lt is not None and not value < lt):
            raise ConfigError(f"{key} must be {_type_name(tp)} {_bounds_text(meta)}, got {value!r}")


def unknown_key_error(where: str, key: str, known: list[str], what: str) -> ConfigError:
    """The error for a key ``what`` does not declare, with the closest declared key."""
    close = difflib.get_close_matches(key, known, n=1)
    hint = f"; did you mean {where}{close[0]}?" if close else ""
    return ConfigError(f"unknown config key {where}{key} for {what}{hint} (keys: {', '.join(known)})")


def parse(cls: type, block: Mapping, where: str, what: str | None = None) -> Any:
    """Config dataclass ``cls`` filled from ``block`` (a composed config block, a plain dict):
    every key checked; keys the block leaves out take their defaults.

    Args:
        cls: the dataclass (fields made with :func:`option`).
        block: ``{key: value}``.
        where: the block's prefix as users type it (``"algo."``).
        what: how the error names the owner (``"algo=local_sgd"``); default ``where`` without its dot.

    Raises:
        ConfigError: a key ``cls`` does not declare (with the closest declared key), a value of
            the wrong type, not among the choices or out of bounds.
    """
    declared = fields(cls)
    hints = typing.get_type_hints(cls)
    for key in block:
        if key not in declared:
            raise unknown_key_error(where, str(key), list(declared), what or where.rstrip("."))
    values = {}
    for name, field in declared.items():
        if name in block:
            check_value(f"{where}{name}", block[name], field, hints[name])
            values[name] = block[name]
    return cls(**values)
