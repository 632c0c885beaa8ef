"""Arms: runs that differ only in their seed, and the readable labels tables and figures give them.

An *arm* is the set of runs of one experiment whose configs are equal except for the seed keys
(``seed`` and every key ending in ``.seed``, such as ``algo.seed``, which defaults to the run's
``seed``) and bookkeeping (run id, run folder, ``results_dir``, ``resume``). A sweep run with
``-m seed=0,1,2`` gives each arm three runs; :func:`lsgd.analysis.aggregate_seeds` averages them.

Labels are for people: ``"local SGD, H=8"`` rather than ``"algo.name=local_sgd,
algo.local_steps=8"``. :func:`arm_labels` writes the keys needed to tell the arms apart
(:func:`label_keys`) and, for each run, the keys that define its method even where every arm has
the same value (:func:`defining_keys`: H of local SGD, SlowMo and DiLoCo, the compressor and its CF
of ``compressed``, the topology of the gossip methods). The words are not kept here: each run
folder's ``labels.json`` holds them (its method's and compressor's written names, its keys'
symbols, its defining keys; :mod:`lsgd.core.labels`, written by the launcher from the registries),
read into the frames' :data:`lsgd.analysis.load.LABELS_COLUMN`. A run without it (made before lsgd
wrote it) is written as plain ``key=value`` parts with no defining keys: ``local_sgd``,
``local steps=8``. :func:`config_label` labels one run from its config alone.
"""

from __future__ import annotations

import functools
import json
import numbers
from collections.abc import Iterable, Mapping

import numpy as np
import pandas as pd

from lsgd.analysis.load import (
    DEFAULT_IGNORED_KEYS,
    LABELS_COLUMN,
    _hashable,
    config_columns,
    differing_keys,
    flatten_config,
)
from lsgd.core.labels import KEY_NAMES, NAME_KEYS, format_value, key_name, label_part, merged_symbols, written_alone
from lsgd.core.labels import config_label as _config_label
from lsgd.core.labels import defining_keys as _defining_keys
from lsgd.core.labels import is_missing as _is_missing

#: Keys tried first when choosing the keys of a label (then ``algo.*``, then the rest).
LABEL_KEY_PRIORITY = NAME_KEYS


def is_seed_key(key: str) -> bool:
    """Whether config key ``key`` is a seed: ``seed`` or any ``<group>.seed`` (``algo.seed``)."""
    return key == "seed" or str(key).endswith(".seed")


def seed_keys(frame: pd.DataFrame) -> list[str]:
    """The seed keys (:func:`is_seed_key`) among the config columns of ``frame``."""
    return [k for k in config_columns(frame) if is_seed_key(k)]


def arm_keys(frame: pd.DataFrame, ignore: Iterable[str] = DEFAULT_IGNORED_KEYS) -> list[str]:
    """Config keys that tell the arms of ``frame`` apart: :func:`lsgd.analysis.differing_keys`
    without the seed keys (runs that differ only in them are one arm).

    Args:
        frame: from :func:`lsgd.analysis.load_summaries` or :func:`lsgd.analysis.load_runs`.
        ignore: further keys to leave out (default: the bookkeeping keys).
    """
    return differing_keys(frame, ignore=tuple(ignore) + tuple(seed_keys(frame)))


