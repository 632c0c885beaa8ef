"""Read run folders (docs/results.md) into pandas DataFrames.

A *run folder* holds the ``config.yaml`` the trainer wrote, with ``metrics.jsonl`` (one record per
logged step) and, once the run has ended, ``summary.json``. Every function here takes ``paths``:
one path or a list of paths, each a run folder or any folder that holds run folders at any depth
(a sweep, an experiment folder such as ``results/fmnist_demo``, or a whole ``results/``).

Config keys become columns with dotted names (``algo.name``, ``algo.local_steps``, ``optim.lr``,
``world_size``); list and mapping values are stored as JSON strings, so every cell is a scalar.

``environment.json`` (what produced the run: commit, versions, CPU / GPU; :mod:`lsgd.training.provenance`)
becomes the ``env.*`` columns of :func:`load_summaries` (:data:`ENV_COLUMNS`), never config columns:
runs that differ only in their environment stay one arm. Runs without the file have None there.

``labels.json`` (how the labels write the run: its method's and compressor's written names, its
keys' symbols, the keys that define its method; :mod:`lsgd.core.labels`, written by the launcher from
the registries) becomes the :data:`LABELS_COLUMN` of both frames, one JSON object per run (None for a
run made before lsgd wrote it), never a config column: :mod:`lsgd.analysis.arms` reads it.

``metrics.jsonl`` also holds rows marked with a ``kind`` key (``"kind": "compression"``: one per step
of an adaptive compression algorithm). The regular records (:func:`load_runs`, summaries, tables,
figures) skip every row that has a ``kind``; :func:`load_compression` returns the compression rows.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

import yaml

from lsgd.core.labels import flatten, format_value
from lsgd.core.labels import is_missing as _is_missing
from lsgd.core.run_files import CONFIG_FILE, ENVIRONMENT_FILE, LABELS_FILE, METRICS_FILE, SUMMARY_FILE

PathLike = str | os.PathLike

#: Columns of :func:`load_summaries` from ``environment.json`` (:func:`environment_fields`).
ENV_COLUMNS = ("env.commit", "env.lsgd", "env.torch", "env.cpu_capability", "env.cpu", "env.gpu", "env.python",
               "env.host")  # fmt: skip

#: Prefix of the environment columns (never config keys).
ENV_PREFIX = "env."

#: Column of both frames holding each run's label facts (``labels.json`` as a JSON string; None:
#: the run has none). Not a config key: runs that differ only in it stay one arm.
LABELS_COLUMN = "label_facts"

#: ``status`` of a run folder with no ``summary.json`` (still running, or killed before the end).
RUNNING = "running"

#: Identity columns first in both frames; their values come from the config, then the summary,
#: then the folder (``run_id`` = folder name, ``experiment_name`` = parent folder name).
ID_COLUMNS = ("run_id", "run_dir", "experiment_name", "status")

#: Config keys that :func:`differing_keys` skips by default: bookkeeping that differs between runs
#: without changing what was trained. ``seed`` is *not* skipped: runs that differ only by seed
#: would otherwise get identical labels.
DEFAULT_IGNORED_KEYS = ("run_id", "run_dir", "results_dir", "resume")

#: config.yaml entries that record facts following from the config (``Algorithm.describe``: a
#: decentralized method's topology with its node count and spectral gap); never a run label.
DERIVED_PREFIXES = ("topology.",)

#: metrics.jsonl keys of the run format (used only to tell metric columns from config columns
#: when a frame has lost its ``attrs``).
METRIC_KEYS = (
    "step", "epoch", "samples", "lr", "train_loss", "comm_bytes", "wire_bytes", "comm_rounds",
    "wall_time_s", "compute_time_s", "comm_time_s", "modeled_time_s", "model_alpha_terms",
    "model_beta_bytes", "samples_per_s", "test_loss", "test_acc", "test_ppl", "test_bleu",
    "comm_bytes_workers", "wire_bytes_workers", "consensus_distance", "peak_step_bytes",
)  # fmt: skip

#: ``kind`` of the per-step compression rows of metrics.jsonl (docs/results.md).
COMPRESSION_KIND = "compression"

#: Keys of a compression row (each algorithm writes its subset; see docs/results.md).
COMPRESSION_KEYS = (
    "kind", "step", "cf", "sent", "cf_min", "cf_candidate", "gain_min", "gain_candidate", "gain",
    "low_fraction",
)  # fmt: skip

#: summary.json fields of the run format.
SUMMARY_KEYS = (
    "status", "run_id", "experiment_name", "algo", "world_size", "steps", "epochs", "samples",
    "final_test_loss", "final_test_acc", "best_test_acc", "final_test_ppl", "best_test_ppl",
    "final_test_bleu", "best_test_bleu", "comm_bytes", "wire_bytes", "comm_rounds", "wall_time_s", "compute_time_s", "comm_time_s",
    "modeled_time_s", "model_alpha_terms", "model_beta_bytes", "target_acc", "time_to_target_s",
    "modeled_time_to_target_s", "step_to_target", "error", "failed_rank", "num_workers", "peak_step_bytes",
)  # fmt: skip

#: Methods whose rank 0 is a server (docs/results.md): a run of one whose summary predates
#: ``num_workers`` is taken to have server ranks.
SERVER_ALGOS = ("param_server", "async_local_sgd", "adsaga")

# Summary fields a run without summary.json gets from its last metrics record.
_PROGRESS_FROM_RECORD = {
    "steps": "step", "epochs": "epoch", "samples": "samples", "comm_bytes": "comm_bytes",
    "wire_bytes": "wire_bytes", "comm_rounds": "comm_rounds", "wall_time_s": "wall_time_s",
    "compute_time_s": "compute_time_s", "comm_time_s": "comm_time_s",
    "modeled_time_s": "modeled_time_s", "model_alpha_terms": "model_alpha_terms",
    "model_beta_bytes": "model_beta_bytes", "peak_step_bytes": "peak_step_bytes",
}  # fmt: skip


@dataclass
class RunData:
    """One run folder as read from disk (before it becomes DataFrame rows)."""

    run_dir: Path
    config: dict  # flattened: dotted keys -> scalar
    summary: dict | None  # None: no summary.json yet
    records: list[dict] = field(default_factory=list)  # regular records (rows without "kind")
    compression: list[dict] = field(default_factory=list)  # rows with "kind": "compression"
    environment: dict | None = None  # environment.json; None: the run has none (made before lsgd wrote it)
    labels: dict | None = None  # labels.json; None: the run has none (made before lsgd wrote it)

    @property
    def run_id(self) -> str:
        rid = self.config.get("run_id") or (self.summary or {}).get("run_id")
        return str(rid) if rid is not None else self.run_dir.name

    @property
    def experiment_name(self) -> str:
        name = self.config.get("experiment_name") or (self.summary or {}).get("experiment_name")
        return str(name) if name is not None else self.run_dir.parent.name

    @property
    def status(self) -> str:
        if self.summary is None:
            return RUNNING
        return str(self.summary.get("status") or RUNNING)

    def id_columns(self) -> dict:
        return {
            "run_id": self.run_id,
            "run_dir": str(self.run_dir),
            "experiment_name": self.experiment_name,
            "status": self.status,
        }


# -- discovery ------------------------------------------------------------------------------------
def _as_path_list(paths: PathLike | Iterable[PathLike]) -> list[Path]:
    if isinstance(paths, (str, os.PathLike)):
        return [Path(paths)]
    out = [Path(p) for p in paths]
    if not out:
        raise ValueError("no paths given: pass a run folder or a folder that contains run folders")
    return out


def _looks_like_run(folder: Path, filenames: Iterable[str]) -> bool:
    names = set(filenames)
    if CONFIG_FILE not in names:
        return False
    if METRICS_FILE in names or SUMMARY_FILE in names:
        return True
    # A run that has just started has only config.yaml; the trainer's config has a top-level run_id.
    try:
        cfg = yaml.safe_load((folder / CONFIG_FILE).read_text())
    except (OSError, yaml.YAMLError):
        return False
    return isinstance(cfg, Mapping) and "run_id" in cfg


def find_run_dirs(paths: PathLike | Iterable[PathLike]) -> list[Path]:
    """Run folders in ``paths``, resolved, without duplicates, sorted by path.

    A path that contains ``config.yaml`` is taken as a run folder. Any other folder is searched at
    any depth for folders that hold ``config.yaml`` and also ``metrics.jsonl``, ``summary.json``
    or a top-level ``run_id`` in the config (so a Hydra ``conf/config.yaml`` is not a run). The
    search skips hidden folders (``.hydra``) and does not look inside a run folder.

    Raises:
        ValueError: ``paths`` is an empty list, or a path is a file.
        FileNotFoundError: a path does not exist, or holds no run folder (the message names it).
    """
    found: dict[Path, None] = {}
    for path in _as_path_list(paths):
        if not path.exists():
            raise FileNotFoundError(f"{path}: no such run or results folder")
        if not path.is_dir():
            raise ValueError(f"{path}: is a file; expected a run folder or a folder containing run folders")
        dirs: list[Path] = []
        if (path / CONFIG_FILE).is_file():
            dirs.append(path)
        else:
            for root, subdirs, files in os.walk(path):
                folder = Path(root)
                if _looks_like_run(folder, files):
                    dirs.append(folder)
                    subdirs[:] = []  # nothing below a run folder is a run
                else:
                    subdirs[:] = sorted(d for d in subdirs if not d.startswith("."))
        if not dirs:
            raise FileNotFoundError(
                f"{path}: no run folders found (a run folder holds {CONFIG_FILE} with "
                f"{METRICS_FILE} or {SUMMARY_FILE})"
            )
        for d in dirs:
            found.setdefault(d.resolve(), None)
    return sorted(found)


# -- reading one run ------------------------------------------------------------------------------
def _scalar(value):
    """Lists and mappings as JSON strings; everything else unchanged."""
    if isinstance(value, (Mapping, list, tuple)):
        return json.dumps(value, default=str)
    return value


def flatten_config(cfg: Mapping, prefix: str = "") -> dict:
    """Nested config mapping -> ``{dotted.key: scalar}``; lists and empty mappings become JSON strings.

    >>> flatten_config({"algo": {"name": "slowmo", "speeds": [1.0, 0.5]}, "world_size": 4})
    {'algo.name': 'slowmo', 'algo.speeds': '[1.0, 0.5]', 'world_size': 4}
    """
    return {key: _scalar(value) for key, value in flatten(cfg, prefix).items()}


def read_config(run_dir: PathLike) -> dict:
    """The run's ``config.yaml`` as a nested dict.

    Raises:
        FileNotFoundError: no config.yaml in ``run_dir``.
        ValueError: config.yaml is not valid YAML or not a mapping.
    """
    path = Path(run_dir) / CONFIG_FILE
    try:
        cfg = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: invalid YAML: {e}") from e
    if not isinstance(cfg, Mapping):
        raise ValueError(f"{path}: expected a YAML mapping of config keys, got {type(cfg).__name__}")  # noqa: TRY004 (a bad file, not a bad argument)
    return dict(cfg)


def read_summary(run_dir: PathLike) -> dict | None:
    """The run's ``summary.json``, or None when the run has none yet.

    Raises:
        ValueError: summary.json is not a JSON object.
    """
    path = Path(run_dir) / SUMMARY_FILE
    if not path.exists():
        return None
    try:
        summary = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: invalid JSON: {e}") from e
    if not isinstance(summary, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(summary).__name__}")  # noqa: TRY004 (a bad file, not a bad argument)
    return {k: _scalar(v) for k, v in summary.items()}


def _read_json_object(path: Path) -> dict | None:
    """The JSON object in ``path``, or None when there is none; an unreadable one is reported with
    a warning and read as none."""
    if not path.exists():
        return None
    try:
        obj = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        warnings.warn(f"{path}: unreadable, ignored: {e}", stacklevel=3)
        return None
    if not isinstance(obj, dict):
        warnings.warn(f"{path}: expected a JSON object, got {type(obj).__name__}; ignored", stacklevel=3)
        return None
    return obj


def read_environment(run_dir: PathLike) -> dict | None:
    """The run's ``environment.json`` (docs/results.md), or None when it has none. An unreadable
    one is reported with a warning and read as none: the numbers of a report do not depend on it."""
    return _read_json_object(Path(run_dir) / ENVIRONMENT_FILE)


def read_labels(run_dir: PathLike) -> dict | None:
    """The run's label facts (``labels.json``, :mod:`lsgd.core.labels`), or None when it has none
    (a run made before lsgd wrote them: its labels are plain ``key=value`` parts). An unreadable one
    is reported with a warning and read as none."""
    return _read_json_object(Path(run_dir) / LABELS_FILE)


def _commit_text(session: dict) -> str | None:
    git = session.get("lsgd") or {}
    short = git.get("commit_short") or (git.get("commit") or "")[:7]
    if not short:
        return None
    return f"{short}+dirty" if git.get("dirty") else short


def _gpu_text(session: dict) -> str | None:
    dist = session.get("distributed") or {}
    if "gpus" not in session:
        return None
    if dist.get("device") not in (None, "cuda"):
        return "none"  # a CPU run (on a machine that may have GPUs)
    names = [g.get("name") if isinstance(g, dict) else str(g) for g in session.get("gpus") or []]
    nodes = session.get("nodes") or {}
    if len(nodes) > 1:  # every node's GPUs
        names = [str(n) for node in nodes.values() for n in node.get("gpus") or []]
    if not names:
        return "none"
    counts: dict[str, int] = {}
    for n in names:
        counts[n] = counts.get(n, 0) + 1
    return ", ".join(f"{c} x {n}" if c > 1 else str(n) for n, c in counts.items())


def _per_node(session: dict, key: str, own) -> str | None:
    """``own`` (this host's value), or the distinct values of every node of a multi-node session."""
    nodes = session.get("nodes") or {}
    values = list(dict.fromkeys(str(v[key]) for v in nodes.values() if v.get(key))) if len(nodes) > 1 else []
    return " / ".join(values) if values else own


def _session_fields(session: dict) -> dict:
    torch = session.get("torch") or {}
    host = session.get("hostname")
    nodes = session.get("nodes") or {}
    if len(nodes) > 1:
        host = f"{next(iter(nodes))} +{len(nodes) - 1} nodes"
    return {
        "env.commit": _commit_text(session),
        "env.lsgd": (session.get("lsgd") or {}).get("version"),
        "env.torch": torch.get("version"),
        "env.cpu_capability": _per_node(session, "cpu_capability", torch.get("cpu_capability")),
        "env.cpu": _per_node(session, "cpu", (session.get("cpu") or {}).get("model")),
        "env.gpu": _gpu_text(session),
        "env.python": (session.get("python") or {}).get("version"),
        "env.host": host,
    }


def environment_fields(env: Mapping | None) -> dict:
    """The :data:`ENV_COLUMNS` of a run from its ``environment.json`` (None: all None).

    ``env.commit`` is the short commit with ``+dirty`` when the tree had changes (None when lsgd was
    not a git checkout), ``env.gpu`` the GPUs of a CUDA run (``2 x NVIDIA H100 ...``; ``none`` for a
    CPU run), ``env.cpu`` the CPU model; in a multi-node run the distinct values of its nodes joined
    by `` / ``. A resumed run whose sessions differ shows each value in order: ``2.4.1 → 2.5.0``.
    """
    if not env:
        return dict.fromkeys(ENV_COLUMNS)
    sessions = [_session_fields(s) for s in [env, *[s for s in env.get("resumed") or [] if isinstance(s, Mapping)]]]
    out = {}
    for col in ENV_COLUMNS:
        values = [s[col] for s in sessions]
        changes = [v for i, v in enumerate(values) if i == 0 or v != values[i - 1]]
        out[col] = None if all(v is None for v in changes) else " → ".join("-" if v is None else str(v) for v in changes)
    return out


def read_metrics(run_dir: PathLike) -> list[dict]:
    """The regular records of the run's ``metrics.jsonl`` in file order ([] when it has none yet).

    Rows with a ``kind`` key (per-step compression rows) are not records and are skipped; see
    :func:`read_compression`. A truncated last line (a run killed while writing) is skipped with a
    warning. If the step count goes back (a run resumed from an older checkpoint without truncating
    the file), the rows the resumed run superseded (those at or after the step it restarted from)
    are dropped.

    Raises:
        ValueError: a line other than the last is not a JSON object (the message names file and line).
    """
    return [r for r in read_metrics_rows(run_dir) if "kind" not in r]


def read_compression(run_dir: PathLike) -> list[dict]:
    """The per-step compression rows (``"kind": "compression"``) of the run's ``metrics.jsonl``.

    Same reading rules as :func:`read_metrics`; [] for a run that writes none.
    """
    return [r for r in read_metrics_rows(run_dir) if r.get("kind") == COMPRESSION_KIND]


def read_metrics_rows(run_dir: PathLike) -> list[dict]:
    """Every row of the run's ``metrics.jsonl`` (regular records and rows with a ``kind``), in file
    order, with the truncation and resume rules of :func:`read_metrics` applied to all rows together.
    """
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        return []
    lines = [(i, line) for i, line in enumerate(path.read_text().splitlines(), 1) if line.strip()]
    records: list[dict] = []
    for n, (lineno, line) in enumerate(lines):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            if n == len(lines) - 1:
                warnings.warn(f"{path}:{lineno}: skipping truncated last record", stacklevel=2)
                continue
            raise ValueError(f"{path}:{lineno}: invalid JSON record: {e}") from e
        if not isinstance(rec, dict):
            raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(rec).__name__}")  # noqa: TRY004 (a bad file, not a bad argument)
        step = rec.get("step")
        if step is not None and records and records[-1].get("step") is not None and step < records[-1]["step"]:
            records = [r for r in records if r.get("step") is None or r["step"] < step]
        records.append({k: _scalar(v) for k, v in rec.items()})
    return records


