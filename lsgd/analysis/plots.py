"""Figures comparing the arms of each experiment (PNG, SVG and PDF; no titles inside: the report captions them).

Each arm (runs that differ only in seed, :mod:`lsgd.analysis.arms`) is one line: the mean over its
runs, with a shaded band: the 95% Student t interval of the mean when the arm has at least 3 runs,
the min-max range over runs when it has 2, none for 1 (:func:`lsgd.analysis.stats.aggregate_curves`;
curves whose x values differ between seeds, such as wall time, are interpolated onto a common grid
first). The legend gives each arm's n.

Uses matplotlib's object API (``matplotlib.figure.Figure``, rendered by the Agg/SVG backends), so
it never opens a window, needs no display and leaves pyplot's global state alone.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import matplotlib as mpl
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from lsgd.analysis.arms import arm_keys, arm_labels
from lsgd.analysis.load import (
    PathLike,
    _hashable,
    _num,
    compression_frame,
    read_runs,
    runs_frame,
    summaries_frame,
    world_sizes,
)
from lsgd.analysis.stats import MIN_RUNS_FOR_CI_BAND, aggregate_curves, aggregate_seeds

#: File formats each figure is saved in.
FORMATS = ("png", "svg", "pdf")  # PDF for papers (vector, fonts embedded)

_METRIC_LABELS = {
    "test_acc": "test accuracy",
    "test_ppl": "test perplexity",
    "train_loss": "training loss",
    "comm_bytes": "bytes sent per worker",
    "wall_time_s": "wall-clock time (s)",
    "modeled_time_s": "modeled time on the configured network (s)",
    "step": "step (optimizer steps per worker)",
    "server_updates": "server updates",
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
    _Spec("server_updates", None),  # drawn only for records that carry a server_updates count
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
            metadata = {"Date": None} if fmt == "svg" else {"CreationDate": None} if fmt == "pdf" else None
            fig.savefig(path, format=fmt, dpi=150, bbox_inches="tight", metadata=metadata)
            out.append(path)
    return out


def _line_styles(n: int) -> list[dict]:
    colors = mpl.colormaps["tab10" if n <= 10 else "tab20"].colors
    dashes = ("-", "--", ":", "-.")
    return [{"color": colors[i % len(colors)], "linestyle": dashes[(i // len(colors)) % len(dashes)]} for i in range(n)]


def _arm_styles(labels: dict[str, str]) -> dict[str, dict]:
    """``{arm label: line style}``, arms in order of first appearance in ``labels``."""
    arms = list(dict.fromkeys(labels.values()))
    return dict(zip(arms, _line_styles(len(arms))))


def _draw_arm(ax, curve: pd.DataFrame, label: str, style: dict, marker=None, **kwargs) -> None:
    """One arm's mean line and its band (``curve``: the arm's rows of :func:`aggregate_curves`)."""
    x = curve["x"].to_numpy(float)
    n = int(curve["n"].iloc[0])
    ax.plot(x, curve["mean"].to_numpy(float), label=f"{label} (n={n})", marker=marker, markersize=3, **style, **kwargs)
    if curve["band"].iloc[0] != "none":
        ax.fill_between(x, curve["low"].to_numpy(float), curve["high"].to_numpy(float), color=style["color"],
                        alpha=0.2, linewidth=0, rasterized=kwargs.get("rasterized", False))  # fmt: skip


def plot_experiment(
    records: pd.DataFrame, labels: dict[str, str], out_dir: PathLike, prefix: str
) -> dict[str, list[Path]]:
    """The figures of one experiment over its metrics records; see :func:`plot_runs`.

    Args:
        records: :func:`lsgd.analysis.load_runs` rows of the experiment's runs.
        labels: ``{run_dir: arm label}`` (:func:`lsgd.analysis.arms.arm_labels`): runs with one
            label are one arm, drawn as their mean with a band; also fixes line order and colors.
        out_dir: folder the files go to (created).
        prefix: file name prefix, e.g. ``fmnist_demo_``.

    Returns:
        ``{figure title: [png path, svg path]}`` for the figures that had data.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    metric = eval_metric(records)
    styles = _arm_styles(labels)
    experiment = prefix.rstrip("_")
    written: dict[str, list[Path]] = {}
    for spec in _SPECS:
        y = spec.y or metric
        if y is None or y not in records.columns or spec.x not in records.columns:
            continue
        logy = y in ("test_ppl", "consensus_distance")
        r = records
        if spec.logx:
            r = r[r[spec.x] >= 0]  # 0 bytes (evals before the first sync, a run that never syncs) stay
        if logy:
            r = r[r[y] > 0]
        curves = aggregate_curves(r, spec.x, y, labels)
        if curves.empty:
            continue  # e.g. no run has an evaluation yet
        fig = Figure(figsize=(7, 4.5))
        ax = fig.add_subplot()
        for arm, curve in curves.groupby("arm", sort=False):
            # markers on measured points only (not on a grid the seeds were interpolated onto)
            marker = "o" if spec.y is None and len(curve) <= 50 and not curve["interpolated"].iloc[0] else None
            _draw_arm(ax, curve, str(arm), styles[arm], marker=marker)
        zero_x = spec.logx and bool((curves["x"] == 0).any())
        if spec.logx:
            # a log axis cannot show 0: symmetric log, linear from 0 to the smallest positive value
            positive = curves["x"][curves["x"] > 0]
            if zero_x and len(positive):
                ax.set_xscale("symlog", linthresh=float(positive.min()))
            elif not zero_x:
                ax.set_xscale("log")
        if logy:
            ax.set_yscale("log")
        title = f"{_METRIC_LABELS.get(y, y)} vs {_METRIC_LABELS.get(spec.x, spec.x)}"
        scale = " (log scale, linear below the smallest nonzero value)" if zero_x else " (log scale)"
        ax.set_xlabel(_METRIC_LABELS.get(spec.x, spec.x) + (scale if spec.logx else ""))
        ax.set_ylabel(_METRIC_LABELS.get(y, y))
        # no title inside the figure: the report's caption names it (a paper's caption does)
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False,
                  title=_band_note(curves), title_fontsize="x-small")  # fmt: skip
        written[title] = _save(fig, out_dir / f"{prefix}{y}_vs_{spec.x}")
    return written