def _per_run(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.drop_duplicates("run_dir") if "run_dir" in frame else frame


def label_keys(frame: pd.DataFrame, keys: list[str] | None = None) -> list[str]:
    """The fewest of ``keys`` (default :func:`arm_keys`), chosen greedily, that still tell every arm
    apart: ``algo.name`` and ``study.arm`` are tried first, then the ``algo.*`` keys, then the
    rest, list values (``algo.speeds``) last, and a key is taken only if it splits arms that the
    keys taken before leave together.

    For DDP next to local SGD at H = 8 and 16 that is ``algo.name`` and ``algo.local_steps``.
    """
    if keys is None:
        keys = arm_keys(frame)
    runs = _per_run(frame)
    present = [k for k in keys if k in runs]
    values = {k: [_hashable(v) for v in runs[k].tolist()] for k in present}  # NaN -> None: one value
    listed = {k for k in present if all(isinstance(v, str) and v.startswith("[") for v in values[k] if v is not None)}
    order = sorted(
        present,
        key=lambda k: (
            LABEL_KEY_PRIORITY.index(k) if k in LABEL_KEY_PRIORITY else len(LABEL_KEY_PRIORITY),
            k in listed,  # a list (per-worker speeds) only when nothing else tells the arms apart
            not k.startswith("algo."),
        ),
    )
    arms = {tuple(values[k][i] for k in present) for i in range(len(runs))}
    chosen: list[str] = []
    for k in order:
        before = {tuple(values[c][i] for c in chosen) for i in range(len(runs))}
        after = {tuple(values[c][i] for c in [*chosen, k]) for i in range(len(runs))}
        if len(after) > len(before):
            chosen.append(k)
        if len(after) == len(arms):
            break
    return chosen


@functools.lru_cache(maxsize=4096)
def _parse_facts(text: str) -> dict | None:
    facts = json.loads(text)
    return facts if isinstance(facts, dict) else None


def label_facts(row: Mapping) -> dict | None:
    """The label facts of one run (``row``: a row of :func:`lsgd.analysis.load_summaries` or
    ``load_runs``, or a mapping with :data:`~lsgd.analysis.load.LABELS_COLUMN`): its ``labels.json``
    (:mod:`lsgd.core.labels`), or None for a run without one."""
    cell = row.get(LABELS_COLUMN)
    if isinstance(cell, Mapping):
        return dict(cell)
    if not isinstance(cell, str) or not cell:
        return None
    return _parse_facts(cell)


def defining_keys(row: Mapping, facts: Mapping | None = None) -> list[str]:
    """The config keys that define the method of one run (``row``: its flattened config with its
    label facts, e.g. a row of :func:`lsgd.analysis.load_summaries`), in label order, as its
    ``labels.json`` names them (:func:`lsgd.core.labels.defining_keys`): ``algo.local_steps`` of
    local SGD, ``algo.compressor`` and ``algo.cf`` of compressed top-k; only keys the run sets.
    ``[]`` for a method that none defines (DDP) or a run without label facts. ``facts``: the
    facts to use instead of the row's."""
    return _defining_keys(row, facts if facts is not None else label_facts(row))


def _symbols(runs: pd.DataFrame) -> dict[str, str]:
    """The key names of every run of ``runs`` (:func:`lsgd.core.labels.merged_symbols`)."""
    if LABELS_COLUMN not in runs:
        return {}
    return merged_symbols(label_facts(row) for _, row in runs.iterrows())


def _label(row: Mapping, keys: Iterable[str], names: Iterable[str], symbols: Mapping[str, str],
           facts: Mapping | None) -> str:
    parts = [label_part(k, row[k], names, facts, symbols) for k in keys if k in row]
    return ", ".join(p for p in parts if p)


def _run_keys(row: Mapping, chosen: list[str], facts: Mapping | None = None) -> list[str]:
    """The keys of one run's label: ``algo.name``, ``study.arm``, the run's :func:`defining_keys`,
    then the other ``chosen`` keys (:func:`label_keys`), each once, in that order."""
    first = [k for k in LABEL_KEY_PRIORITY if k in chosen or (k == "algo.name" and k in row)]
    rest = [k for k in chosen if k not in first]
    return list(dict.fromkeys([*first, *defining_keys(row, facts), *rest]))


def arm_labels(frame: pd.DataFrame, keys: list[str] | None = None, among: list[str] | None = None) -> dict[str, str]:
    """``{run_dir: readable label}``: one label per arm, shared by the arm's runs (its seeds).

    A label joins :func:`lsgd.core.labels.label_part` of the keys that tell the arms apart and of
    the keys that define the run's method, e.g. ``"local SGD, H=8"`` next to ``"DDP"`` and
    ``"SlowMo, H=12"`` (H written although no two arms of one method differ in it),
    ``"compressed, top-k, CF=100"``: ``algo.name``, then ``study.arm``, the run's
    :func:`defining_keys`, then the other keys of :func:`label_keys` (those that still split arms);
    a key a run does not set is left out of its label. Each key is written as the arm's label facts
    say (those of its first run that has them: :func:`label_facts`; an arm without them gets plain
    ``key=value`` parts and no defining keys). ``"all runs"`` when that is empty. If two arms would
    still get one label (two values written alike), the label is the arm's ``key=value`` list over
    every arm key instead.

    Args:
        frame: one or more rows per run (:func:`lsgd.analysis.load_summaries`, ``load_runs``).
        keys: the keys written in every label, in this order (default: as above).
        among: the keys that define the arms (default :func:`arm_keys`); the scaling figure
            leaves the world size out, so one method at 4, 8 and 16 workers is one label.
    """
    every = arm_keys(frame) if among is None else list(among)
    runs = _per_run(frame)
    chosen = label_keys(frame, every) if keys is None else list(keys)
    rows = {row["run_dir"]: row for _, row in runs.iterrows()}
    arm_of = {d: tuple(_hashable(row[k]) if k in row else None for k in every) for d, row in rows.items()}
    facts_of: dict[tuple, dict] = {}  # an arm's runs share one label: the facts of its first run that has them
    for d, row in rows.items():
        f = label_facts(row)
        if f is not None:
            facts_of.setdefault(arm_of[d], f)
    facts = {d: facts_of.get(arm_of[d]) for d in rows}
    per_run = {d: (chosen if keys is not None else _run_keys(row, chosen, facts[d])) for d, row in rows.items()}
    names = list(dict.fromkeys(k for ks in per_run.values() for k in ks))
    symbols = _symbols(runs)
    out: dict[str, str] = {}
    for d, row in rows.items():
        out[d] = _label(row, per_run[d], names, symbols, facts[d]) or "all runs"
    arms_per_label: dict[str, set] = {}
    for d, lab in out.items():
        arms_per_label.setdefault(lab, set()).add(arm_of[d])
    clashing = [d for d, lab in out.items() if len(arms_per_label[lab]) > 1]
    for d in clashing:
        row = rows[d]
        out[d] = ", ".join(f"{k}={format_value(row[k])}" for k in every if k in row and not _is_missing(row[k])) or out[d]
    return out


def written_label_keys(frame: pd.DataFrame, among: list[str] | None = None) -> list[str]:
    """Every config key that some label of :func:`arm_labels` writes a value of (the chosen keys of
    :func:`label_keys` and the runs' :func:`defining_keys`), in order of first use."""
    every = arm_keys(frame) if among is None else list(among)
    chosen = label_keys(frame, every)
    keys = [k for _, row in _per_run(frame).iterrows() for k in _run_keys(row, chosen)
            if k in row and not _is_missing(row[k])]
    return list(dict.fromkeys(keys))


def label_key_names(frame: pd.DataFrame, among: list[str] | None = None) -> dict[str, str]:
    """``{key: its name}`` for the keys of :func:`written_label_keys` that the labels write as
    ``name=value`` under a name other than the key itself (``{"algo.local_steps": "H"}``): the
    report's "In the labels" line. Keys written as their value alone (``algo.name``, a
    compressor, a topology, a bool's word) are left out."""
    runs = _per_run(frame)
    keys = written_label_keys(frame, among)
    facts = [label_facts(row) for _, row in runs.iterrows()] if LABELS_COLUMN in runs else []
    symbols = merged_symbols(facts)
    names = {k: key_name(k, keys, symbols) for k in keys if not written_alone(k, facts)}
    return {k: name for k, name in names.items() if name != k}


def config_label(config: Mapping, extra: Iterable[str] = (), facts: Mapping | None = None) -> str:
    """The label of one run from its config alone (no other arms to tell apart): ``algo.name`` and
    its :func:`defining_keys` (``"local SGD, H=8"``, ``"compressed, top-k, CF=100"``, ``"DDP"``),
    ``study.arm`` where set, then ``extra`` keys (e.g. ``["seed"]`` gives ``"local SGD, H=8,
    seed=1"``); :func:`lsgd.core.labels.config_label`.

    Args:
        config: the run's config, nested (``{"algo": {"name": ...}}``, as config.yaml) or
            flattened (``{"algo.name": ...}``), or a row of :func:`lsgd.analysis.load_summaries`.
        extra: further dotted keys to write where the config sets them.
        facts: the run's label facts (its ``labels.json``, :mod:`lsgd.core.labels`); default: the
            config's :data:`~lsgd.analysis.load.LABELS_COLUMN`, else none (plain ``key=value``
            parts).
    """
    flat = flatten_config(config)  # a flattened config stays as it is
    if facts is None:
        facts = label_facts(flat)
    flat.pop(LABELS_COLUMN, None)
    return _config_label(flat, facts, extra)


def order_key(value) -> tuple:
    """Sort key for config values: missing first, then numbers ascending, then text."""
    if _is_missing(value):
        return (0, 0.0, "")
    if isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)):
        return (1, float(value), "")
    return (2, 0.0, format_value(value))


