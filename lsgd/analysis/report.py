"""The report, as Markdown (report.md) and as one self-contained HTML page (report.html: the same
text, tables and figures embedded, :func:`lsgd.analysis.html_page.markdown_to_html`): per
experiment, a compact main table over arms (runs that differ only in seed) with one byte measure
(wire bytes per worker and its ratio to the baseline's) and the modeled speedup beside the wall
one, a detailed table, CSV files with every number, a LaTeX version of the main table, what
produced the runs, the modeled cluster, and the figures of :mod:`lsgd.analysis.plots`.
:func:`write_report` writes it; the report's text (its definitions, the threshold and what differs
between the runs) is written here too.

Where the parts come from: the numbers and their definitions (arms and seeds, ``m ± h``, T and
time to T, speedup, paired differences, bytes, modeled time at other bandwidths, batch scaling) from
:mod:`lsgd.analysis.tables`; what the modeled numbers model from
:mod:`lsgd.analysis.modeled_cluster`; the tables' cells, Markdown and LaTeX from
:mod:`lsgd.analysis.formats`; the environment (commit, versions, CPU, GPU) from
:mod:`lsgd.analysis.environment`; report.html from :mod:`lsgd.analysis.html_page`.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable
from pathlib import Path

from lsgd.analysis.environment import environment_differences, environment_note, environment_table, has_environment
from lsgd.analysis.formats import (
    GB_SENT,
    NOT_RECORDED,
    PAYLOAD_VS_DENSE,
    PEAK,
    PM,
    format_batch_scaling,
    format_main_table,
    format_table,
    latex_table,
    markdown_table,
    modeled_speedup,
    peak_vs,
    wall_speedup,
    wire_vs,
)
from lsgd.analysis.html_page import markdown_to_html
from lsgd.analysis.load import RUNNING, PathLike, compression_frame, read_runs, runs_frame, summaries_frame
from lsgd.analysis.modeled_cluster import arm_cluster_texts, cluster_groups, cluster_lines
from lsgd.analysis.plots import MIN_CURVE_POINTS, SparseCurveWarning, check_width, plot_frames, safe_name
from lsgd.analysis.stats import CONFIDENCE
from lsgd.analysis.tables import BASELINE_ALGO, ExperimentTable, batch_scaling_table, tables_from_frames
from lsgd.core.files import write_atomic

REPORT_FILE = "report.md"
HTML_FILE = "report.html"
FIGURES_DIR = "figures"

#: Files written next to report.md per experiment: the main table in LaTeX, every number per arm
#: and per run in CSV (``{name}``: the experiment's :func:`lsgd.analysis.plots.safe_name`).
LATEX_FILE, ARMS_CSV, RUNS_CSV = "{name}_main.tex", "{name}_arms.csv", "{name}_runs.csv"


def _threshold_text(t: ExperimentTable, n_completed: int) -> str:
    name, which = ("test accuracy", "lowest") if t.metric == "test_acc" else ("test perplexity", "highest")
    if t.threshold is None:
        return f"No completed run with a final {name}: no threshold, speedups n/a."
    digits = ".4f" if t.metric == "test_acc" else ".2f"
    k = len(t.collapsed_runs)
    collapsed = (
        f" {k} run{'s' if k != 1 else ''} collapsed (final {name} worse than at the first evaluation): "
        + ", ".join(f"`{r}`" for r in t.collapsed_runs)
        + "."
        if k
        else ""
    )
    runs = len(t.baseline_runs)
    base = (
        f"baseline `{t.baseline}`: {runs} run{'s' if runs != 1 else ''}"
        if runs
        else f"speedups n/a: no run of the baseline `{t.baseline}` in this experiment"
    )
    if t.threshold_given:
        return f"Threshold T = {format(t.threshold, digits)} {name}, given by `--threshold`; {base}.{collapsed}"
    if k and k < n_completed:
        among = f"{n_completed - k} completed runs that did not collapse"
    else:
        among = f"{n_completed} completed runs"
    return f"Threshold T = {format(t.threshold, digits)}, the {which} final {name} among the {among}; {base}.{collapsed}"


def _differences_text(t: ExperimentTable) -> list[str]:
    """Lines naming what differs between the experiment's runs, seeds and label names included."""
    n_runs, n_arms = len(t.table), len(t.arms)
    diffs = t.differences or {}
    ns = sorted(int(n) for n in t.arms["n"])
    per_arm = f"n = {ns[0]} each" if ns[0] == ns[-1] else f"n = {ns[0]} to {ns[-1]} runs"
    lines = [f"{n_runs} run{'s' if n_runs != 1 else ''} in {n_arms} arm{'s' if n_arms != 1 else ''} ({per_arm})."]
    if diffs:
        lines.append(
            "Config differences: " + "; ".join(f"`{k}`: {', '.join(v)}" for k, v in diffs.items()) + "."
        )
    else:
        lines.append("Config differences: none (one configuration).")
    short = [f"{name} = `{k}`" for k, name in (t.label_names or {}).items()]
    if short:
        lines.append("In the labels: " + ", ".join(short) + ".")
    return [" ".join(lines)]


