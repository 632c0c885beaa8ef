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

from lsgd.analysis.load import PathLike, read_runs, run_labels, runs_frame, summaries_frame

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
}


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
)


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
        logy = y == "test_ppl"
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


def plot_frames(records: pd.DataFrame, summaries: pd.DataFrame, out_dir: PathLike) -> dict[str, dict[str, list[Path]]]:
    """:func:`plot_runs` on frames already loaded: ``{experiment: {title: [png, svg]}}``."""
    out: dict[str, dict[str, list[Path]]] = {}
    for experiment, runs in summaries.groupby("experiment_name", sort=True):
        runs = runs.copy()
        runs.attrs = dict(summaries.attrs)
        labels = run_labels(runs)
        exp_records = records[records["experiment_name"] == experiment]
        out[str(experiment)] = plot_experiment(exp_records, labels, out_dir, prefix=f"{safe_name(experiment)}_")
    return out


def plot_runs(paths: PathLike | Iterable[PathLike], out_dir: PathLike) -> list[Path]:
    """Save comparison figures of the runs in ``paths`` to ``out_dir``, each as PNG and SVG.

    For each experiment (``experiment_name``) in ``paths``, with one line per run:

    - test accuracy vs cumulative bytes sent per worker (``comm_bytes``, bytes, log x axis),
    - test accuracy vs wall-clock time (``wall_time_s``, seconds),
    - test accuracy vs modeled time on the configured network (``modeled_time_s``, seconds),
    - training loss vs step.

    Language models (records with ``test_ppl`` and no ``test_acc``) plot test perplexity on a
    log y axis instead of accuracy. Lines are labelled by the config keys that differ between the
    experiment's runs (:func:`lsgd.analysis.differing_keys`), e.g.
    ``algo.name=local_sgd, algo.local_steps=8``, or the run_id. A run with no point to draw in a
    figure (no evaluation yet; only 0 bytes sent on a log axis) is left out of that figure, and a
    figure with no line at all is not written.

    Files are named ``<experiment>_<y>_vs_<x>.<png|svg>``, e.g.
    ``fmnist_demo_test_acc_vs_comm_bytes.png``.

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
    written = plot_frames(runs_frame(runs), summaries_frame(runs), out_dir)
    return [p for figures in written.values() for files in figures.values() for p in files]