def config_differences(frame: pd.DataFrame, keys: list[str] | None = None) -> dict[str, list[str]]:
    """``{key: [its distinct values, as written]}`` for the arm keys (default :func:`arm_keys`) and
    the seed keys that differ between the runs of ``frame``, values sorted (:func:`order_key`);
    a run that does not set a key counts as ``"(unset)"``."""
    runs = _per_run(frame)
    if keys is None:
        keys = arm_keys(frame)
    seeds = [k for k in seed_keys(runs) if runs[k].map(_hashable).nunique(dropna=True) > 1]
    out: dict[str, list[str]] = {}
    for k in [*keys, *seeds]:
        if k in runs:
            ordered = sorted(runs[k].tolist(), key=order_key)
            out[k] = list(dict.fromkeys(format_value(v) or "(unset)" for v in ordered))
    return out


def select_runs(frame: pd.DataFrame, selector: str, labels: Mapping[str, str] | None = None) -> pd.Series:
    """Boolean mask of the runs of ``frame`` (one row per run) that ``selector`` names.

    ``selector`` is one of: an ``algo.name`` (``"ddp"``); an arm label of :func:`arm_labels`
    (``"local SGD, H=8"``; where no arm's label is exactly that, the arms whose labels add only
    run-level parts to it, ``"local SGD, H=8, workers=16"``); or ``key=value`` pairs joined by
    commas, each matched against the written config value (``"algo.name=local_sgd,algo.local_steps=8"``).
    """
    selector = str(selector).strip()
    parts = [p.strip() for p in selector.split(",") if p.strip()]
    pairs = [p.split("=", 1) for p in parts]
    if parts and all(len(p) == 2 and p[0].strip() in frame for p in pairs):
        mask = pd.Series(True, index=frame.index)
        for key, value in pairs:
            mask &= frame[key.strip()].map(format_value) == value.strip()
        return mask
    names = frame["algo.name"] if "algo.name" in frame else frame.get("algo", pd.Series(None, index=frame.index))
    mask = names.map(format_value) == selector
    if labels is not None and not mask.any():
        arm_label = frame["run_dir"].map(lambda d: labels.get(d))
        mask = arm_label == selector
        if not mask.any():  # "local SGD, H=1" selects "local SGD, H=1, workers=4", "..., workers=16", ...
            mask = arm_label.map(lambda label: _label_with_run_parts(label, selector))
    return mask.fillna(False).astype(bool)


#: how a run-level key's part starts in a label (``workers=16``, ``batch=32``): the parts a label
#: selector may leave out (lsgd.core.labels.KEY_NAMES)
_RUN_PARTS = tuple(sorted({f"{name}=" for name in KEY_NAMES.values()}))


def _label_with_run_parts(label, selector: str) -> bool:
    """Whether ``label`` is ``selector`` followed only by run-level parts (``, workers=16``): an
    experiment that varies the number of workers or the batch writes them into every arm's label,
    and a baseline named by its method's label then selects its arm at every such value (the
    pairing by seed takes, for each arm, the baseline arm sharing most of its config keys)."""
    if not isinstance(label, str) or not label.startswith(selector + ", "):
        return False
    return all(part.startswith(_RUN_PARTS) for part in label[len(selector) + 2:].split(", "))