def read_run(run_dir: PathLike) -> RunData:
    """Config (flattened), summary and metrics records of one run folder.

    Raises:
        FileNotFoundError, ValueError: as :func:`read_config`, :func:`read_summary`, :func:`read_metrics`.
    """
    run_dir = Path(run_dir)
    rows = read_metrics_rows(run_dir)
    return RunData(
        run_dir=run_dir,
        config=flatten_config(read_config(run_dir)),
        summary=read_summary(run_dir),
        records=[r for r in rows if "kind" not in r],
        compression=[r for r in rows if r.get("kind") == COMPRESSION_KIND],
        environment=read_environment(run_dir),
        labels=read_labels(run_dir),
    )


def read_runs(paths: PathLike | Iterable[PathLike]) -> list[RunData]:
    """:func:`read_run` for every folder :func:`find_run_dirs` finds in ``paths``."""
    return [read_run(d) for d in find_run_dirs(paths)]


# -- frames ---------------------------------------------------------------------------------------
def _config_part(run: RunData, taken: Iterable[str]) -> dict:
    """Config columns of a run; a key that is already a metric/summary column gets ``config.``."""
    taken = set(taken)
    out = {}
    for key, value in run.config.items():
        if key in ID_COLUMNS:
            continue
        out[f"config.{key}" if key in taken else key] = value
    return out


