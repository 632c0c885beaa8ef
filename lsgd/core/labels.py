"""How a run's config is written for people: ``"local SGD, H=8"`` rather than ``"algo.name=local_sgd,
algo.local_steps=8"``.

The words and the formatting are shared by the loggers (a W&B / TensorBoard run's name, written in
the training process) and by the report's tables and figures (:mod:`lsgd.analysis.arms`, which also
chooses which keys a label needs). A leaf module without pandas, so a training process never
imports the analysis stack.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable

import numpy as np

#: How an algorithm (``algo.name``) is written in labels.
ALGO_NAMES = {
    "ddp": "DDP",
    "local_sgd": "local SGD",
    "post_local_sgd": "post-local SGD",
    "slowmo": "SlowMo",
    "diloco": "DiLoCo",
    "compressed": "compressed",
    "gravac": "GraVAC",
    "accordion": "Accordion",
    "adasum": "Adasum",
    "swarm_sgd": "SwarmSGD",
    "dpsgd": "D-PSGD",
    "decentlam": "DecentLaM",
    "sgp": "SGP",
    "ad_psgd": "AD-PSGD",
    "lead": "LEAD",
    "overlap_local_sgd": "Overlap-Local-SGD",
    "param_server": "parameter server",
    "async_local_sgd": "async local SGD",
    "adsaga": "ADSAGA",
}

#: Short names of config keys in labels (the symbols of docs/glossary.md where there is one);
#: a key not listed is written as its last dotted part with ``_`` as spaces (``optim.lr`` -> ``lr``).
KEY_NAMES = {
    "algo.local_steps": "H",
    "algo.slow_lr": "alpha",
    "algo.slow_momentum": "beta",
    "algo.cf": "CF",
    "algo.rank": "rank",
    "algo.levels": "levels",
    "algo.cf_min": "CF min",
    "algo.cf_max": "CF max",
    "algo.cf_low": "CF low",
    "algo.cf_high": "CF high",
    "algo.epsilon": "eps",
    "algo.warmup_steps": "warm-up steps",
    "algo.buffer_policy": "buffers",
    "algo.dn_buffer": "N",
    "algo.dn_c": "c",
    "batch_size": "batch",
    "launcher.nproc_per_node": "workers",
    "world_size": "workers",
    "optim.lr": "lr",
    "study.heterogeneity": "heterogeneity",
    "cluster.speeds": "speeds",
    "dataset.alpha": "Dirichlet alpha",
}

#: Keys whose value alone is the label part (``"top-k"``, ``"ring"``), and how values are written.
VALUE_ONLY_KEYS = ("algo.name", "algo.compressor", "algo.topology", "algo.quantizer", "study.arm")

#: Written values of :data:`VALUE_ONLY_KEYS` (others as :func:`format_value`).
VALUE_NAMES = {
    "algo.name": ALGO_NAMES,
    "algo.compressor": {
        "none": "dense", "topk": "top-k", "randomk": "random-k", "dgc": "DGC", "redsync": "RedSync",
        "qsgd": "QSGD", "powersgd": "PowerSGD", "fp16": "fp16",
    },
}  # fmt: skip

#: Boolean keys written as a word when true and ``no <word>`` (or the given word) when false.
BOOL_NAMES = {
    "algo.error_feedback": ("error feedback", "no error feedback"),
    "algo.blocking": ("blocking", "non-blocking"),
    "algo.hierarchical": ("hierarchical", "flat"),
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


def key_name(key: str, keys: Iterable[str] = ()) -> str:
    """How ``key`` is named in a label (:data:`KEY_NAMES`, else its last dotted part with spaces);
    its full dotted name when another of ``keys`` would get the same short name."""
    def short(k: str) -> str:
        return KEY_NAMES.get(k) or str(k).rsplit(".", 1)[-1].replace("_", " ")

    name = short(key)
    if any(short(k) == name for k in keys if k != key):
        return str(key)
    return name


def label_part(key: str, value, keys: Iterable[str] = ()) -> str:
    """One part of a label: ``"local SGD"`` (algo.name), ``"top-k"``, ``"H=8"``, ``"error feedback"``;
    ``""`` for a missing value."""
    if is_missing(value):
        return ""
    if key in BOOL_NAMES and isinstance(value, (bool, np.bool_)):
        return BOOL_NAMES[key][0 if value else 1]
    text = format_value(value)
    if key in VALUE_ONLY_KEYS:
        return VALUE_NAMES.get(key, {}).get(text, text)
    return f"{key_name(key, keys)}={text}"
