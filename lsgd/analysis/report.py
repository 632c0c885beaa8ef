"""Markdown report: one comparison table per experiment, with the figures of :mod:`lsgd.analysis.plots`.

Speedup vs DDP, per experiment ("set" of runs):

- threshold T = the lowest final test accuracy among the set's completed runs (for language
  models: the highest final test perplexity),
- a run's time to T = ``wall_time_s`` (and ``modeled_time_s``) of its first evaluation record with
  ``test_acc >= T`` (``test_ppl <= T``),
- speedup = DDP's time to T / the run's time to T, on wall time and on modeled time. With several
  ``ddp`` runs in the set (seeds), DDP's time to T is the mean over those that reached T.
  Missing (n/a) when the set has no completed run, no ddp run that reached T, or the run never
  reached T.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from lsgd.analysis.load import (
    RUNNING,
    PathLike,
    differing_keys,
    format_value,
    read_runs,
    runs_frame,
    summaries_frame,
)
from lsgd.analysis.plots import eval_metric, plot_frames

#: ``algo.name`` of the baseline the speedups are relative to.
BASELINE_ALGO = "ddp"

REPORT_FILE = "report.md"
FIGURES_DIR = "figures"


def time_to_threshold(
    records: pd.DataFrame, threshold: float, metric: str = "test_acc", time_col: str = "wall_time_s"
) -> float:
    """``time_col`` of the first record (in order) whose ``metric`` reaches ``threshold``.

    "Reaches" is ``>=`` for accuracies and ``<=`` for ``test_ppl`` and ``*_loss`` metrics.

    Args:
        records: metrics records of one run (rows of :func:`lsgd.analysis.load_runs`).
        threshold: value to reach, in the metric's unit (``test_acc`` in [0, 1]).
        metric: eval metric column, ``test_acc`` or ``test_ppl``.
        time_col: ``wall_time_s`` or ``modeled_time_s`` (seconds), or ``step``, ``comm_bytes``...

    Returns:
        The value of ``time_col`` there (seconds for the time columns), NaN if never reached,
        if ``threshold`` is NaN, or if a column is missing.
    """
    if threshold is None or not math.isfinite(threshold) or metric not in records or time_col not in records:
        return math.nan
    values = records[metric]
    hit = values <= threshold if (metric == "test_ppl" or metric.endswith("loss")) else values >= threshold
    hit = hit & values.notna() & records[time_col].notna()
    if not hit.any():
        return math.nan
    return float(records.loc[hit, time_col].iloc[0])


@dataclass
class ExperimentTable:
    """The comparison of one experiment's runs.

    Attributes:
        experiment: ``experiment_name``.
        metric: ``"test_acc"`` or ``"test_ppl"``.
        threshold: T (see the module docstring); None if the set has no completed run with a final
            value of ``metric``.
        baseline_runs: run_ids of the ``ddp`` runs.
        keys: the config keys that differ between the runs (label columns of ``table``).
        table: one row per run, numbers as floats (NaN where n/a). Columns: ``run_id``, ``run_dir``,
            ``algo``, the differing keys other than ``algo.name``, ``status``,
            ``final_<metric>``, ``best_<metric>``, ``gb_sent_per_worker`` (comm_bytes / 1e9),
            ``comm_rounds``, ``wall_time_s``, ``modeled_time_s`` (s), ``time_to_T_wall_s``,
            ``time_to_T_modeled_s`` (s), ``speedup_wall``, ``speedup_modeled``, and, when a run
            has a target, ``target_acc``, ``time_to_target_s``, ``modeled_time_to_target_s`` (s).
    """

    experiment: str
    metric: str
    threshold: float | None
    baseline_runs: list[str]
    keys: list[str]
    table: pd.DataFrame


def _num(value) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return math.nan
    return out


def _speedup(base: float, t: float) -> float:
    if math.isfinite(base) and math.isfinite(t) and t > 0:
        return base / t
    return math.nan


def experiment_table(experiment: str, records: pd.DataFrame, summaries: pd.DataFrame) -> ExperimentTable:
    """The :class:`ExperimentTable` of one experiment from its load_runs / load_summaries rows."""
    keys = differing_keys(summaries)
    metric = eval_metric(records)
    if metric is None:
        has_ppl = "final_test_ppl" in summaries and summaries["final_test_ppl"].notna().any()
        has_acc = "final_test_acc" in summaries and summaries["final_test_acc"].notna().any()
        metric = "test_ppl" if has_ppl and not has_acc else "test_acc"
    higher_better = metric == "test_acc"
    pick_best = max if higher_better else min

    rows = []
    run_records = {d: records[records["run_dir"] == d] for d in summaries["run_dir"]}
    for _, s in summaries.iterrows():
        r = run_records[s["run_dir"]]
        evals = r[metric].dropna() if metric in r else pd.Series(dtype=float)
        final = _num(s.get(f"final_{metric}"))
        if math.isnan(final) and len(evals):
            final = float(evals.iloc[-1])
        best = _num(s.get(f"best_{metric}"))
        if math.isnan(best) and len(evals):
            best = float(pick_best(evals))
        row = {"run_id": s["run_id"], "run_dir": s["run_dir"], "algo": s.get("algo.name", s.get("algo"))}
        row.update({k: s[k] for k in keys if k != "algo.name"})
        row.update(
            status=s["status"],
            **{f"final_{metric}": final, f"best_{metric}": best},
            gb_sent_per_worker=_num(s.get("comm_bytes")) / 1e9,
            comm_rounds=_num(s.get("comm_rounds")),
            wall_time_s=_num(s.get("wall_time_s")),
            modeled_time_s=_num(s.get("modeled_time_s")),
        )
        target = _num(s.get("target_acc", s.get("summary.target_acc")))
        if not math.isnan(target) or not math.isnan(_num(s.get("time_to_target_s"))):
            row.update(
                target_acc=target,
                time_to_target_s=_num(s.get("time_to_target_s")),
                modeled_time_to_target_s=_num(s.get("modeled_time_to_target_s")),
            )
        rows.append(row)
    table = pd.DataFrame(rows)

    finals = table.loc[table["status"] == "completed", f"final_{metric}"].dropna()
    threshold = float(finals.min() if higher_better else finals.max()) if len(finals) else None
    for col, time_col in (("wall", "wall_time_s"), ("modeled", "modeled_time_s")):
        table[f"time_to_T_{col}_s"] = [
            time_to_threshold(run_records[d], threshold, metric, time_col) if threshold is not None else math.nan
            for d in table["run_dir"]
        ]
    is_base = table["algo"] == BASELINE_ALGO
    for col in ("wall", "modeled"):
        base_times = table.loc[is_base, f"time_to_T_{col}_s"].dropna()
        base = float(base_times.mean()) if len(base_times) else math.nan
        table[f"speedup_{col}"] = [_speedup(base, t) for t in table[f"time_to_T_{col}_s"]]
    # the target columns (if any) last
    target_cols = [c for c in ("target_acc", "time_to_target_s", "modeled_time_to_target_s") if c in table]
    table = table[[c for c in table.columns if c not in target_cols] + target_cols]
    return ExperimentTable(
        experiment=str(experiment),
        metric=metric,
        threshold=threshold,
        baseline_runs=[str(x) for x in table.loc[is_base, "run_id"]],
        keys=keys,
        table=table,
    )


def tables_from_frames(records: pd.DataFrame, summaries: pd.DataFrame) -> dict[str, ExperimentTable]:
    """:func:`experiment_tables` on frames already loaded."""
    out = {}
    for experiment, summ in summaries.groupby("experiment_name", sort=True):
        summ = summ.copy()
        summ.attrs = dict(summaries.attrs)
        recs = records[records["experiment_name"] == experiment]
        out[str(experiment)] = experiment_table(str(experiment), recs, summ)
    return out


def experiment_tables(paths: PathLike | Iterable[PathLike]) -> dict[str, ExperimentTable]:
    """``{experiment_name: ExperimentTable}`` for the runs in ``paths`` (the numbers of the report).

    Raises:
        FileNotFoundError: a path does not exist or holds no run folder.
        ValueError: no paths, or an unreadable run file.
    """
    runs = read_runs(paths)
    return tables_from_frames(runs_frame(runs), summaries_frame(runs))


# -- markdown -------------------------------------------------------------------------------------
def _fmt(value, digits: str) -> str:
    x = _num(value)
    return "n/a" if math.isnan(x) else format(x, digits)


def markdown_table(frame: pd.DataFrame) -> str:
    """``frame`` (cells already strings) as a GitHub-flavoured Markdown table, ``|`` escaped.

    Uses :meth:`pandas.DataFrame.to_markdown` when ``tabulate`` is installed, else a plain writer.
    """
    cells = pd.DataFrame(
        {str(c).replace("|", "\\|"): frame[c].astype(str).str.replace("|", "\\|").str.replace("\n", " ") for c in frame.columns}
    )
    try:
        return cells.to_markdown(index=False, disable_numparse=True)
    except ImportError:
        pass
    header = list(cells.columns)
    body = cells.values.tolist()
    widths = [max([len(h)] + [len(row[i]) for row in body]) for i, h in enumerate(header)]

    def line(values):
        return "| " + " | ".join(v.ljust(w) for v, w in zip(values, widths)) + " |"

    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, body)])


def format_table(t: ExperimentTable) -> pd.DataFrame:
    """The report's view of ``t.table``: readable headers, formatted numbers, ``n/a`` for missing."""
    m = "test acc" if t.metric == "test_acc" else "test ppl"
    acc_digits = ".4f" if t.metric == "test_acc" else ".2f"
    src = t.table
    out = pd.DataFrame({"run": src["run_id"].astype(str), "algo": src["algo"].map(format_value)})
    for k in t.keys:
        if k != "algo.name":
            out[k] = src[k].map(format_value)
    out["status"] = src["status"].astype(str)
    out[f"final {m}"] = src[f"final_{t.metric}"].map(lambda v: _fmt(v, acc_digits))
    out[f"best {m}"] = src[f"best_{t.metric}"].map(lambda v: _fmt(v, acc_digits))
    out["GB sent / worker"] = src["gb_sent_per_worker"].map(lambda v: _fmt(v, ".4g"))
    out["comm rounds"] = src["comm_rounds"].map(lambda v: _fmt(v, ".0f"))
    out["wall time (s)"] = src["wall_time_s"].map(lambda v: _fmt(v, ".1f"))
    out["modeled time (s)"] = src["modeled_time_s"].map(lambda v: _fmt(v, ".1f"))
    out["time to T, wall (s)"] = src["time_to_T_wall_s"].map(lambda v: _fmt(v, ".1f"))
    out["time to T, modeled (s)"] = src["time_to_T_modeled_s"].map(lambda v: _fmt(v, ".1f"))
    out["speedup vs ddp, wall"] = src["speedup_wall"].map(lambda v: _fmt(v, ".2f"))
    out["speedup vs ddp, modeled"] = src["speedup_modeled"].map(lambda v: _fmt(v, ".2f"))
    if "time_to_target_s" in src:
        out["target acc"] = src["target_acc"].map(lambda v: _fmt(v, ".4f"))
        out["time to target, wall (s)"] = src["time_to_target_s"].map(lambda v: _fmt(v, ".1f"))
        out["time to target, modeled (s)"] = src["modeled_time_to_target_s"].map(lambda v: _fmt(v, ".1f"))
    return out


