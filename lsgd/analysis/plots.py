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

import math
import re
import warnings
from collections.abc import Iterable, Mapping
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
    has_server_ranks,
    read_runs,
    runs_frame,
    summaries_frame,
    world_sizes,
)
from lsgd.analysis.modeled_cluster import cluster_groups
from lsgd.analysis.stats import MIN_RUNS_FOR_CI_BAND, aggregate_curves, aggregate_seeds
from lsgd.core.labels import format_value

#: File formats each figure is saved in.
FORMATS = ("png", "svg", "pdf")  # PDF for papers (vector, fonts embedded)

#: Figure widths for papers, inches (``lsgd plot --width`` / ``lsgd report --width``): ``one``
#: column and ``two`` columns (the full text width) of the ICML style (icml2025.sty: \textwidth
#: 6.75in, \columnsep 0.25in, so 3.25 in columns). They fit IEEEtran's 3.5 / 7.16 in and ACM
#: sigconf's 3.33 / 7.0 in columns and text unscaled; NeurIPS' single 5.5 in column takes ``two``
#: at 81 %.
PAPER_WIDTHS_IN = {"one": 3.25, "two": 6.75}

#: Font sizes (pt) at each paper width: (labels, ticks / legend). At print size the smallest text
#: is 7 pt, about a paper's footnote size, and axis labels match a 8-9 pt caption.
PAPER_FONTS_PT = {"one": (8.0, 7.0), "two": (9.0, 8.0)}

#: Axes height (inches) of one panel at each paper width, the legend's rows added below it.
PAPER_AXES_HEIGHT_IN = {"one": 2.2, "two": 3.0}

#: Resolution of the PNG files (dots per inch): the default figures, and those for papers.
DPI, PAPER_DPI = 150, 300

#: The default figure (``width=None``): 7 x 4.5 in, legend outside on the right, cropped tight.
DEFAULT_FIGSIZE_IN = (7.0, 4.5)


def check_width(width: str | None) -> str | None:
    """``width`` if it is None (the default figure) or a key of :data:`PAPER_WIDTHS_IN`.

    Raises:
        ValueError: another value, naming the allowed ones.
    """
    if width is not None and width not in PAPER_WIDTHS_IN:
        raise ValueError(f"width must be one of {', '.join(PAPER_WIDTHS_IN)} (or unset), got {width!r}")
    return width


def _rc(width: str | None) -> dict:
    """matplotlib settings of the figures at ``width`` (fonts for papers; none by default)."""
    if width is None:
        return {}
    big, small = PAPER_FONTS_PT[width]
    return {"font.size": big, "axes.labelsize": big, "xtick.labelsize": small, "ytick.labelsize": small,
            "legend.fontsize": small, "legend.title_fontsize": small, "lines.linewidth": 1.2,
            "lines.markersize": 3, "axes.linewidth": 0.6}  # fmt: skip


def _new_figure(width: str | None, entries: Iterable[str] = (), panels: int = 1, note: bool = False) -> Figure:
    """An empty figure: the default 7 x 4.5 in (two panels side by side: 12 x 4.5 in), or
    exactly the paper ``width`` with a height that leaves each panel its
    :data:`PAPER_AXES_HEIGHT_IN` and the legend (``entries``, plus its title when ``note``) its
    rows below (one column: panels stacked, constrained layout)."""
    if width is None:
        return Figure(figsize=(12.0 if panels == 2 else DEFAULT_FIGSIZE_IN[0], DEFAULT_FIGSIZE_IN[1]))
    entries = list(entries)
    cols = _legend_columns(width, entries)
    rows = math.ceil(len(entries) / cols) + (1 if note else 0)
    line = PAPER_FONTS_PT[width][1] * 1.45 / 72  # a legend row, inches
    stacked = panels if width == "one" else 1
    height = stacked * PAPER_AXES_HEIGHT_IN[width] + rows * line + 0.35
    return Figure(figsize=(PAPER_WIDTHS_IN[width], height), layout="constrained")


def _legend_columns(width: str | None, entries: list[str]) -> int:
    longest = max((len(e) for e in entries), default=0)
    per_row = {"one": 2, "two": 3}.get(width, 1)
    while per_row > 1 and longest * per_row > {"one": 52, "two": 110}[width]:
        per_row -= 1
    return per_row