def _ordered_union(lists: Iterable[Iterable[str]]) -> list[str]:
    seen: dict[str, None] = {}
    for keys in lists:
        for k in keys:
            seen.setdefault(k, None)
    return list(seen)


def _with_config_keys(frame: pd.DataFrame, config_keys: list[str]) -> pd.DataFrame:
    frame.attrs["config_keys"] = [k for k in config_keys if k in frame.columns]
    return frame


def runs_frame(runs: list[RunData]) -> pd.DataFrame:
    """One row per metrics record of ``runs`` (see :func:`load_runs`)."""
    return _rows_frame(runs, "records")


def compression_frame(runs: list[RunData]) -> pd.DataFrame:
    """One row per compression row of ``runs`` (see :func:`load_compression`)."""
    return _rows_frame(runs, "compression")


def _rows_frame(runs: list[RunData], attr: str) -> pd.DataFrame:
    frames = []
    config_keys: list[list[str]] = []
    for run in runs:
        rows = getattr(run, attr)
        metrics = pd.DataFrame.from_records(rows) if rows else pd.DataFrame()
        n = len(metrics)
        ids = pd.DataFrame({k: [v] * n for k, v in run.id_columns().items()})
        cfg = _config_part(run, list(metrics.columns) + list(ID_COLUMNS))
        cfg_frame = pd.DataFrame({k: [v] * n for k, v in cfg.items()})
        facts = pd.DataFrame({LABELS_COLUMN: [_labels_cell(run)] * n}, dtype=object)
        config_keys.append(["run_id", "experiment_name", *cfg])
        frames.append(pd.concat([ids, metrics.reset_index(drop=True), cfg_frame, facts], axis=1))
    nonempty = [f for f in frames if len(f)]
    if nonempty:
        frame = pd.concat(nonempty, ignore_index=True)
    else:
        frame = pd.DataFrame(columns=_ordered_union(f.columns for f in frames) or list(ID_COLUMNS))
    return _with_config_keys(frame, _ordered_union(config_keys))


