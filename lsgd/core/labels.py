"""How a run's config is written for people: ``"local SGD, H=8"`` rather than ``"algo.name=local_sgd,
algo.local_steps=8"``.

The words of methods, compressors and their keys come from the registry (:mod:`lsgd.core.registry`),
never from a table here: when a run folder is made, the launcher writes the run's *label facts* to ``labels.json``
(:data:`lsgd.core.run_files.LABELS_FILE`, made by
:meth:`lsgd.algorithms.base.Algorithm.label_facts` from the algorithm's and the compressor's
registry entries and the ``symbol`` of its typed config's fields), a JSON object of three entries:

``values``
    ``{key: the run's value as written}`` for the keys whose value alone is a label part: the method
    (``"algo.name": "local SGD"``), the compressor (``"algo.compressor": "top-k"``), a topology
    (``"ring"``), a bool as its word (``"algo.blocking": "non-blocking"``), a choice as its
    word (``"algo.pairing": "lock-step"`` of AD-PSGD).
``symbols``
    ``{key: its name in a label}`` for the keys written ``name=value`` under a name of their own
    (``"algo.local_steps": "H"``, ``"algo.cf": "CF"``).
``defining_keys``
    the keys written in every label of the run, whatever other runs hold (H of local SGD, the
    compressor of ``compressed`` and the key that sets its strength, the graph of a gossip method).

The formatting here is shared by the loggers (a W&B / TensorBoard run's name, written in the
training process from the registry's facts) and by the report's tables and figures
(:mod:`lsgd.analysis.arms`, which reads the facts from each run folder and chooses which keys a
label needs). A run without facts (made before lsgd wrote them) is written as plain parts:
``local_sgd``, ``local steps=8``. A leaf module without pandas, so a training process never imports
the analysis stack.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Mapping

import numpy as np

#: Run-level keys whose value alone is a label part, written first: the method and a study's arm.
NAME_KEYS = ("algo.name", "study.arm")

#: Names in labels of run-level keys, which no algorithm declares (an algorithm's keys declare
#: theirs: ``symbol`` of :func:`lsgd.core.typed_config.option`); any other key is written as its
#: last dotted part with ``_`` as spaces (``optim.lr`` -> ``lr``).
KEY_NAMES = {
    "batch_size": "batch",
    "launcher.nproc_per_node": "workers",
    "world_size": "workers",
    "dataset.alpha": "Dirichlet alpha",
}


def is_missing(value) -> bool:
    """Whether a config value is absent: None, NaN, or pandas' NA / NaT (a table's empty cell)."""
    if value is None:
        return True
    if type(value).__name__ in ("NAType", "NaTType"):
        return True
    try:
        return bool(value != value)  # NaN is the one value unequal to itself
    except (TypeError, ValueError):  # arrays, lists
        return False


def format_value(value) -> str:
    """A config value as written in a label or table: ``8`` not ``8.0``, ``true``, ``0.001``."""
    if is_missing(value):
        return ""
    if isinstance(value, (bool, np.bool_)):
        return "true" if value else "false"
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        value = float(value)
        return str(int(value)) if value.is_integer() and abs(value) < 1e15 else f"{value:g}"
    return str(value)


def flatten(config: Mapping, prefix: str = "") -> dict:
    """A nested config mapping as ``{dotted.key: value}`` (lists and other values as they are); a
    flattened one stays as it is."""
    out: dict = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, prefix=f"{name}."))
        else:
            out[name] = value
    return out


def merged_symbols(facts: Iterable[Mapping | None]) -> dict[str, str]:
    """The ``symbols`` of several runs' label facts in one mapping (the first run's name of a key
    wins), so that a report names a key one way."""
    out: dict[str, str] = {}
    for f in facts:
        for key, symbol in ((f or {}).get("symbols") or {}).items():
            out.setdefault(key, symbol)
    return out


def key_name(key: str, keys: Iterable[str] = (), symbols: Mapping[str, str] | None = None) -> str:
    """How ``key`` is named in a label: its symbol (``symbols``: the runs' label facts, e.g.
    ``H``), else :data:`KEY_NAMES`, else its last dotted part with spaces; its full dotted name
    when another of ``keys`` would get the same short name."""
    symbols = symbols or {}

    def short(k: str) -> str:
        return symbols.get(k) or KEY_NAMES.get(k) or str(k).rsplit(".", 1)[-1].replace("_", " ")

    name = short(key)
    if any(short(k) == name for k in keys if k != key):
        return str(key)
    return name


def written_alone(key: str, facts: Iterable[Mapping | None] = ()) -> bool:
    """Whether a label writes ``key``'s value alone (``local SGD``, ``ring``, ``blocking``) rather
    than ``name=value``: a key of :data:`NAME_KEYS`, or one that some run's facts write so."""
    return key in NAME_KEYS or any(key in ((f or {}).get("values") or {}) for f in facts)