def definitions_text(baseline: str, confidence: float = CONFIDENCE) -> list[str]:
    """The report's definitions, stated once at its top."""
    pct = f"{confidence:.0%}"
    return [
        "## Definitions",
        "",
        (
            "- **Arm, n.** An arm is the runs of an experiment whose configs differ only in the seed "
            "(`seed`, `algo.seed` and other `*.seed` keys) and run bookkeeping (run id, folder, "
            "`results_dir`, `resume`); n is its number of runs (seeds). Runs that did not complete "
            "are arms of their own, marked with their status."
        ),
        (
            f"- **m ± h.** Every number in a table is the mean m over the arm's runs and the half-width "
            f"h of the {pct} confidence interval of that mean, Student t with n - 1 degrees of freedom: "
            f"h = t(1 - (1 - {confidence:g}) / 2, n - 1) s / sqrt(n), s the sample standard deviation "
            "over the runs. n = 1: the value, no interval. `(k of n)`: only k runs have the value (the "
            "others never reached T); m and h are over those k."
        ),
        (
            "- **T, time to T.** T is the lowest final test accuracy (language models: the highest final "
            "test perplexity) among the experiment's completed runs, all seeds counted, so every "
            "such run reaches it; runs that collapsed (final evaluation worse than their first) are left "
            "out and named, and `--threshold` gives T instead. A run's time to T is its `wall_time_s` or "
            "`modeled_time_s` at its first evaluation with test accuracy >= T (perplexity <= T)."
        ),
        (
            f"- **Δ vs {baseline}, paired.** The arm's final accuracy (perplexity) minus that of the "
            f"baseline's run with the same seed, averaged over the seeds both have, ± the paired 95% t "
            "interval: a difference is real when its interval excludes 0. Each arm is paired with the "
            "baseline arm that shares most of its other config keys (the detailed table names it)."
        ),
        (
            f"- **{modeled_speedup(baseline)}, {wall_speedup(baseline)}.** The baseline's time to T "
            f"(the mean over the runs that `--baseline {baseline}` selects and that reached T) divided "
            "by the run's time to T, on modeled time (the modeled cluster named above) and on wall "
            "time (measured on the machine that ran each job): the same baseline runs and the same T; "
            "an arm's speedup is the mean over its runs."
        ),
        (
            f"- **Bytes: one measure, the wire.** **{GB_SENT}** = `wire_bytes` / 1e9: the bytes a "
            "worker puts on the wire (what travels under the standard algorithm of each collective: a "
            "ring all-reduce of n bytes sends 2(p-1)/p n, an all-gather of n-byte inputs (p-1) n, a "
            "message n), the mean over the worker ranks (servers excluded: `wire_bytes_workers` where "
            f"a run has server ranks); **{wire_vs(baseline)}** = that / the same of the run's baseline "
            f"run (`--baseline {baseline}`; the one with the same seed and most other config keys). "
            f"In the details: **{PEAK}** = `peak_step_bytes` / 1e6, the most wire bytes any rank "
            f"(servers included) sent in one step, the peak bandwidth a method needs (`{NOT_RECORDED}`: "
            f"a run made before lsgd recorded it), and **{peak_vs(baseline)}** its ratio; "
            f"**{PAYLOAD_VS_DENSE}** = the payload a worker handed to collectives and sends "
            "(`comm_bytes`, over the same ranks) / that of the experiment's dense run (`ddp` or "
            "`algo.compressor=none`, the same seed where there is one): not what travels (an "
            "all-reduce's tensor counts once, a gossip message once per neighbour), so it is no "
            "ratio of wire bytes."
        ),
        (
            "- **Wall time** is measured on the machine that ran the job. **Modeled time** is the "
            "cluster clock (`lsgd/clock/`): the slowest worker's virtual time on the modeled cluster "
            "(named above, from each run's config: compute from `cluster.*`, a FLOP profile of the "
            "target device at its MFU, or `cluster.step_time_s`, or measured; workers per node; the "
            "inter-node link `network.*`), communication at its alpha-beta cost, overlapped where the "
            "algorithm overlaps it; modeled @1 / @10 Gbps is the same clock with the inter-node link "
            "of the `network=1gbps` / `network=10gbps` preset (1 Gbps at 50 us latency, 10 Gbps at "
            "10 us). (Runs recorded before the clock show measured compute plus the cost of every "
            "collective.)"
        ),
        (
            f"- **Figures.** One line per arm: the mean over its runs, with a band: the {pct} t interval "
            "for n >= 3, the min-max range for n = 2, none for n = 1. Where the seeds' x values differ "
            "(wall time), each run's curve is linearly interpolated onto the union of the runs' x "
            f"values inside the range all of them cover. An arm with fewer than {MIN_CURVE_POINTS} "
            "points in a figure is a dot, not a curve: a warning under the figure names it and the "
            "keys that evaluate (or log) more often."
        ),
        "- Runs without summary.json show status `running` and their progress so far.",
    ]


