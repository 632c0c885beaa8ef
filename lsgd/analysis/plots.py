"""Figures comparing the runs of each experiment (PNG + SVG).

Uses matplotlib's object API (``matplotlib.figure.Figure``, rendered by the Agg/SVG backends), so
it never opens a window, needs no display and leaves pyplot's global state alone.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import matplotlib as mpl
import pandas as pd
from matplotlib.figure import Figure

from lsgd.analysis.load import (
    PathLike,
    _is_missing,
    _num,
    compression_frame,
    differing_keys,
    format_value,
    read_runs,
    run_labels,
    runs_frame,
    summaries_frame,
    world_sizes,
)

#: File formats each figure is saved in.
FORMATS = ("png", "svg")

_METRIC_LABELS = {
    "test_acc": "test accuracy",
    "test_ppl": "test perplexity",
    "train_loss": "training loss",
    "comm_bytes": "bytes sent per worker",
    "wall_time_s": "wall-clock time (s)",
    "modeled_time_s": "modeled time on the configured network (s)",
    "step": "step (optimizer steps per worker)",
    "consensus_distance": "consensus distance (1/n) sum ||x_i - x_bar||^2",
    "nodes": "workers (nodes)",
}

#: Config keys that only say how many workers a run had (the x axis of the scaling figure).
WORLD_KEYS = ("launcher.nproc_per_node", "world_size", "summary.world_size")


@dataclass(frozen=True)
class _Spec:
    x: str
    y: str | None  # None: the experiment's eval metric (test_acc, or test_ppl for language models)
    logx: bool = False


_SPECS = (
    _Spec("comm_bytes", None, logx=True),
    _Spec("wall_time_s", None),
    _Spec("modeled_time_s", None),
    _Spec("step", "train_loss"),
    _Spec("step", "consensus_distance"),
)

#: Title (key in the returned dicts) of the bytes-per-worker vs workers figure.
SCALING_TITLE = "wire bytes per worker per step vs workers"


def eval_metric(records: pd.DataFrame) -> str | None:
    """``"test_acc"`` if any record has a test accuracy, else ``"test_ppl"`` if any has a
    perplexity (language models), else None (no evaluation yet)."""
    for metric in ("test_acc", "test_ppl"):
        if metric in records.columns and records[metric].notna().any():
            return metric
    return None


def safe_name(name: str) -> str:
    """``name`` with every character but letters, digits, ``.``, ``_`` and ``-`` replaced by ``_``."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", str(name)).strip("_") or "experiment"


def _save(fig: Figure, stem: Path) -> list[Path]:
    out = []
    # Text stays text in the SVG (editable, searchable); no timestamp, fixed ids: reproducible files.
    with mpl.rc_context({"svg.fonttype": "none", "svg.hashsalt": "lsgd"}):
        for fmt in FORMATS:
            path = stem.with_name(f"{stem.name}.{fmt}")
            metadata = {"Date": None} if fmt == "svg" else None
            fig.savefig(path, format=fmt, dpi=150, bbox_inches="tight", metadata=metadata)
            out.append(path)
    return out