def _labels_cell(run: RunData) -> str | None:
    return json.dumps(run.labels, sort_keys=True) if run.labels is not None else None


def _progress_from_records(run: RunData) -> dict:
    """Summary fields of a run without summary.json, from its metrics so far."""
    out = {k: None for k in SUMMARY_KEYS if k not in ID_COLUMNS}
    out["algo"] = run.config.get("algo.name")
    out["world_size"] = run.config.get("world_size")
    out["target_acc"] = run.config.get("target_acc")
    if run.records:
        last = run.records[-1]
        for key, metric in _PROGRESS_FROM_RECORD.items():
            out[key] = last.get(metric)
        for metric, best in (("test_acc", max), ("test_ppl", min), ("test_bleu", max)):
            evals = [r[metric] for r in run.records if _is_number(r.get(metric))]
            if evals:
                out[f"final_{metric}"] = evals[-1]
                out[f"best_{metric}"] = best(evals)
        losses = [r["test_loss"] for r in run.records if _is_number(r.get("test_loss"))]
        out["final_test_loss"] = losses[-1] if losses else None
    return out


def summaries_frame(runs: list[RunData]) -> pd.DataFrame:
    """One row per run of ``runs`` (see :func:`load_summaries`)."""
    rows = []
    config_keys: list[list[str]] = []
    for run in runs:
        summary = run.summary if run.summary is not None else _progress_from_records(run)
        row = run.id_columns()
        for key, value in summary.items():
            if key in ID_COLUMNS:
                continue
            row[f"summary.{key}" if key in run.config else key] = value
        cfg = _config_part(run, row)
        row.update(cfg)
        row.update(environment_fields(run.environment))
        row[LABELS_COLUMN] = _labels_cell(run)
        config_keys.append(["run_id", "experiment_name", *cfg])
        rows.append(row)
    frame = pd.DataFrame.from_records(rows, columns=_ordered_union(rows) or list(ID_COLUMNS))
    return _with_config_keys(frame, _ordered_union(config_keys))