def _rel(path: Path, start: Path) -> str:
    return Path(os.path.relpath(path, start)).as_posix()


def write_report(
    paths: PathLike | Iterable[PathLike],
    out_dir: PathLike,
    baseline: str = BASELINE_ALGO,
    threshold: float | None = None,
    width: str | None = None,
) -> Path:
    """Write ``out_dir/report.md`` comparing the runs in ``paths``, with figures in ``out_dir/figures``,
    and ``out_dir/report.html``, the same report as one self-contained page (tables, and the
    figures embedded as base64 PNG: :func:`lsgd.analysis.html_page.markdown_to_html`) to open in a
    browser or send as one file. Both are written atomically (:func:`lsgd.core.files.write_atomic`).

    The report says once what produced its runs (:func:`lsgd.analysis.environment.environment_note`: the shared torch,
    commit and CPU capability, or the groups where runs differ), what its modeled numbers model
    (:func:`lsgd.analysis.modeled_cluster.cluster_lines`: the compute, workers per node, links and
    what-if links of each run's config; per arm where the arms differ), states its definitions once
    (:func:`definitions_text`: arms and seeds, the interval, T, speedup, bytes, wall and modeled
    time, the figures' bands), then per experiment:
    the number of runs and arms and the config keys that differ (seeds included); the threshold T;
    the main table (:func:`lsgd.analysis.formats.format_main_table`: one row per arm, ``mean ± half-width`` and n);
    links to its LaTeX version and the CSV files; the detailed table (:func:`lsgd.analysis.formats.format_table`);
    notes on runs that did not complete; the "accuracy vs effective batch" table when the runs
    differ in effective batch (:func:`lsgd.analysis.tables.batch_scaling_table`); the environment table
    (:func:`lsgd.analysis.environment.environment_table`, when some run has ``environment.json``), after a line naming
    the groups when the runs differ in torch, commit or CPU capability; and the figures of
    :func:`lsgd.analysis.plots.plot_runs` (PNG embedded, SVG linked, relative links), the
    modeled-time figures' captions naming the modeled cluster, and under each figure that draws an
    arm with fewer than 3 points a warning naming the arms and the keys to change
    (:func:`lsgd.analysis.plots.sparse_curve_message`), also issued as a
    :class:`lsgd.analysis.plots.SparseCurveWarning` (stderr).

    Files next to report.md, per experiment ``<name>`` (:func:`lsgd.analysis.plots.safe_name`):
    ``<name>_main.tex`` (the main table, booktabs, :func:`lsgd.analysis.formats.latex_table`),
    ``<name>_arms.csv`` (``ExperimentTable.arms``:
    every column's mean, interval half-width, sd, n, min and max per arm) and ``<name>_runs.csv``
    (``ExperimentTable.table``: one row per run).

    Args:
        paths: a run folder, a folder containing run folders at any depth, or a list of these.
        out_dir: output folder (created if missing).
        baseline: the runs the speedups are relative to: an ``algo.name`` (default ``ddp``), an
            arm label (``"local SGD, H=8"``) or ``key=value`` pairs joined by commas.
        threshold: T for every experiment, in its metric's unit (test accuracy in [0, 1], or test
            perplexity); None: from each experiment's runs (:mod:`lsgd.analysis.tables`).
        width: the figures' size: None (the default, 7 x 4.5 in) or a paper width, ``"one"``
            (3.25 in) / ``"two"`` (6.75 in) columns (:func:`lsgd.analysis.plots.plot_runs`).

    Returns:
        The path of report.md.

    Raises:
        FileNotFoundError: a path does not exist or holds no run folder.
        ValueError: no paths, an unreadable run file, or an unknown ``width``.
    """
    check_width(width)
    out_dir = Path(out_dir)
    runs = read_runs(paths)
    records, summaries = runs_frame(runs), summaries_frame(runs)
    out_dir.mkdir(parents=True, exist_ok=True)
    sparse: dict[str, dict[str, str]] = {}
    figures = plot_frames(records, summaries, out_dir / FIGURES_DIR, compression_frame(runs), width=width,
                          sparse=sparse)  # fmt: skip
    tables = tables_from_frames(records, summaries, baseline=baseline, threshold=threshold)
    arm_of = {}  # run_dir -> (experiment, arm as the tables name it), in the tables' order
    for name, t in tables.items():
        rank = {(a, st): i for i, (a, st) in enumerate(zip(t.arms["arm"], t.arms["status"]))}
        runs_in_order = sorted(zip(t.table["run_dir"], t.table["arm"], t.table["status"]),
                               key=lambda r, rank=rank: rank.get((r[1], r[2]), len(rank)))  # fmt: skip
        for d, a, st in runs_in_order:
            arm_of[d] = (name, a if st == "completed" else f"{a} ({st})")
    clusters = cluster_groups(summaries)

    given = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    lines = [
        "# lsgd report",
        "",
        (
            f"Runs from {', '.join(f'`{p}`' for p in given)}: {len(summaries)} run{'s' if len(summaries) != 1 else ''} "
            f"in {len(tables)} experiment{'s' if len(tables) != 1 else ''}."
        ),
        "",
        environment_note(summaries),
        "",
        *cluster_lines(summaries, arm_of),
        "",
        *definitions_text(baseline),
    ]
    for name, t in tables.items():
        n_completed = int((t.table["status"] == "completed").sum())
        files = {key: out_dir / pattern.format(name=safe_name(name))
                 for key, pattern in (("tex", LATEX_FILE), ("arms", ARMS_CSV), ("runs", RUNS_CSV))}  # fmt: skip
        main = format_main_table(t)
        files["tex"].write_text(latex_table(main, caption=f"{name}: mean {PM.strip()} {CONFIDENCE:.0%} t interval over seeds (n runs).",
                                            label=f"tab:{safe_name(name)}"))  # fmt: skip
        t.arms.to_csv(files["arms"], index=False)
        t.table.to_csv(files["runs"], index=False)
        lines += [
            "",
            f"## {name}",
            "",
            *_differences_text(t),
            "",
            _threshold_text(t, n_completed),
            "",
            markdown_table(main),
            "",
            (
                f"LaTeX (booktabs): [{files['tex'].name}]({_rel(files['tex'], out_dir)}); every number per arm "
                f"(mean, interval, sd, n, min, max): [{files['arms'].name}]({_rel(files['arms'], out_dir)}); "
                f"per run: [{files['runs'].name}]({_rel(files['runs'], out_dir)})."
            ),
            "",
            "### Details",
            "",
            markdown_table(format_table(t)),
        ]
        notes = [
            f"- `{row.run_id}`: {row.status}"
            + (" (no summary.json yet)" if row.status == RUNNING else "")
            + (f": {row.error}" if isinstance(row.error, str) and row.error else "")
            for row in summaries[summaries["experiment_name"] == name]
            .reindex(columns=["run_id", "status", "error"])
            .itertuples()
            if row.status != "completed"
        ]
        if notes:
            lines += ["", "Runs that did not complete:", "", *notes]
        if t.batch_scaling is not None:
            what = "accuracy" if t.metric == "test_acc" else "perplexity"
            exp_summ = summaries[summaries["experiment_name"] == name]
            ci, n = (batch_scaling_table(exp_summ, t.metric, stat=st) for st in ("ci", "n"))
            lines += [
                "",
                f"### {what} vs effective batch",
                "",
                (
                    f"Final test {what} of the completed runs (mean {PM.strip()} interval over the runs "
                    "with the same method and effective batch, n of them); columns: effective batch = "
                    "`batch_size` x world size."
                ),
                "",
                markdown_table(format_batch_scaling(t.batch_scaling, exp_summ, ci=ci, n=n)),
            ]
        exp_summ = summaries[summaries["experiment_name"] == name]
        if has_environment(exp_summ):
            lines += ["", "### Environment", ""]
            if environment_differences(exp_summ):
                lines += [environment_note(exp_summ), ""]
            lines += [
                ("What produced the runs (environment.json): commit (`+dirty`: the tree had changes), "
                 "versions, torch's CPU capability, CPU, GPU (of CUDA runs); `-`: not recorded."),
                "",
                markdown_table(environment_table(exp_summ)),
            ]
        if figures.get(name):
            lines += ["", "### Figures", ""]
            on = arm_cluster_texts(clusters, arm_of, experiment=name)
            on_text = (f"Modeled cluster: {on[0][0]}." if len(on) == 1 else
                       "Modeled clusters: " + "; ".join(f"{arms}: {text}" for text, arms in on) + ".")  # fmt: skip
            for title, fig_files in figures[name].items():
                by = {p.suffix: p for p in fig_files}
                links = " · ".join(f"[{ext[1:].upper()}]({_rel(by[ext], out_dir)})" for ext in (".svg", ".pdf") if ext in by)
                modeled = f" {on_text}" if "modeled time" in title else ""
                lines += [f"![{title}]({_rel(by['.png'], out_dir)})", "",
                          f"*{name}: {title}.*{modeled} {links}", ""]
                note = sparse.get(name, {}).get(title)
                if note:
                    lines += [f"**Warning:** {note}", ""]
                    warnings.warn(f"{name}: {note}", SparseCurveWarning, stacklevel=2)
    text = "\n".join(lines).rstrip() + "\n"
    write_atomic(out_dir / HTML_FILE, markdown_to_html(text, out_dir))
    report = out_dir / REPORT_FILE
    write_atomic(report, text)
    return report