def label_part(key: str, value, keys: Iterable[str] = (), facts: Mapping | None = None,
               symbols: Mapping[str, str] | None = None) -> str:
    """One part of a run's label: ``"local SGD"`` (algo.name), ``"top-k"``, ``"H=8"``,
    ``"error feedback"``; ``""`` for a missing value.

    Args:
        key, value: the config key and the run's value of it.
        keys: the other keys written in the labels (a key whose short name another one shares is
            written in full).
        facts: the run's label facts (module docstring); None: a run without them, written as
            plain parts (``local_sgd``, ``local steps=8``).
        symbols: the key names of every run labelled together (:func:`merged_symbols`; default:
            ``facts``' own).
    """
    if is_missing(value):
        return ""
    written = (facts or {}).get("values") or {}
    if key in written:
        return str(written[key])
    text = format_value(value)
    if key in NAME_KEYS:
        return text
    if symbols is None:
        symbols = (facts or {}).get("symbols") or {}
    return f"{key_name(key, keys, symbols)}={text}"


def defining_keys(config: Mapping, facts: Mapping | None) -> list[str]:
    """The keys that define the method of one run (``config``: its flattened config, or a row of
    :func:`lsgd.analysis.load_summaries`), in label order: its facts' ``defining_keys`` that the run
    sets (``algo.local_steps`` of local SGD; ``algo.compressor`` and ``algo.cf`` of compressed
    top-k, only the compressor for ``fp16``). ``[]`` for a method that none defines (DDP) or a run
    without facts."""
    keys = (facts or {}).get("defining_keys") or ()
    return [k for k in keys if k in config and not is_missing(config.get(k))]


def config_label_parts(config: Mapping, facts: Mapping | None = None, extra: Iterable[str] = ()) -> list[str]:
    """The parts of one run's label from its config alone (no other arms to tell apart), in order:
    ``algo.name``, ``study.arm`` where set, the run's :func:`defining_keys`, then ``extra`` keys
    where the config sets them: ``["local SGD", "H=8"]``, ``["compressed", "top-k", "CF=100"]``.

    Args:
        config: the run's config, nested (``{"algo": {"name": ...}}``, as config.yaml) or
            flattened (``{"algo.name": ...}``).
        facts: the run's label facts (module docstring); None: plain parts, no defining keys.
        extra: further dotted keys to write.
    """
    flat = flatten(config)
    keys = [k for k in NAME_KEYS if not is_missing(flat.get(k))]
    keys = list(dict.fromkeys([*keys, *defining_keys(flat, facts), *extra]))
    parts = [label_part(k, flat[k], keys, facts) for k in keys if k in flat]
    return [p for p in parts if p]


def config_label(config: Mapping, facts: Mapping | None = None, extra: Iterable[str] = ()) -> str:
    """:func:`config_label_parts` joined: ``"local SGD, H=8"``, ``"DDP"``, ``"local SGD, H=8,
    seed=1"`` (``extra=["seed"]``); ``"all runs"`` when there is none."""
    return ", ".join(config_label_parts(config, facts, extra)) or "all runs"