def load_runs(paths: PathLike | Iterable[PathLike]) -> pd.DataFrame:
    """All metrics records of the runs in ``paths`` as one DataFrame, one row per record.

    Columns: ``run_id``, ``run_dir`` (absolute path), ``experiment_name``, ``status`` (from
    summary.json; ``"running"`` when the run has none), then every metric of docs/results.md
    as written (``step``; ``comm_bytes``/``wire_bytes`` in bytes; ``*_time_s`` in seconds;
    eval-only metrics such as ``test_acc`` are NaN on records without an evaluation), then the
    run's flattened config (``algo.name``, ``algo.local_steps``, ``optim.lr``, ``world_size``, ...;
    lists and mappings as JSON strings), then :data:`LABELS_COLUMN` (the run's ``labels.json``). A
    config key equal to a metric name is renamed ``config.<key>``. ``frame.attrs["config_keys"]``
    lists the config columns.

    Records are in file order per run, runs sorted by folder; a run with no records yet adds no
    row (it does appear in :func:`load_summaries`).

    Args:
        paths: a run folder, a folder containing run folders at any depth, or a list of these.

    Raises:
        FileNotFoundError: a path does not exist or holds no run folder.
        ValueError: no paths, or an unreadable config.yaml / summary.json / metrics.jsonl line.
    """
    return runs_frame(read_runs(paths))


