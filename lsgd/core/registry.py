"""The one registry mechanism of lsgd: algorithms, compressors, models, datasets, optimizers and
schedules are each a :class:`Registry` of named :class:`Entry` s.

An entry carries what every reader needs, declared once next to the component: the object (a class
or a builder), its typed config (a dataclass of :mod:`lsgd.core.typed_config`, or None), how it is
written in tables and figures (``label``), a one-line summary and its source (a paper, as a section
of docs/papers.md). ``lsgd list`` prints the entries, config validation looks names up here (an
unknown name is a :class:`~lsgd.core.errors.ConfigError` that lists the registered names and the
closest one), and the run folder records an entry's label and defining keys for the report.

A registry is filled when the module that defines its members is imported: algorithms register by
subclassing :class:`lsgd.algorithms.base.Algorithm` (``__init_subclass__`` calls :meth:`Registry.add`),
other components with the :meth:`Registry.register` decorator or :meth:`Registry.add` calls.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from lsgd.core.errors import ConfigError

T = TypeVar("T")


@dataclass(frozen=True)
class Entry(Generic[T]):
    """One registered component.

    Attributes:
        name: the value of the registry's key (``algo.name=local_sgd``).
        obj: the class or builder.
        config: its typed config dataclass (:mod:`lsgd.core.typed_config`), or None.
        label: how tables and figures write it (``"local SGD"``); default the name.
        summary: one line for ``lsgd list``.
        paper: the source, a docs/papers.md anchor (``docs/papers.md#local-sgd``) or a citation.
        defining_keys: config keys written in every label of a run of it, whatever other runs hold
            (H of local SGD: ``("algo.local_steps",)``).
        extra: registry-specific facts (a compressor's strength key, a model's kind).
    """

    name: str
    obj: T
    config: type | None = None
    label: str = ""
    summary: str = ""
    paper: str = ""
    defining_keys: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)


class Registry(Generic[T]):
    """Named components of one kind.

    Args:
        kind: what the members are (``"algorithm"``), for messages.
        key: the config key that names a member (``"algo.name"``), for messages.
    """

    def __init__(self, kind: str, key: str):
        self.kind = kind
        self.key = key
        self._entries: dict[str, Entry[T]] = {}

    def add(self, name: str, obj: T, *, config: type | None = None, label: str = "", summary: str = "",
            paper: str = "", defining_keys: tuple[str, ...] = (), **extra: Any) -> Entry[T]:
        """Register ``obj`` as ``name``.

        Raises:
            ValueError: ``name`` is registered already to another object.
        """
        old = self._entries.get(name)
        if old is not None and old.obj is not obj:
            raise ValueError(f"{self.kind} {name!r} registered twice: {old.obj!r} and {obj!r}")
        entry = Entry(name, obj, config, label or name, summary, paper, tuple(defining_keys), dict(extra))
        self._entries[name] = entry
        return entry

    def register(self, name: str, **meta: Any) -> Callable[[T], T]:
        """Decorator form of :meth:`add`: ``@MODELS.register("cnn", label="CNN")``."""
        def wrap(obj: T) -> T:
            self.add(name, obj, **meta)
            return obj
        return wrap

    def entry(self, name: str) -> Entry[T]:
        """The entry of ``name``.

        Raises:
            ConfigError: ``name`` is not registered (the message names the key, the registered names
                and the closest one).
        """
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise self.unknown(name) from None

    def __getitem__(self, name: str) -> T:
        """The registered object of ``name`` (a :class:`ConfigError` when unknown, see :meth:`entry`)."""
        return self.entry(name).obj

    def unknown(self, name: Any) -> ConfigError:
        """The error for a name that is not registered."""
        close = difflib.get_close_matches(str(name), list(self._entries), n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        return ConfigError(f"{self.key}={name!r} is not a registered {self.kind}{hint} (allowed: {', '.join(self.names())})")

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def names(self) -> list[str]:
        """The registered names, sorted."""
        return sorted(self._entries)

    def entries(self) -> list[Entry[T]]:
        """The entries, sorted by name."""
        return [self._entries[n] for n in self.names()]

    def items(self) -> list[tuple[str, T]]:
        """``(name, object)`` pairs, sorted by name."""
        return [(e.name, e.obj) for e in self.entries()]