def _line_styles(n: int) -> list[dict]:
    colors = mpl.colormaps["tab10" if n <= 10 else "tab20"].colors
    dashes = ("-", "--", ":", "-.")
    return [{"color": colors[i % len(colors)], "linestyle": dashes[(i // len(colors)) % len(dashes)]} for i in range(n)]


def plot_experiment(
    records: pd.DataFrame, labels: dict[str, str], out_dir: PathLike, prefix: str
) -> dict[str, list[Path]]:
    """The four figures of one experiment; see :func:`plot_runs`.

    Args:
        records: :func:`lsgd.analysis.load_runs` rows of the experiment's runs.
        labels: ``{run_dir: legend label}``; also fixes line order and colors.
        out_dir: folder the files go to (created).
        prefix: file name prefix, e.g. ``fmnist_demo_``.

    Returns:
        ``{figure title: [png path, svg path]}`` for the figures that had data.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    metric = eval_metric(records)
    styles = dict(zip(labels, _line_styles(len(labels))))
    experiment = prefix.rstrip("_")
    written: dict[str, list[Path]] = {}
    for spec in _SPECS:
        y = spec.y or metric
        if y is None or y not in records.columns or spec.x not in records.columns:
            continue
        logy = y in ("test_ppl", "consensus_distance")
        fig = Figure(figsize=(7, 4.5))
        ax = fig.add_subplot()
        lines = 0
        for run_dir, label in labels.items():
            r = records.loc[records["run_dir"] == run_dir, [spec.x, y]].dropna()
            if spec.logx:
                r = r[r[spec.x] > 0]  # a log axis cannot show 0 bytes (evals before the first sync)
            if logy:
                r = r[r[y] > 0]
            if r.empty:
                continue  # e.g. a run with no evaluation yet
            marker = "o" if spec.y is None and len(r) <= 50 else None
            ax.plot(r[spec.x].to_numpy(float), r[y].to_numpy(float), label=label, marker=marker, markersize=3, **styles[run_dir])
            lines += 1
        if lines == 0:
            continue
        if spec.logx:
            ax.set_xscale("log")
        if logy:
            ax.set_yscale("log")
        title = f"{_METRIC_LABELS.get(y, y)} vs {_METRIC_LABELS.get(spec.x, spec.x)}"
        ax.set_xlabel(_METRIC_LABELS.get(spec.x, spec.x) + (" (log scale)" if spec.logx else ""))
        ax.set_ylabel(_METRIC_LABELS.get(y, y))
        ax.set_title(f"{experiment}: {title}", fontsize="medium")
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
        written[title] = _save(fig, out_dir / f"{prefix}{y}_vs_{spec.x}")
    return written


#: Title (key in the returned dicts) of the per-step compression figure.
COMPRESSION_TITLE = "compression factor and gain vs step"

#: Lines with more points than this are rasterized in the SVG (per-step rows of long runs).
_RASTERIZE_POINTS = 2000


def plot_compression(
    compression: pd.DataFrame, labels: dict[str, str], out_dir: PathLike, prefix: str
) -> dict[str, list[Path]]:
    """The per-step compression figure of one experiment; see :func:`plot_runs`.

    Two panels over ``step``: the compression factor ``cf`` actually sent (log y axis; 1 = dense)
    and the compression gain ``gain`` of what was sent (1 = dense), one solid line per run with
    compression rows. GraVAC runs add, in the run's color, ``cf_candidate`` (dashed) and ``cf_min``
    (dotted) to the CF panel, and the smoothed gains the epsilon rule compares, ``gain_candidate``
    (dashed) and ``gain_min`` (dotted), to the gain panel.

    Args:
        compression: :func:`lsgd.analysis.load_compression` rows of the experiment's runs.
        labels: ``{run_dir: legend label}`` of all the experiment's runs (fixes colors, so a run
            has the same color as in the other figures).
        out_dir: folder the files go to (created).
        prefix: file name prefix, e.g. ``cifar10_gravac_``.

    Returns:
        ``{COMPRESSION_TITLE: [png path, svg path]}``, or {} when no run has a ``cf`` to draw.
    """
    if compression.empty or "step" not in compression or "cf" not in compression:
        return {}
    styles = dict(zip(labels, _line_styles(len(labels))))
    fig = Figure(figsize=(12, 4.5))
    ax_cf, ax_gain = fig.subplots(1, 2)
    lines = 0
    for run_dir, label in labels.items():
        r = compression.loc[compression["run_dir"] == run_dir].sort_values("step", kind="stable")
        r = r[r["cf"].notna() & (r["cf"] > 0)]
        if r.empty:
            continue
        style = styles[run_dir]
        raster = len(r) > _RASTERIZE_POINTS
        step = r["step"].to_numpy(float)
        ax_cf.plot(step, r["cf"].to_numpy(float), label=label, rasterized=raster, linewidth=1.2, **style)
        for key, dash in (("cf_candidate", "--"), ("cf_min", ":")):
            if key in r and r[key].notna().any():
                ax_cf.plot(step, r[key].to_numpy(float), color=style["color"], linestyle=dash, linewidth=0.9,
                           alpha=0.8, label=f"{label}: {key}", rasterized=raster)  # fmt: skip
        if "gain" in r and r["gain"].notna().any():
            ax_gain.plot(step, r["gain"].to_numpy(float), label=label, rasterized=raster, linewidth=1.2, **style)
        for key, dash in (("gain_candidate", "--"), ("gain_min", ":")):
            if key in r and r[key].notna().any():
                ax_gain.plot(step, r[key].to_numpy(float), color=style["color"], linestyle=dash, linewidth=0.9,
                             alpha=0.8, rasterized=raster)  # fmt: skip
        lines += 1
    if lines == 0:
        return {}
    experiment = prefix.rstrip("_")
    ax_cf.set_yscale("log")
    ax_cf.set_xlabel(_METRIC_LABELS["step"])
    ax_cf.set_ylabel("compression factor sent (dense / sent bytes, log scale)")
    ax_cf.set_title(f"{experiment}: compression factor vs step", fontsize="medium")
    ax_gain.set_xlabel(_METRIC_LABELS["step"])
    ax_gain.set_ylabel("compression gain (dashed: candidate, dotted: theta_min)")
    ax_gain.set_title(f"{experiment}: compression gain vs step", fontsize="medium")
    for ax in (ax_cf, ax_gain):
        ax.grid(True, which="major", alpha=0.3)
    ax_gain.legend(*ax_cf.get_legend_handles_labels(), fontsize="small", loc="upper left",
                   bbox_to_anchor=(1.01, 1.0), frameon=False)  # fmt: skip
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return {COMPRESSION_TITLE: _save(fig, out_dir / f"{prefix}compression")}


def plot_bytes_vs_nodes(summaries: pd.DataFrame, out_dir: PathLike, prefix: str) -> dict[str, list[Path]]:
    """Wire bytes per worker per step (``wire_bytes`` / ``steps`` of each run's summary) against the
    number of workers, one line per method (the runs' differing config keys other than the world
    size), when the runs differ in world size: a method whose every node talks to a fixed number of
    peers (gossip) stays flat, a ring all-reduce grows as 2 (p - 1) / p x the model. Returns
    ``{title: [png, svg]}`` or ``{}``."""
    nodes = world_sizes(summaries)
    if nodes.dropna().nunique() < 2 or "wire_bytes" not in summaries or "steps" not in summaries:
        return {}
    keys = [k for k in differing_keys(summaries) if k not in WORLD_KEYS]
    labels = [", ".join(f"{k}={format_value(row[k])}" for k in keys if k in row and not _is_missing(row[k])) or "run"
              for _, row in summaries.iterrows()]
    steps = summaries["steps"].map(_num)
    frame = pd.DataFrame({"label": labels, "nodes": nodes,
                          "bytes": summaries["wire_bytes"].map(_num) / steps.where(steps > 0)}, index=summaries.index)
    frame = frame.dropna()
    if frame.empty:
        return {}
    methods = list(dict.fromkeys(frame["label"]))
    styles = dict(zip(methods, _line_styles(len(methods))))
    fig = Figure(figsize=(7, 4.5))
    ax = fig.add_subplot()
    for method in methods:
        r = frame[frame["label"] == method].groupby("nodes")["bytes"].mean().sort_index()
        ax.plot(r.index.to_numpy(float), r.to_numpy(float), marker="o", markersize=4, label=method, **styles[method])
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(_METRIC_LABELS["nodes"] + " (log scale)")
    ax.set_ylabel("wire bytes per worker per step (log scale)")
    ax.set_title(f"{prefix.rstrip('_')}: {SCALING_TITLE}", fontsize="medium")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return {SCALING_TITLE: _save(fig, Path(out_dir) / f"{prefix}wire_bytes_per_step_vs_nodes")}


def plot_frames(
    records: pd.DataFrame,
    summaries: pd.DataFrame,
    out_dir: PathLike,
    compression: pd.DataFrame | None = None,
) -> dict[str, dict[str, list[Path]]]:
    """:func:`plot_runs` on frames already loaded: ``{experiment: {title: [png, svg]}}``.

    ``compression``: :func:`lsgd.analysis.load_compression` rows (None: no compression figures).
    """
    out: dict[str, dict[str, list[Path]]] = {}
    for experiment, runs in summaries.groupby("experiment_name", sort=True):
        runs = runs.copy()
        runs.attrs = dict(summaries.attrs)
        labels = run_labels(runs)
        exp_records = records[records["experiment_name"] == experiment]
        prefix = f"{safe_name(experiment)}_"
        out[str(experiment)] = plot_experiment(exp_records, labels, out_dir, prefix=prefix)
        out[str(experiment)].update(plot_bytes_vs_nodes(runs, out_dir, prefix=prefix))
        if compression is not None and len(compression):
            exp_comp = compression[compression["experiment_name"] == experiment]
            out[str(experiment)].update(plot_compression(exp_comp, labels, out_dir, prefix=prefix))
    return out


def plot_runs(paths: PathLike | Iterable[PathLike], out_dir: PathLike) -> list[Path]:
    """Save comparison figures of the runs in ``paths`` to ``out_dir``, each as PNG and SVG.

    For each experiment (``experiment_name``) in ``paths``, with one line per run:

    - test accuracy vs cumulative bytes sent per worker (``comm_bytes``, bytes, log x axis),
    - test accuracy vs wall-clock time (``wall_time_s``, seconds),
    - test accuracy vs modeled time on the configured network (``modeled_time_s``, seconds),
    - training loss vs step,
    - for experiments with per-step compression rows (adaptive compression: ``gravac``,
      ``accordion``; :func:`lsgd.analysis.load_compression`), one figure with two panels: the
      compression factor sent vs step (log y; gravac runs add ``cf_candidate`` dashed and
      ``cf_min`` dotted) and the compression gain vs step, one line per run with such rows.

    Language models (records with ``test_ppl`` and no ``test_acc``) plot test perplexity on a
    log y axis instead of accuracy. Lines are labelled by the config keys that differ between the
    experiment's runs (:func:`lsgd.analysis.differing_keys`), e.g.
    ``algo.name=local_sgd, algo.local_steps=8``, or the run_id. A run with no point to draw in a
    figure (no evaluation yet; only 0 bytes sent on a log axis) is left out of that figure, and a
    figure with no line at all is not written.

    Files are named ``<experiment>_<y>_vs_<x>.<png|svg>``, e.g.
    ``fmnist_demo_test_acc_vs_comm_bytes.png``; the compression figure
    ``<experiment>_compression.<png|svg>``.

    Args:
        paths: a run folder, a folder containing run folders at any depth, or a list of these.
        out_dir: output folder (created if missing).

    Returns:
        The paths written, PNG and SVG of each figure.

    Raises:
        FileNotFoundError: a path does not exist or holds no run folder.
        ValueError: no paths, or an unreadable run file.
    """
    runs = read_runs(paths)
    written = plot_frames(runs_frame(runs), summaries_frame(runs), out_dir, compression_frame(runs))
    return [p for figures in written.values() for files in figures.values() for p in files]