def _threshold_text(t: ExperimentTable, n_completed: int) -> str:
    name, cmp, which = (
        ("test accuracy", ">=", "lowest") if t.metric == "test_acc" else ("test perplexity", "<=", "highest")
    )
    if t.threshold is None:
        return f"No completed run with a final {name}: no threshold, speedups n/a."
    digits = ".4f" if t.metric == "test_acc" else ".2f"
    base = (
        f"the mean over the {len(t.baseline_runs)} `{BASELINE_ALGO}` runs"
        if len(t.baseline_runs) > 1
        else f"the `{BASELINE_ALGO}` run"
        if t.baseline_runs
        else f"n/a: no `{BASELINE_ALGO}` run in this experiment"
    )
    return (
        f"Threshold T = {format(t.threshold, digits)}, the {which} final {name} among the "
        f"{n_completed} completed runs. Time to T: `wall_time_s` / `modeled_time_s` at the first "
        f"evaluation with `{t.metric} {cmp} T`. Speedup = time to T of {base} / time to T of the run "
        f"(n/a where T was not reached)."
    )


def _rel(path: Path, start: Path) -> str:
    return Path(os.path.relpath(path, start)).as_posix()


def write_report(paths: PathLike | Iterable[PathLike], out_dir: PathLike) -> Path:
    """Write ``out_dir/report.md`` comparing the runs in ``paths``, with figures in ``out_dir/figures``.

    Per experiment: a table with one row per run (run_id, ``algo.name`` and the other config keys
    that differ between the runs, status, final and best test accuracy, or perplexity for
    language models, GB sent per worker = ``comm_bytes`` / 1e9, comm rounds, wall and modeled
    time in seconds, time to the threshold T and speedup vs ``ddp`` on wall and modeled time, see
    the module docstring; and the target columns when runs have ``target_acc``), notes on runs
    that did not complete, and the figures of :func:`lsgd.analysis.plots.plot_runs` (PNG embedded,
    SVG linked, relative links).

    Args:
        paths: a run folder, a folder containing run folders at any depth, or a list of these.
        out_dir: output folder (created if missing).

    Returns:
        The path of report.md.

    Raises:
        FileNotFoundError: a path does not exist or holds no run folder.
        ValueError: no paths, or an unreadable run file.
    """
    out_dir = Path(out_dir)
    runs = read_runs(paths)
    records, summaries = runs_frame(runs), summaries_frame(runs)
    out_dir.mkdir(parents=True, exist_ok=True)
    figures = plot_frames(records, summaries, out_dir / FIGURES_DIR)
    tables = tables_from_frames(records, summaries)

    given = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    lines = [
        "# lsgd report",
        "",
        f"Runs from {', '.join(f'`{p}`' for p in given)}: {len(summaries)} run{'s' if len(summaries) != 1 else ''} "
        f"in {len(tables)} experiment{'s' if len(tables) != 1 else ''}.",
        "",
        "GB sent / worker = `comm_bytes` / 1e9 (payload bytes one worker handed to collectives). "
        "Wall time is measured; modeled time is measured compute plus the alpha-beta cost of each "
        "collective on the configured network. Runs without summary.json show status `running` "
        "and their progress so far.",
    ]
    for name, t in tables.items():
        n_completed = int((t.table["status"] == "completed").sum())
        lines += ["", f"## {name}", "", _threshold_text(t, n_completed), "", markdown_table(format_table(t))]
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
        if figures.get(name):
            lines += ["", "### Figures", ""]
            for title, files in figures[name].items():
                png = next(p for p in files if p.suffix == ".png")
                svg = next(p for p in files if p.suffix == ".svg")
                lines += [f"![{title}]({_rel(png, out_dir)})", f"[{title} (SVG)]({_rel(svg, out_dir)})", ""]
    path = out_dir / REPORT_FILE
    path.write_text("\n".join(lines).rstrip() + "\n")
    return path