def _band_note(curves: pd.DataFrame) -> str | None:
    """Legend title saying what the bands are (None when no arm has one)."""
    bands = set(curves["band"])
    notes = []
    if "ci" in bands:
        notes.append(f"band: 95% t interval (n >= {MIN_RUNS_FOR_CI_BAND})")
    if "minmax" in bands:
        notes.append("band: min-max (n = 2)")
    if curves["interpolated"].any():
        notes.append("seeds interpolated onto a common x grid")
    return "\n".join(notes) or None


#: Title (key in the returned dicts) of the per-step compression figure.
COMPRESSION_TITLE = "compression factor and gain vs step"

#: Lines with more points than this are rasterized in the SVG (per-step rows of long runs).
_RASTERIZE_POINTS = 2000


def plot_compression(
    compression: pd.DataFrame, labels: dict[str, str], out_dir: PathLike, prefix: str
) -> dict[str, list[Path]]:
    """The per-step compression figure of one experiment; see :func:`plot_runs`.

    Two panels over ``step``: the compression factor ``cf`` actually sent (log y axis; 1 = dense)
    and the compression gain ``gain`` of what was sent (1 = dense), one solid line per arm with
    compression rows: the mean over its runs with a band (as the other figures). GraVAC arms add,
    in the arm's color, the mean ``cf_candidate`` (dashed) and ``cf_min`` (dotted) to the CF panel,
    and the smoothed gains the epsilon rule compares, ``gain_candidate`` (dashed) and ``gain_min``
    (dotted), to the gain panel.

    Args:
        compression: :func:`lsgd.analysis.load_compression` rows of the experiment's runs.
        labels: ``{run_dir: arm label}`` of all the experiment's runs (fixes colors, so an arm
            has the same color as in the other figures).
        out_dir: folder the files go to (created).
        prefix: file name prefix, e.g. ``cifar10_gravac_``.

    Returns:
        ``{COMPRESSION_TITLE: [png path, svg path]}``, or {} when no run has a ``cf`` to draw.
    """
    if compression.empty or "step" not in compression or "cf" not in compression:
        return {}
    styles = _arm_styles(labels)
    rows = compression[compression["cf"].notna() & (compression["cf"] > 0)]
    cf = aggregate_curves(rows, "step", "cf", labels)
    if cf.empty:
        return {}
    fig = Figure(figsize=(12, 4.5))
    ax_cf, ax_gain = fig.subplots(1, 2)

    def extra(ax, key: str, dash: str, label: str | None) -> None:
        if key not in rows or not rows[key].notna().any():
            return
        for arm, c in aggregate_curves(rows, "step", key, labels).groupby("arm", sort=False):
            ax.plot(c["x"].to_numpy(float), c["mean"].to_numpy(float), color=styles[arm]["color"], linestyle=dash,
                    linewidth=0.9, alpha=0.8, label=f"{arm}: {key}" if label else None,
                    rasterized=len(c) > _RASTERIZE_POINTS)  # fmt: skip

    for arm, c in cf.groupby("arm", sort=False):
        _draw_arm(ax_cf, c, str(arm), styles[arm], linewidth=1.2, rasterized=len(c) > _RASTERIZE_POINTS)
    for key, dash in (("cf_candidate", "--"), ("cf_min", ":")):
        extra(ax_cf, key, dash, label=key)
    if "gain" in rows and rows["gain"].notna().any():
        for arm, c in aggregate_curves(rows, "step", "gain", labels).groupby("arm", sort=False):
            _draw_arm(ax_gain, c, str(arm), styles[arm], linewidth=1.2, rasterized=len(c) > _RASTERIZE_POINTS)
    for key, dash in (("gain_candidate", "--"), ("gain_min", ":")):
        extra(ax_gain, key, dash, label=None)
    experiment = prefix.rstrip("_")
    ax_cf.set_yscale("log")
    ax_cf.set_xlabel(_METRIC_LABELS["step"])
    ax_cf.set_ylabel("compression factor sent (dense / sent bytes, log scale)")
    ax_gain.set_xlabel(_METRIC_LABELS["step"])
    ax_gain.set_ylabel("compression gain (dashed: candidate, dotted: theta_min)")
    for ax in (ax_cf, ax_gain):
        ax.grid(True, which="major", alpha=0.3)
    ax_gain.legend(*ax_cf.get_legend_handles_labels(), fontsize="small", loc="upper left",
                   bbox_to_anchor=(1.01, 1.0), frameon=False, title=_band_note(cf),
                   title_fontsize="x-small")  # fmt: skip
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return {COMPRESSION_TITLE: _save(fig, out_dir / f"{prefix}compression")}