def load_summaries(paths: PathLike | Iterable[PathLike]) -> pd.DataFrame:
    """One row per run in ``paths``: its summary.json fields plus its flattened config.

    Columns: ``run_id``, ``run_dir``, ``experiment_name``, ``status``, the summary fields of
    docs/results.md (``comm_bytes`` in bytes, ``*_time_s`` in seconds, ``steps`` in steps...),
    then the flattened config keys as in :func:`load_runs`, then the :data:`ENV_COLUMNS` from
    ``environment.json`` (``env.commit``, ``env.torch``, ``env.cpu_capability``, ... ; None for a
    run without one; :func:`environment_fields`), then :data:`LABELS_COLUMN` (the run's
    ``labels.json`` as a JSON string; None for a run without one). A summary field whose name is also a
    config key (``world_size``, ``epochs``, ``target_acc``) is stored as ``summary.<key>``, so the
    plain name is always the config value (e.g. ``epochs`` requested vs ``summary.epochs`` done).

    A run without summary.json (still running or killed) has status ``"running"``; its progress
    fields (``steps``, ``comm_bytes``, ``wall_time_s``, ...) come from its last metrics record,
    ``final_*``/``best_*`` from its evaluations so far, and the other fields are missing.

    Raises:
        FileNotFoundError: a path does not exist or holds no run folder.
        ValueError: no paths, or an unreadable config.yaml / summary.json / metrics.jsonl line.
    """
    return summaries_frame(read_runs(paths))