def _legend(fig: Figure, ax, width: str | None, title: str | None = None, handles=None) -> None:
    """The figure's legend: outside on the right by default; below the axes for papers."""
    handles, labels = handles if handles is not None else ax.get_legend_handles_labels()
    if width is None:
        ax.legend(handles, labels, fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False,
                  title=title, title_fontsize="x-small")  # fmt: skip
        return
    fig.legend(handles, labels, loc="outside lower center", ncols=_legend_columns(width, labels), frameon=False,
               title=title, handlelength=1.8, columnspacing=1.0)  # fmt: skip

_METRIC_LABELS = {
    "test_acc": "test accuracy",
    "test_ppl": "test perplexity",
    "train_loss": "training loss",
    "comm_bytes": "payload bytes sent per worker (comm_bytes)",
    "wire_bytes": "wire bytes sent per worker (wire_bytes)",
    "wall_time_s": "wall-clock time (s)",
    "modeled_time_s": "modeled time on the modeled cluster (s)",
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
    _Spec("wire_bytes", None, logx=True),
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
    """Write ``fig`` as ``stem``.png / .svg / .pdf. A paper-width figure (constrained layout) keeps
    its exact size; the default one is cropped to what it draws."""
    out = []
    paper = fig.get_layout_engine() is not None
    # Text stays text in the SVG (editable, searchable); no timestamp, fixed ids: reproducible files.
    # Paper figures embed TrueType fonts in the PDF (pdf.fonttype 42): publishers' checks (IEEE PDF
    # eXpress, ACM) reject Type 3 fonts; the default figures keep matplotlib's faster Type 3.
    rc = {"svg.fonttype": "none", "svg.hashsalt": "lsgd", **({"pdf.fonttype": 42} if paper else {})}
    with mpl.rc_context(rc):
        for fmt in FORMATS:
            path = stem.with_name(f"{stem.name}.{fmt}")
            metadata = {"Date": None} if fmt == "svg" else {"CreationDate": None} if fmt == "pdf" else None
            fig.savefig(path, format=fmt, dpi=PAPER_DPI if paper else DPI, bbox_inches=None if paper else "tight",
                        metadata=metadata)  # fmt: skip
            out.append(path)
    return out


def _line_styles(n: int) -> list[dict]:
    colors = mpl.colormaps["tab10" if n <= 10 else "tab20"].colors
    dashes = ("-", "--", ":", "-.")
    return [{"color": colors[i % len(colors)], "linestyle": dashes[(i // len(colors)) % len(dashes)]} for i in range(n)]


def arm_styles(labels: Mapping[str, str] | Iterable[str]) -> dict[str, dict]:
    """``{arm label: line style}`` (``color``, ``linestyle``): the arms in order of first appearance
    in ``labels`` (``{run_dir: label}`` or labels), each its own color of tab10 (tab20 past 10
    arms; dashed past 20). :func:`plot_frames` makes one map over every experiment it draws, so
    an arm keeps its color in every figure of the report, also across experiments (the levels of
    a study)."""
    values = labels.values() if isinstance(labels, Mapping) else labels
    arms = list(dict.fromkeys(values))
    return dict(zip(arms, _line_styles(len(arms))))


_arm_styles = arm_styles  # the name earlier code used


def _draw_arm(ax, curve: pd.DataFrame, label: str, style: dict, marker=None, **kwargs) -> None:
    """One arm's mean line and its band (``curve``: the arm's rows of :func:`aggregate_curves`);
    NaN means break the line and the band (a point the runs did not measure)."""
    x = curve["x"].to_numpy(float)
    n = int(curve["n"].iloc[0])
    ax.plot(x, curve["mean"].to_numpy(float), label=f"{label} (n={n})", marker=marker, markersize=3, **style, **kwargs)
    if curve["band"].iloc[0] != "none":
        ax.fill_between(x, curve["low"].to_numpy(float), curve["high"].to_numpy(float), color=style["color"],
                        alpha=0.2, linewidth=0, rasterized=kwargs.get("rasterized", False))  # fmt: skip


def worker_record_bytes(records: pd.DataFrame, summaries: pd.DataFrame | None = None,
                        key: str = "wire_bytes") -> pd.Series:
    """Per record, the bytes one worker has sent so far: ``key`` = ``wire_bytes`` (what travels;
    the x axis of "test accuracy vs wire bytes sent per worker" and the report's byte measure,
    :func:`lsgd.analysis.tables.worker_bytes`) or ``comm_bytes`` (the payload handed to
    collectives): ``<key>_workers``, the mean over the worker ranks that runs with server ranks
    record (``param_server``, ``async_local_sgd``, ``adsaga``), else ``key`` for a run whose ranks
    are all workers; NaN for a record of a run with server ranks that lacks it (``key`` averages
    the server in: a parameter server's N messages per step would count as a worker's; such runs
    are warned about and left out of the figure).

    Args:
        records: :func:`lsgd.analysis.load_runs` rows.
        summaries: :func:`lsgd.analysis.load_summaries` rows of the same runs (which runs have
            server ranks, :func:`lsgd.analysis.load.has_server_ranks`); None: from the records'
            ``algo.name``.
        key: ``wire_bytes`` or ``comm_bytes``.

    Returns:
        Bytes, aligned with ``records``.
    """
    total = pd.to_numeric(records[key], errors="coerce") if key in records else pd.Series(
        math.nan, index=records.index)  # fmt: skip
    if f"{key}_workers" in records:
        workers = pd.to_numeric(records[f"{key}_workers"], errors="coerce")
    else:
        workers = pd.Series(math.nan, index=records.index)
    source = summaries if summaries is not None and len(summaries) else records.drop_duplicates("run_dir")
    servers = {d: has_server_ranks(row) for d, row in source.set_index("run_dir", drop=False).iterrows()}
    with_servers = records["run_dir"].map(servers).fillna(False).astype(bool)
    out = workers.where(workers.notna(), total.where(~with_servers))
    lacking = sorted({str(d) for d in records.loc[with_servers & workers.isna() & total.notna(), "run_dir"]})
    if lacking:
        warnings.warn(f"bytes per worker: {len(lacking)} run(s) with server ranks record no {key}_workers "
                      f"(recorded before it, or the server's own records): left out of the bytes figure: "
                      f"{', '.join(lacking)}", stacklevel=2)  # fmt: skip
    return out


def worker_comm_bytes(records: pd.DataFrame, summaries: pd.DataFrame | None = None) -> pd.Series:
    """:func:`worker_record_bytes` of the payload, ``comm_bytes``."""
    return worker_record_bytes(records, summaries, key="comm_bytes")


#: Metrics measured at some records only, whose missing points break the line instead of being
#: drawn across (a straight segment over an unmeasured point looks like a measured V).
GAP_METRICS = ("consensus_distance",)

#: The fewest points an arm needs in a figure to be a curve; an arm with fewer (one evaluation
#: per epoch of a 1-epoch run) is named in a warning (:func:`sparse_curve_message`).
MIN_CURVE_POINTS = 3

#: Evaluations (or records) per run that the warning's suggested settings give.
SUGGESTED_POINTS = 10


class SparseCurveWarning(UserWarning):
    """A figure draws an arm with fewer than :data:`MIN_CURVE_POINTS` points: dots, not a curve."""


def _written(records: pd.DataFrame, key: str) -> str:
    """The config values of ``key`` among ``records``' runs, as written (``epoch``; ``1 / 2``)."""
    if key not in records:
        return "unset"
    values = [format_value(v) for v in records.drop_duplicates("run_dir")[key]]
    return " / ".join(dict.fromkeys(v or "unset" for v in values))


def sparse_curve_message(title: str, y: str, few: Mapping[str, int], records: pd.DataFrame) -> str:
    """The warning for a figure (``title``, its y metric ``y``) that draws the arms of ``few``
    (``{arm: points}``) with fewer than :data:`MIN_CURVE_POINTS` points each: which arms, and the
    config keys that give about :data:`SUGGESTED_POINTS` points over their runs (``records``: their
    metrics records): ``eval_unit=step eval_every=...`` for evaluated metrics (or
    ``consensus_every_record=true`` for the consensus distance), ``log_every=...`` for the
    training loss."""
    arms = ", ".join(f"{a} ({k} point{'s' if k != 1 else ''})" for a, k in few.items())
    steps = int(pd.to_numeric(records["step"], errors="coerce").max()) if "step" in records and len(records) else 0
    every = max(1, steps // SUGGESTED_POINTS)
    verb = "has" if len(few) == 1 else "have"
    if y == "train_loss":
        what, keys = "logged records", f"`log_every={every}`"
        now = f"`log_every={_written(records, 'log_every')}`"
    else:
        what, keys = "evaluated points", f"`eval_unit=step eval_every={every}`"
        if y in GAP_METRICS:  # measured at the evaluations, or at every record
            keys += " or `consensus_every_record=true`"
        now = f"`eval_unit={_written(records, 'eval_unit')} eval_every={_written(records, 'eval_every')}`"
    return (f'figure "{title}": {arms} {verb} fewer than {MIN_CURVE_POINTS} {what}, drawn as dots, not a '
            f"curve; set {keys} (about {SUGGESTED_POINTS} over their {steps} steps; now {now}).")

_EVAL_KEYS = ("test_loss", "test_acc", "test_ppl")


def _measured_points(records: pd.DataFrame, y: str, positive: bool) -> pd.DataFrame:
    """The records at which each run measures ``y`` (:data:`GAP_METRICS`), ``y`` NaN where it is
    missing: every record of a run that has ``y`` on a record without an evaluation
    (``consensus_every_record``), else the run's evaluation records. ``positive``: values <= 0
    (not drawable on a log axis) are gaps too. Runs without any ``y`` are left out."""
    evals = pd.Series(False, index=records.index)
    for key in _EVAL_KEYS:
        if key in records:
            evals |= records[key].notna()
    keep = []
    for _, r in records.groupby("run_dir", sort=False):
        values = pd.to_numeric(r[y], errors="coerce")
        if values.notna().sum() == 0:
            continue
        every = bool((values.notna() & ~evals[r.index]).any())
        rows = r if every else r[evals[r.index]]
        v = values[rows.index]
        keep.append(rows.assign(**{y: v.where(v > 0) if positive else v}))
    return pd.concat(keep) if keep else records.iloc[0:0]


def plot_experiment(
    records: pd.DataFrame,
    labels: dict[str, str],
    out_dir: PathLike,
    prefix: str,
    styles: Mapping[str, dict] | None = None,
    width: str | None = None,
    sparse: dict[str, str] | None = None,
    cluster: str | None = None,
) -> dict[str, list[Path]]:
    """The figures of one experiment over its metrics records; see :func:`plot_runs`.

    Args:
        records: :func:`lsgd.analysis.load_runs` rows of the experiment's runs; the bytes figure's
            x axis is ``wire_bytes`` (pass :func:`worker_record_bytes` there, as :func:`plot_frames`
            does, for runs with server ranks).
        labels: ``{run_dir: arm label}`` (:func:`lsgd.analysis.arms.arm_labels`): runs with one
            label are one arm, drawn as their mean with a band; also fixes line order and colors.
        out_dir: folder the files go to (created).
        prefix: file name prefix, e.g. ``fmnist_demo_``.
        styles: ``{arm label: line style}`` (:func:`arm_styles`; default: from ``labels``).
        width: None (the default figure) or a paper width, ``one`` / ``two`` (:data:`PAPER_WIDTHS_IN`).
        sparse: filled with ``{figure title: warning}`` (:func:`sparse_curve_message`) for each
            figure that draws an arm with fewer than :data:`MIN_CURVE_POINTS` points.
        cluster: the modeled cluster in a few words
            (:func:`lsgd.analysis.modeled_cluster.short_cluster_text`), a second line of the
            modeled-time axis label (not at ``width="one"``: the caption names it).

    Returns:
        ``{figure title: [png path, svg path, pdf path]}`` for the figures that had data.
    """
    check_width(width)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    metric = eval_metric(records)
    styles = dict(styles) if styles is not None else arm_styles(labels)
    written: dict[str, list[Path]] = {}
    for spec in _SPECS:
        y = spec.y or metric
        if y is None or y not in records.columns or spec.x not in records.columns:
            continue
        logy = y in ("test_ppl", "consensus_distance")
        gaps = y in GAP_METRICS
        r = records
        if spec.logx:
            r = r[r[spec.x] >= 0]  # 0 bytes (evals before the first sync, a run that never syncs) stay
        if gaps:
            r = _measured_points(r, y, positive=logy)
        elif logy:
            r = r[r[y] > 0]
        curves = aggregate_curves(r, spec.x, y, labels, gaps=gaps)
        if curves.empty or curves["mean"].isna().all():
            continue  # e.g. no run has an evaluation yet
        points = curves[curves["mean"].notna()].groupby("arm", sort=False)["x"].nunique()
        few = {str(a): int(k) for a, k in points.items() if k < MIN_CURVE_POINTS}
        with mpl.rc_context(_rc(width)):
            arms = list(dict.fromkeys(curves["arm"]))
            n_of = curves.groupby("arm", sort=False)["n"].first()
            fig = _new_figure(width, [f"{a} (n={n_of[a]})" for a in arms], note=_band_note(curves) is not None)
            ax = fig.add_subplot()
            for arm, curve in curves.groupby("arm", sort=False):
                # markers on measured points only (not on a grid the seeds were interpolated onto);
                # with gaps, so that a point between two gaps shows
                marker = "o" if (spec.y is None or gaps) and len(curve) <= 50 and not curve["interpolated"].iloc[0] else None
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
            if width == "one":
                scale = " (log)" if not zero_x else " (symlog)"
            on = f"\n{cluster}" if cluster and spec.x == "modeled_time_s" and width != "one" else ""
            ax.set_xlabel(_axis_label(spec.x, width) + (scale if spec.logx else "") + on)
            ax.set_ylabel(_axis_label(y, width))
            # no title inside the figure: the report's caption names it (a paper's caption does)
            ax.grid(True, which="major", alpha=0.3)
            _legend(fig, ax, width, title=_band_note(curves))
            written[title] = _save(fig, out_dir / f"{prefix}{y}_vs_{spec.x}")
        if few and sparse is not None:
            dirs = [d for d, lab in labels.items() if lab in few]
            sparse[title] = sparse_curve_message(title, y, few, r[r["run_dir"].isin(dirs)])
    return written


#: Shorter axis labels where a one-column figure has no room for the long ones.
_SHORT_LABELS = {
    "consensus_distance": "consensus distance",
    "modeled_time_s": "modeled time (s)",
    "wire_bytes": "wire bytes / worker",
    "step": "step",
}


def _axis_label(key: str, width: str | None) -> str:
    label = _METRIC_LABELS.get(key, key)
    return _SHORT_LABELS.get(key, label) if width == "one" else label


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
    compression: pd.DataFrame,
    labels: dict[str, str],
    out_dir: PathLike,
    prefix: str,
    styles: Mapping[str, dict] | None = None,
    width: str | None = None,
) -> dict[str, list[Path]]:
    """The per-step compression figure of one experiment; see :func:`plot_runs`.

    Two panels over ``step``: the compression factor ``cf`` actually sent (log y axis; 1 = dense)
    and the compression gain ``gain`` of what was sent (1 = dense), one solid line per arm with
    compression rows: the mean over its runs with a band (as the other figures). GraVAC arms add,
    in the arm's color, the mean ``cf_candidate`` (dashed) and ``cf_min`` (dotted) to the CF panel,
    and the smoothed gains the epsilon rule compares, ``gain_candidate`` (dashed) and ``gain_min``
    (dotted), to the gain panel. Side by side, stacked at ``width="one"``.

    Args:
        compression: :func:`lsgd.analysis.load_compression` rows of the experiment's runs.
        labels: ``{run_dir: arm label}`` of all the experiment's runs (fixes colors, so an arm
            has the same color as in the other figures).
        out_dir: folder the files go to (created).
        prefix: file name prefix, e.g. ``cifar10_gravac_``.
        styles: ``{arm label: line style}`` (:func:`arm_styles`; default: from ``labels``).
        width: None (the default figure) or a paper width, ``one`` / ``two``.

    Returns:
        ``{COMPRESSION_TITLE: [png, svg, pdf paths]}``, or {} when no run has a ``cf`` to draw.
    """
    check_width(width)
    if compression.empty or "step" not in compression or "cf" not in compression:
        return {}
    styles = dict(styles) if styles is not None else arm_styles(labels)
    rows = compression[compression["cf"].notna() & (compression["cf"] > 0)]
    cf = aggregate_curves(rows, "step", "cf", labels)
    if cf.empty:
        return {}
    with mpl.rc_context(_rc(width)):
        return _compression_figure(rows, cf, labels, styles, Path(out_dir), prefix, width)


def _compression_figure(rows, cf, labels, styles, out_dir: Path, prefix: str, width: str | None) -> dict[str, list[Path]]:
    def extra(ax, key: str, dash: str, label: str | None) -> None:
        if key not in rows or not rows[key].notna().any():
            return
        for arm, c in aggregate_curves(rows, "step", key, labels).groupby("arm", sort=False):
            ax.plot(c["x"].to_numpy(float), c["mean"].to_numpy(float), color=styles[arm]["color"], linestyle=dash,
                    linewidth=0.9, alpha=0.8, label=f"{arm}: {key}" if label else None,
                    rasterized=len(c) > _RASTERIZE_POINTS)  # fmt: skip

    n_of = cf.groupby("arm", sort=False)["n"].first()
    entries = [f"{a} (n={n})" for a, n in n_of.items()]
    entries += [f"{a}: {k}" for k in ("cf_candidate", "cf_min") if k in rows and rows[k].notna().any()
                for a in dict.fromkeys(cf["arm"])]  # fmt: skip
    fig = _new_figure(width, entries, panels=2, note=_band_note(cf) is not None)
    ax_cf, ax_gain = fig.subplots(2, 1) if width == "one" else fig.subplots(1, 2)
    for arm, c in cf.groupby("arm", sort=False):
        _draw_arm(ax_cf, c, str(arm), styles[arm], linewidth=1.2, rasterized=len(c) > _RASTERIZE_POINTS)
    for key, dash in (("cf_candidate", "--"), ("cf_min", ":")):
        extra(ax_cf, key, dash, label=key)
    if "gain" in rows and rows["gain"].notna().any():
        for arm, c in aggregate_curves(rows, "step", "gain", labels).groupby("arm", sort=False):
            _draw_arm(ax_gain, c, str(arm), styles[arm], linewidth=1.2, rasterized=len(c) > _RASTERIZE_POINTS)
    for key, dash in (("gain_candidate", "--"), ("gain_min", ":")):
        extra(ax_gain, key, dash, label=None)
    ax_cf.set_yscale("log")
    ax_cf.set_xlabel(_axis_label("step", width))
    short = width == "one"
    ax_cf.set_ylabel("CF sent (log)" if short else "compression factor sent (dense / sent bytes, log scale)")
    ax_gain.set_xlabel(_axis_label("step", width))
    ax_gain.set_ylabel("gain" if short else "compression gain (dashed: candidate, dotted: theta_min)")
    for ax in (ax_cf, ax_gain):
        ax.grid(True, which="major", alpha=0.3)
    _legend(fig, ax_gain, width, title=_band_note(cf), handles=ax_cf.get_legend_handles_labels())
    out_dir.mkdir(parents=True, exist_ok=True)
    return {COMPRESSION_TITLE: _save(fig, out_dir / f"{prefix}compression")}


def _follows(values: pd.Series, nodes: pd.Series) -> bool:
    """Whether ``values`` is a function of ``nodes``: one value per world size (a per-worker list
    such as ``algo.speeds``, a learning rate scaled with the workers), so not part of a method."""
    frame = pd.DataFrame({"v": values.map(_hashable), "nodes": nodes}).dropna(subset=["nodes"])
    return bool((frame.groupby("nodes")["v"].nunique(dropna=False) <= 1).all())


def _summary_worker_bytes(run, key: str) -> float:
    """``<key>_workers`` of a run's summary (runs with server ranks), else ``key`` where every rank
    is a worker, else NaN (a server run whose ``key`` averages the server in)."""
    workers = _num(run.get(f"{key}_workers"))
    if math.isfinite(workers):
        return workers
    return math.nan if has_server_ranks(run) else _num(run.get(key))


def plot_bytes_vs_nodes(
    summaries: pd.DataFrame,
    out_dir: PathLike,
    prefix: str,
    styles: Mapping[str, dict] | None = None,
    width: str | None = None,
) -> dict[str, list[Path]]:
    """Wire bytes per worker per step (``wire_bytes`` / ``steps`` of each run's summary; in a run
    with server ranks ``wire_bytes_workers`` and ``num_workers``: the workers' own bytes, server
    ranks not counted as nodes) against the number of workers, one line per method (an arm label over the runs' differing config keys
    other than the seeds, the world size and the keys that follow it, one value per world size),
    when the runs differ in world size: a method whose
    every node talks to a fixed number of peers (gossip) stays flat, a ring all-reduce grows as
    2 (p - 1) / p x the model. Each point is the mean over the method's runs at that world size
    (:func:`lsgd.analysis.aggregate_seeds`), with error bars: the 95% t interval for 3 or more
    runs, min-max for 2. Returns ``{title: [png, svg, pdf]}`` or ``{}``.

    ``styles``: ``{arm label: line style}`` of the experiment's arms (:func:`arm_styles` over
    :func:`lsgd.analysis.arms.arm_labels`): a method is drawn in the color of its first arm, as
    in the other figures (default: the experiment's own arms). ``width``: as :func:`plot_experiment`.
    """
    check_width(width)
    nodes = world_sizes(summaries)
    if nodes.dropna().nunique() < 2 or "wire_bytes" not in summaries or "steps" not in summaries:
        return {}
    among = [k for k in arm_keys(summaries) if k not in WORLD_KEYS and not _follows(summaries[k], nodes)]
    labels = arm_labels(summaries, among=among)
    steps = summaries["steps"].map(_num)
    # the worker ranks' own: a server rank is neither a node of the x axis nor averaged into y
    workers = summaries["num_workers"].map(_num) if "num_workers" in summaries else pd.Series(math.nan, index=summaries.index)
    nodes = workers.where(workers.notna(), nodes)
    wire = pd.Series([_summary_worker_bytes(row, "wire_bytes") for _, row in summaries.iterrows()], index=summaries.index)
    frame = pd.DataFrame({"label": summaries["run_dir"].map(labels), "nodes": nodes,
                          "bytes": wire / steps.where(steps > 0)}, index=summaries.index)
    frame = frame.dropna()
    if frame.empty:
        return {}
    points = aggregate_seeds(frame, by=["label", "nodes"], values=["bytes"]).sort_values(["nodes"], kind="stable")
    methods = list(dict.fromkeys(frame["label"]))
    arms = arm_labels(summaries)
    arm_style = arm_styles(arms) if styles is None else {**arm_styles(arms), **styles}
    first_arm = {}
    for d in summaries["run_dir"]:  # each method in the style of its first arm (in arm order)
        first_arm.setdefault(labels[d], [])
        first_arm[labels[d]].append(arms[d])
    order = list(arm_style)
    method_style = {m: arm_style[min(first_arm[m], key=lambda a: order.index(a) if a in order else len(order))]
                    for m in methods}  # fmt: skip
    with mpl.rc_context(_rc(width)):
        return _scaling_figure(points, frame, methods, method_style, Path(out_dir), prefix, width)


def _scaling_figure(points, frame, methods, styles, out_dir: Path, prefix: str, width: str | None):
    entries = []
    for method in methods:
        ns = sorted(set(points.loc[points["label"] == method, "bytes_n"].astype(int).tolist()))
        entries.append(f"{method} (n={ns[0]})" if len(ns) == 1 else f"{method} (n={ns[0]}-{ns[-1]})")
    fig = _new_figure(width, entries)
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
    ax.set_xlabel(_METRIC_LABELS["nodes"] + (" (log)" if width == "one" else " (log scale)"))
    ax.set_ylabel("wire bytes / worker / step (log)" if width == "one" else "wire bytes per worker per step (log scale)")
    # no title inside the figure: the report's caption names it
    ax.grid(True, which="major", alpha=0.3)
    _legend(fig, ax, width)
    out_dir.mkdir(parents=True, exist_ok=True)
    return {SCALING_TITLE: _save(fig, out_dir / f"{prefix}wire_bytes_per_step_vs_nodes")}


def plot_frames(
    records: pd.DataFrame,
    summaries: pd.DataFrame,
    out_dir: PathLike,
    compression: pd.DataFrame | None = None,
    width: str | None = None,
    sparse: dict[str, dict[str, str]] | None = None,
) -> dict[str, dict[str, list[Path]]]:
    """:func:`plot_runs` on frames already loaded: ``{experiment: {title: [png, svg, pdf]}}``.

    ``compression``: :func:`lsgd.analysis.load_compression` rows (None: no compression figures).
    ``width``: None (the default figures) or a paper width, ``one`` / ``two`` (:data:`PAPER_WIDTHS_IN`).
    ``sparse``: filled with ``{experiment: {title: warning}}`` for the figures that draw an arm
    with fewer than :data:`MIN_CURVE_POINTS` points (:func:`sparse_curve_message`).
    One arm -> style map (:func:`arm_styles`) over every experiment, in order of their names.

    Raises:
        ValueError: an unknown ``width``.
    """
    check_width(width)
    out: dict[str, dict[str, list[Path]]] = {}
    groups = [(str(e), runs.copy()) for e, runs in summaries.groupby("experiment_name", sort=True)]
    labels_of = {}
    for experiment, runs in groups:
        runs.attrs = dict(summaries.attrs)
        labels_of[experiment] = arm_labels(runs)
    styles = arm_styles([lab for labels in labels_of.values() for lab in labels.values()])
    if len(records):
        records = records.assign(wire_bytes=worker_record_bytes(records, summaries, "wire_bytes"))
    for experiment, runs in groups:
        labels = labels_of[experiment]
        exp_records = records[records["experiment_name"] == experiment]
        prefix = f"{safe_name(experiment)}_"
        clusters = list(dict.fromkeys(short for _, short, _ in cluster_groups(runs)))
        cluster = clusters[0] if len(clusters) == 1 else "the cluster of each arm: see the report"
        notes: dict[str, str] = {}
        out[experiment] = plot_experiment(exp_records, labels, out_dir, prefix=prefix, styles=styles, width=width,
                                          sparse=notes, cluster=cluster)  # fmt: skip
        if sparse is not None and notes:
            sparse[experiment] = notes
        out[experiment].update(plot_bytes_vs_nodes(runs, out_dir, prefix=prefix, styles=styles, width=width))
        if compression is not None and len(compression):
            exp_comp = compression[compression["experiment_name"] == experiment]
            out[experiment].update(plot_compression(exp_comp, labels, out_dir, prefix=prefix, styles=styles, width=width))
    return out


def plot_runs(paths: PathLike | Iterable[PathLike], out_dir: PathLike, width: str | None = None) -> list[Path]:
    """Save comparison figures of the runs in ``paths`` to ``out_dir``, each as PNG, SVG and PDF.

    For each experiment (``experiment_name``) in ``paths``, with one line per arm (the runs that
    differ only in seed: their mean, with a band, see the module docstring):

    - test accuracy vs cumulative wire bytes sent per worker (bytes, log x axis): what one worker
      has put on the wire, the mean over the worker ranks (:func:`worker_record_bytes`:
      ``wire_bytes_workers`` where a run has server ranks, else ``wire_bytes``), the report's
      byte measure,
    - test accuracy vs wall-clock time (``wall_time_s``, seconds),
    - test accuracy vs modeled time on the modeled cluster (``modeled_time_s``, seconds; the axis
      label names the cluster in a few words when the experiment's runs share one,
      :mod:`lsgd.analysis.modeled_cluster`),
    - test accuracy vs server updates, for records that carry ``server_updates``,
    - training loss vs step,
    - consensus distance vs step (log y), for records that carry ``consensus_distance``; the line
      breaks where a run did not measure it at one of its evaluations (or records, with
      ``consensus_every_record``) or measured 0, instead of running straight across,
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
    its arm's n there), and a figure with no line at all is not written. A figure that draws an
    arm with fewer than :data:`MIN_CURVE_POINTS` points (one evaluation per epoch of a 1-epoch
    run) gives a :class:`SparseCurveWarning` naming the arms and the keys to change
    (:func:`sparse_curve_message`).

    An arm has one color (and dash) in every figure, also across the experiments drawn together
    (:func:`arm_styles`).

    Sizes (``width``): None, the default, draws 7 x 4.5 in figures (12 x 4.5 in for the two-panel
    compression figure) with the legend on the right, cropped to what they draw, PNG at 150 dpi.
    ``"one"`` / ``"two"`` draw figures exactly one column (3.25 in) or two columns (6.75 in) wide
    (:data:`PAPER_WIDTHS_IN`: ICML's widths, within IEEE's and ACM's), 8 / 9 pt labels and 7 / 8
    pt ticks and legend at that size (:data:`PAPER_FONTS_PT`), the legend below the axes, PNG at
    300 dpi; their PDF pages are that wide, so a paper includes them unscaled.

    Files are named ``<experiment>_<y>_vs_<x>.<png|svg|pdf>``, e.g.
    ``fmnist_demo_test_acc_vs_wire_bytes.png``; the compression figure
    ``<experiment>_compression.<png|svg|pdf>``.

    Args:
        paths: a run folder, a folder containing run folders at any depth, or a list of these.
        out_dir: output folder (created if missing).
        width: None, ``"one"`` or ``"two"`` (above).

    Returns:
        The paths written, PNG, SVG and PDF of each figure.

    Raises:
        FileNotFoundError: a path does not exist or holds no run folder.
        ValueError: no paths, an unreadable run file, or an unknown ``width``.
    """
    check_width(width)
    runs = read_runs(paths)
    sparse: dict[str, dict[str, str]] = {}
    written = plot_frames(runs_frame(runs), summaries_frame(runs), out_dir, compression_frame(runs), width=width,
                          sparse=sparse)  # fmt: skip
    for experiment, notes in sparse.items():
        for note in notes.values():
            warnings.warn(f"{experiment}: {note}", SparseCurveWarning, stacklevel=2)
    return [p for figures in written.values() for files in figures.values() for p in files]