def _follows(values: pd.Series, nodes: pd.Series) -> bool:
    """Whether ``values`` is a function of ``nodes``: one value per world size (a per-worker list
    such as ``algo.speeds``, a learning rate scaled with the workers), so not part of a method."""
    frame = pd.DataFrame({"v": values.map(_hashable), "nodes": nodes}).dropna(subset=["nodes"])
    return bool((frame.groupby("nodes")["v"].nunique(dropna=False) <= 1).all())


def plot_bytes_vs_nodes(summaries: pd.DataFrame, out_dir: PathLike, prefix: str) -> dict[str, list[Path]]:
    """Wire bytes per worker per step (``wire_bytes`` / ``steps`` of each run's summary) against the
    number of workers, one line per method (an arm label over the runs' differing config keys
    other than the seeds, the world size and the keys that follow it, one value per world size),
    when the runs differ in world size: a method whose
    every node talks to a fixed number of peers (gossip) stays flat, a ring all-reduce grows as
    2 (p - 1) / p x the model. Each point is the mean over the method's runs at that world size
    (:func:`lsgd.analysis.aggregate_seeds`), with error bars: the 95% t interval for 3 or more
    runs, min-max for 2. Returns ``{title: [png, svg]}`` or ``{}``."""
    nodes = world_sizes(summaries)
    if nodes.dropna().nunique() < 2 or "wire_bytes" not in summaries or "steps" not in summaries:
        return {}
    among = [k for k in arm_keys(summaries) if k not in WORLD_KEYS and not _follows(summaries[k], nodes)]
    labels = arm_labels(summaries, among=among)
    steps = summaries["steps"].map(_num)
    frame = pd.DataFrame({"label": summaries["run_dir"].map(labels), "nodes": nodes,
                          "bytes": summaries["wire_bytes"].map(_num) / steps.where(steps > 0)}, index=summaries.index)
    frame = frame.dropna()
    if frame.empty:
        return {}
    points = aggregate_seeds(frame, by=["label", "nodes"], values=["bytes"]).sort_values(["nodes"], kind="stable")
    methods = list(dict.fromkeys(frame["label"]))
    styles = dict(zip(methods, _line_styles(len(methods))))
    fig = Figure(figsize=(7, 4.5))
    ax = fig.add_subplot()
    for method in methods:
        p = points[points["label"] == method]
        mean = p["bytes_mean"].to_numpy(float)
        n = p["bytes_n"].to_numpy(int)
        low = np.where(n >= MIN_RUNS_FOR_CI_BAND, mean - p["bytes_ci"], np.where(n == 2, p["bytes_min"], mean))
        high = np.where(n >= MIN_RUNS_FOR_CI_BAND, mean + p["bytes_ci"], np.where(n == 2, p["bytes_max"], mean))
        ns = sorted(set(n.tolist()))
        label = f"{method} (n={ns[0]})" if len(ns) == 1 else f"{method} (n={ns[0]}-{ns[-1]})"
        ax.errorbar(p["nodes"].to_numpy(float), mean, yerr=np.vstack([mean - low, high - mean]), marker="o",
                    markersize=4, capsize=3, label=label, **styles[method])  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(_METRIC_LABELS["nodes"] + " (log scale)")
    ax.set_ylabel("wire bytes per worker per step (log scale)")
    # no title inside the figure: the report's caption names it
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
        labels = arm_labels(runs)
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

    For each experiment (``experiment_name``) in ``paths``, with one line per arm (the runs that
    differ only in seed: their mean, with a band, see the module docstring):

    - test accuracy vs cumulative bytes sent per worker (``comm_bytes``, bytes, log x axis),
    - test accuracy vs wall-clock time (``wall_time_s``, seconds),
    - test accuracy vs modeled time on the configured network (``modeled_time_s``, seconds),
    - test accuracy vs server updates, for records that carry ``server_updates``,
    - training loss vs step,
    - consensus distance vs step (log y), for records that carry ``consensus_distance``,
    - wire bytes per worker per step vs workers, when the runs differ in world size
      (:func:`plot_bytes_vs_nodes`),
    - for experiments with per-step compression rows (adaptive compression: ``gravac``,
      ``accordion``; :func:`lsgd.analysis.load_compression`), one figure with two panels: the
      compression factor sent vs step (log y; gravac runs add ``cf_candidate`` dashed and
      ``cf_min`` dotted) and the compression gain vs step, one line per run with such rows.

    Language models (records with ``test_ppl`` and no ``test_acc``) plot test perplexity on a
    log y axis instead of accuracy. Lines are labelled by their arm's readable label
    (:func:`lsgd.analysis.arms.arm_labels`: the algorithm and the config keys needed to tell the
    arms apart, e.g. ``local SGD, H=8``) and n, the runs averaged. A run with no point to draw in a
    figure (no evaluation yet; only 0 bytes sent on a log axis) is left out of that figure (and of
    its arm's n there), and a figure with no line at all is not written.

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