def load_compression(paths: PathLike | Iterable[PathLike]) -> pd.DataFrame:
    """The per-step compression rows (``"kind": "compression"`` in metrics.jsonl) of the runs in
    ``paths``, one row per compression row.

    Columns: ``run_id``, ``run_dir``, ``experiment_name``, ``status`` as in :func:`load_runs`, then
    the row's keys as written (``kind``, ``step``, ``cf`` = dense bytes / sent bytes, ``sent``; for
    gravac ``cf_min``, ``cf_candidate``, ``gain_min``, ``gain_candidate``, ``gain``; for accordion
    ``low_fraction``; keys an algorithm does not write are NaN), then the run's flattened config
    as in :func:`load_runs`. Rows are in file order per run, runs sorted by folder; runs without
    compression rows add no row (the frame then has only the identity columns).

    Raises:
        FileNotFoundError, ValueError: as :func:`load_runs`.
    """
    return compression_frame(read_runs(paths))


# -- labels ---------------------------------------------------------------------------------------
def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def config_columns(frame: pd.DataFrame) -> list[str]:
    """Config columns of a frame from :func:`load_runs` / :func:`load_summaries`.

    Uses ``frame.attrs["config_keys"]``; when an operation dropped the attrs, every column that
    is not an identity column, a run-format metric, compression-row key or summary field,
    :data:`LABELS_COLUMN`, ``summary.*`` or ``env.*``.
    """
    keys = frame.attrs.get("config_keys")
    if keys is not None:
        return [k for k in keys if k in frame.columns]
    known = set(ID_COLUMNS) | set(METRIC_KEYS) | set(SUMMARY_KEYS) | set(COMPRESSION_KEYS) | {LABELS_COLUMN}
    return [c for c in frame.columns if c not in known and not str(c).startswith(("summary.", ENV_PREFIX))]


def differing_keys(frame: pd.DataFrame, ignore: Iterable[str] = DEFAULT_IGNORED_KEYS) -> list[str]:
    """Config keys whose values differ between the runs of ``frame``.

    A key counts when the runs that set it hold at least two different values (``algo.name``
    ddp vs local_sgd; ``algo.local_steps`` 8 vs 16). A key set in only some runs with one value
    (``algo.buffer_policy=reset`` of every local SGD run next to DDP) counts only when the keys
    chosen before it leave those runs otherwise indistinguishable.

    Args:
        frame: from :func:`load_summaries` or :func:`load_runs` (or a row subset of one).
        ignore: keys never returned; by default :data:`DEFAULT_IGNORED_KEYS` (``run_id``,
            ``run_dir``, ``results_dir``, ``resume``). ``seed`` counts, so seed repeats get
            distinct labels. Keys under :data:`DERIVED_PREFIXES` are never returned.

    Returns:
        The keys in column order, ``algo.*`` keys first.
    """
    ignore = set(ignore)
    per_run = frame.drop_duplicates("run_dir") if "run_dir" in frame else frame
    candidates = [k for k in config_columns(per_run) if k not in ignore and not str(k).startswith(DERIVED_PREFIXES)]
    candidates.sort(key=lambda k: not k.startswith("algo."))  # stable: keeps column order
    values = {k: per_run[k].map(_hashable) for k in candidates}
    chosen = [k for k in candidates if values[k].nunique(dropna=True) > 1]
    for k in candidates:
        v = values[k]
        if k in chosen or v.nunique(dropna=True) != 1 or not v.isna().any():
            continue
        groups = [tuple(values[c].iloc[i] for c in chosen) for i in range(len(per_run))]
        split = pd.DataFrame({"g": groups, "v": v.isna().to_numpy()}).groupby("g")["v"].nunique()
        if (split > 1).any():
            chosen.append(k)
    return [k for k in candidates if k in chosen]


def _hashable(value):
    if _is_missing(value):
        return None
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value


def run_labels(frame: pd.DataFrame, keys: list[str] | None = None) -> dict[str, str]:
    """``{run_dir: label}`` for the runs of ``frame``, in order of first appearance.

    A label is ``key=value`` for each of ``keys`` (default: :func:`differing_keys` of ``frame``)
    that the run sets, e.g. ``algo.name=local_sgd, algo.local_steps=8``; the run_id when that is
    empty. Runs that would share a label get their run_id appended.
    """
    if keys is None:
        keys = differing_keys(frame)
    firsts = frame.drop_duplicates("run_dir")
    labels: dict[str, str] = {}
    for _, row in firsts.iterrows():
        parts = [f"{k}={format_value(row[k])}" for k in keys if k in row and not _is_missing(row[k])]
        labels[row["run_dir"]] = ", ".join(parts) or str(row["run_id"])
    counts = pd.Series(list(labels.values())).value_counts()
    ids = dict(zip(firsts["run_dir"], firsts["run_id"]))
    return {
        d: (f"{lab} ({ids[d]})" if counts[lab] > 1 and lab != str(ids[d]) else lab) for d, lab in labels.items()
    }


def _num(value) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return math.nan
    return out


def has_server_ranks(run) -> bool:
    """Whether a run (a :func:`load_summaries` row, or a mapping with its fields) has server ranks,
    so that its ``comm_bytes`` / ``wire_bytes``, means over every rank, count the servers in:
    summary.json's ``num_workers`` < its world size; without those (a running run, an old
    summary), whether ``algo.name`` is one of :data:`SERVER_ALGOS`."""
    workers = _num(run.get("num_workers"))
    world = _num(run.get("summary.world_size", run.get("world_size")))
    if math.isfinite(workers) and math.isfinite(world):
        return workers < world
    return format_value(run.get("algo.name", run.get("algo"))) in SERVER_ALGOS


def world_sizes(summaries: pd.DataFrame) -> pd.Series:
    """World size of each run: summary.json ``world_size``, else the config's ``world_size``, else
    a numeric ``launcher.nproc_per_node`` (NaN where none is known)."""
    out = pd.Series(math.nan, index=summaries.index, dtype=float)
    for col in ("launcher.nproc_per_node", "world_size", "summary.world_size"):  # last wins
        if col in summaries:
            values = summaries[col].map(_num)
            out = values.where(values.notna(), out)
    return out
