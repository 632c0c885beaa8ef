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

Communication, per run:

- bytes vs dense = the run's ``comm_bytes`` / ``comm_bytes`` of the experiment's dense baseline
  (a run with ``algo.name == "ddp"`` or ``algo.compressor == "none"``; a dense run is its own
  baseline; among several, the one that matches the run on the most differing non-``algo.*``
  config keys, then a completed one, then the first). n/a when the experiment has no dense run.
- modeled time at 1 and 10 Gbps = the cluster clock's what-if entries ``modeled_time_1gbps_s``,
  ``modeled_time_10gbps_s`` (the same run's events priced with that inter-node bandwidth, overlap
  and waiting included; :mod:`lsgd.comm`), from summary.json, else from the last metrics record.
  Runs recorded before the cluster clock fall back to ``compute_time_s`` + ``NetworkModel(
  bandwidth_gbps, network.latency_us or 10).cost(model_alpha_terms, model_beta_bytes)`` (no
  overlap); blank for runs that lack those keys.

Batch scaling (:func:`batch_scaling_table`): when an experiment's runs differ in effective batch
(``batch_size`` x world size), final test accuracy (perplexity) per method and effective batch.
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
    _hashable,
    _is_missing,
    _num,
    compression_frame,
    differing_keys,
    format_value,
    read_runs,
    runs_frame,
    summaries_frame,
    world_sizes,
)
from lsgd.analysis.plots import eval_metric, plot_frames

#: ``algo.name`` of the baseline the speedups are relative to.
BASELINE_ALGO = "ddp"

REPORT_FILE = "report.md"
FIGURES_DIR = "figures"

#: Bandwidths (Gbps) of the report's modeled-time columns (``modeled_1gbps_s``, ``modeled_10gbps_s``).
REPORT_BANDWIDTHS_GBPS = (1.0, 10.0)

#: Latency (us) of the modeled-time columns for a run whose config has no ``network.latency_us``.
DEFAULT_LATENCY_US = 10.0


def modeled_time_column(bandwidth_gbps: float) -> str:
    """Table column of the modeled time at ``bandwidth_gbps``: ``modeled_1gbps_s``, ``modeled_10gbps_s``."""
    return f"modeled_{format_value(bandwidth_gbps)}gbps_s"


def modeled_time_at(
    compute_time_s: float, alpha_terms: float, beta_bytes: float, bandwidth_gbps: float, latency_us: float
) -> float:
    """Seconds of a run on another network: measured ``compute_time_s`` + the alpha-beta cost
    ``alpha_terms`` latencies + ``beta_bytes`` bytes (:meth:`lsgd.comm.NetworkModel.cost`).
    NaN if an argument is missing."""
    values = [_num(v) for v in (compute_time_s, alpha_terms, beta_bytes, bandwidth_gbps, latency_us)]
    if not all(math.isfinite(v) for v in values):
        return math.nan
    from lsgd.comm import NetworkModel  # imports torch: only when needed

    compute, a, b, bw, lat = values
    return compute + NetworkModel(bandwidth_gbps=bw, latency_us=lat).cost(a, b)


def is_dense_baseline(row) -> bool:
    """Whether a summaries row (or mapping) is a dense run: ``algo.name == "ddp"`` or
    ``algo.compressor == "none"``."""
    name = row.get("algo.name", row.get("algo"))
    return name == BASELINE_ALGO or row.get("algo.compressor") == "none"


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
            ``final_<metric>``, ``best_<metric>``, ``final_test_loss`` (the last evaluation's),
            ``final_train_loss`` (the last record's: mean training loss of the workers' minibatches
            since the record before), ``gb_sent_per_worker`` (comm_bytes / 1e9), ``comm_rounds``,
            ``samples`` (training samples of all workers), ``wall_time_s``, ``modeled_time_s`` (s), ``time_to_T_wall_s``,
            ``time_to_T_modeled_s`` (s), ``speedup_wall``, ``speedup_modeled``, and, when a run
            has a target, ``target_acc``, ``time_to_target_s``, ``modeled_time_to_target_s`` (s).
            Also ``bytes_vs_dense`` (comm_bytes / the dense baseline's, see the module docstring),
            ``dense_run`` (that baseline's run_id), ``floats_sent`` (comm_bytes / 4, per worker)
            after ``gb_sent_per_worker``, and ``modeled_1gbps_s``, ``modeled_10gbps_s`` (s) after
            ``modeled_time_s``.
        batch_scaling: :func:`batch_scaling_table` of the experiment when its runs differ in
            effective batch, else None.
    """

    experiment: str
    metric: str
    threshold: float | None
    baseline_runs: list[str]
    keys: list[str]
    table: pd.DataFrame
    batch_scaling: pd.DataFrame | None = None


def _speedup(base: float, t: float) -> float:
    if math.isfinite(base) and math.isfinite(t) and t > 0:
        return base / t
    return math.nan


def _network_terms(s: pd.Series, last: pd.Series | None) -> tuple[float, float, float]:
    """``(compute_time_s, model_alpha_terms, model_beta_bytes)`` of a run: from its summary when
    that has the alpha-beta terms, else from its last metrics record, else NaNs."""
    for src in (s, last):
        if src is None:
            continue
        a, b = _num(src.get("model_alpha_terms")), _num(src.get("model_beta_bytes"))
        if math.isfinite(a) and math.isfinite(b):
            return _num(src.get("compute_time_s")), a, b
    return math.nan, math.nan, math.nan


def _clock_time_at(s: pd.Series, last: pd.Series | None, bw: float, compute: float, alpha_terms: float,
                   beta_bytes: float, latency: float) -> float:
    """The run's modeled time at inter-node bandwidth ``bw``: the clock's what-if entry
    ``modeled_time_<bw>gbps_s`` (summary, else last record), else the pre-clock formula."""
    key = f"modeled_time_{bw:g}gbps_s"
    for src in (s, last):
        if src is not None and math.isfinite(_num(src.get(key))):
            return _num(src.get(key))
    return modeled_time_at(compute, alpha_terms, beta_bytes, bw, latency)


def _dense_baselines(summaries: pd.DataFrame, keys: list[str]) -> dict[str, str | None]:
    """``{run_dir: run_dir of its dense baseline or None}`` (see the module docstring)."""
    rows = [s for _, s in summaries.iterrows()]
    dense = [s for s in rows if is_dense_baseline(s)]
    other = [k for k in keys if not k.startswith("algo.") and k in summaries.columns]
    out: dict[str, str | None] = {}
    for s in rows:
        if not dense:
            out[s["run_dir"]] = None
            continue
        if is_dense_baseline(s):
            out[s["run_dir"]] = s["run_dir"]
            continue

        def rank(i_c, s=s):
            i, c = i_c
            score = sum(_hashable(c[k]) == _hashable(s[k]) for k in other)
            return (score, c["status"] == "completed", -i)

        out[s["run_dir"]] = max(enumerate(dense), key=rank)[1]["run_dir"]
    return out


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
    dense_of = _dense_baselines(summaries, keys)
    by_dir = summaries.set_index("run_dir", drop=False)
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
        comm_bytes = _num(s.get("comm_bytes"))
        dense = dense_of[s["run_dir"]]
        dense_bytes = _num(by_dir.loc[dense].get("comm_bytes")) if dense is not None else math.nan
        last = r.iloc[-1] if len(r) else None
        compute, alpha_terms, beta_bytes = _network_terms(s, last)
        latency = _num(s.get("network.latency_us"))
        latency = latency if math.isfinite(latency) else DEFAULT_LATENCY_US
        test_loss = _num(s.get("final_test_loss"))
        if math.isnan(test_loss) and "test_loss" in r and r["test_loss"].notna().any():
            test_loss = float(r["test_loss"].dropna().iloc[-1])
        train_losses = r["train_loss"].dropna() if "train_loss" in r else pd.Series(dtype=float)
        row.update(
            status=s["status"],
            **{f"final_{metric}": final, f"best_{metric}": best},
            final_test_loss=test_loss,
            final_train_loss=float(train_losses.iloc[-1]) if len(train_losses) else math.nan,
            gb_sent_per_worker=comm_bytes / 1e9,
            floats_sent=comm_bytes / 4,
            bytes_vs_dense=comm_bytes / dense_bytes if dense_bytes > 0 else math.nan,
            dense_run=str(by_dir.loc[dense, "run_id"]) if dense is not None else None,
            comm_rounds=_num(s.get("comm_rounds")),
            samples=_num(s.get("samples")),
            wall_time_s=_num(s.get("wall_time_s")),
            modeled_time_s=_num(s.get("modeled_time_s")),
            **{
                modeled_time_column(bw): _clock_time_at(s, last, bw, compute, alpha_terms, beta_bytes, latency)
                for bw in REPORT_BANDWIDTHS_GBPS
            },
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
    batches = effective_batch(summaries).dropna()
    return ExperimentTable(
        experiment=str(experiment),
        metric=metric,
        threshold=threshold,
        baseline_runs=[str(x) for x in table.loc[is_base, "run_id"]],
        keys=keys,
        table=table,
        batch_scaling=batch_scaling_table(summaries, metric) if batches.nunique() > 1 else None,
    )


# -- batch scaling --------------------------------------------------------------------------------
def effective_batch(summaries: pd.DataFrame) -> pd.Series:
    """Effective (global) batch of each run: config ``batch_size`` x :func:`world_sizes` (NaN if unknown)."""
    if "batch_size" not in summaries:
        return pd.Series(math.nan, index=summaries.index, dtype=float)
    return summaries["batch_size"].map(_num) * world_sizes(summaries)


def method_labels(summaries: pd.DataFrame) -> pd.Series:
    """Method of each run for :func:`batch_scaling_table`: ``algo.name``, with ``algo.target`` for
    adasum (``adasum (delta)``), and ``, lr_scaling=<rule>`` when ``optim.lr_scaling`` differs
    between the runs."""
    names = summaries["algo.name"] if "algo.name" in summaries else summaries.get("algo")
    if names is None:
        names = pd.Series("", index=summaries.index)
    scaling = summaries.get("optim.lr_scaling")
    with_scaling = scaling is not None and scaling.map(_hashable).nunique(dropna=False) > 1
    labels = []
    for i, name in names.items():
        label = format_value(name)
        target = summaries.at[i, "algo.target"] if "algo.target" in summaries else None
        if label == "adasum" and not _is_missing(target):
            label += f" ({format_value(target)})"
        if with_scaling:
            label += f", lr_scaling={format_value(scaling[i]) or 'none'}"
        labels.append(label)
    return pd.Series(labels, index=summaries.index, dtype=object)


def batch_scaling_table(
    summaries: pd.DataFrame, metric: str | None = None, completed_only: bool = True
) -> pd.DataFrame:
    """Final test accuracy (or perplexity) per method and effective batch: the Adasum study table.

    Args:
        summaries: :func:`lsgd.analysis.load_summaries` rows (usually one experiment's).
        metric: ``"test_acc"`` or ``"test_ppl"``; None: ``test_acc`` if any run has a
            ``final_test_acc``, else ``test_ppl`` (language models).
        completed_only: use only runs with status ``completed``.

    Returns:
        One row per method (index ``method``, see :func:`method_labels`, sorted), one column per
        effective batch = ``batch_size`` x world size (ints, ascending; :func:`effective_batch`),
        cells the final ``metric`` (``final_test_acc`` in [0, 1] or ``final_test_ppl``), the mean
        over runs with the same method and effective batch (seeds); NaN where no such run. Runs
        with an unknown effective batch are left out. ``attrs["metric"]`` is the metric used.
    """
    if metric is None:
        has_acc = "final_test_acc" in summaries and summaries["final_test_acc"].map(_num).notna().any()
        metric = "test_acc" if has_acc or "final_test_ppl" not in summaries else "test_ppl"
    col = f"final_{metric}"
    cells = pd.DataFrame(
        {
            "method": method_labels(summaries),
            "batch": effective_batch(summaries),
            "value": summaries[col].map(_num) if col in summaries else math.nan,
            "status": summaries.get("status", "completed"),
        }
    )
    cells = cells[cells["batch"].notna()].copy()
    cells["batch"] = cells["batch"].map(lambda b: int(b) if float(b).is_integer() else float(b))
    methods = sorted(cells["method"].unique())
    batches = sorted(cells["batch"].unique())
    if completed_only:
        cells = cells[cells["status"] == "completed"]
    table = cells.groupby(["method", "batch"])["value"].mean().unstack("batch")
    table = table.reindex(index=methods, columns=batches).astype(float)
    table.index.name, table.columns.name = "method", "effective batch"
    table.attrs["metric"] = metric
    return table


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
    out["final test loss"] = src["final_test_loss"].map(lambda v: _fmt(v, ".4f"))
    out["final train loss"] = src["final_train_loss"].map(lambda v: _fmt(v, ".4f"))
    out["GB sent / worker"] = src["gb_sent_per_worker"].map(lambda v: _fmt(v, ".4g"))
    if "bytes_vs_dense" in src:
        out["bytes vs dense"] = src["bytes_vs_dense"].map(lambda v: _fmt(v, ".3g"))
    out["comm rounds"] = src["comm_rounds"].map(lambda v: _fmt(v, ".0f"))
    out["samples"] = src["samples"].map(lambda v: _fmt(v, ".0f"))
    out["wall time (s)"] = src["wall_time_s"].map(lambda v: _fmt(v, ".1f"))
    out["modeled time (s)"] = src["modeled_time_s"].map(lambda v: _fmt(v, ".3g"))
    for bw in REPORT_BANDWIDTHS_GBPS:  # only for runs that log the alpha-beta terms; blank otherwise
        col = modeled_time_column(bw)
        if col in src and src[col].notna().any():
            out[f"modeled @{format_value(bw)} Gbps (s)"] = src[col].map(lambda v: "" if _is_missing(v) else _fmt(v, ".3g"))
    out["time to T, wall (s)"] = src["time_to_T_wall_s"].map(lambda v: _fmt(v, ".1f"))
    out["time to T, modeled (s)"] = src["time_to_T_modeled_s"].map(lambda v: _fmt(v, ".3g"))
    out["speedup vs ddp, wall"] = src["speedup_wall"].map(lambda v: _fmt(v, ".2f"))
    out["speedup vs ddp, modeled"] = src["speedup_modeled"].map(lambda v: _fmt(v, ".2f"))
    if "time_to_target_s" in src:
        out["target acc"] = src["target_acc"].map(lambda v: _fmt(v, ".4f"))
        out["time to target, wall (s)"] = src["time_to_target_s"].map(lambda v: _fmt(v, ".1f"))
        out["time to target, modeled (s)"] = src["modeled_time_to_target_s"].map(lambda v: _fmt(v, ".3g"))
    return out


def format_batch_scaling(table: pd.DataFrame, summaries: pd.DataFrame | None = None) -> pd.DataFrame:
    """The report's view of a :func:`batch_scaling_table`: a ``method`` column, one column per
    effective batch, formatted values; an empty cell shows the status of the runs there that did
    not complete (e.g. ``diverged``) when ``summaries`` is given, else is blank."""
    metric = table.attrs.get("metric", "test_acc")
    digits = ".4f" if metric == "test_acc" else ".2f"
    status: dict[tuple, str] = {}
    if summaries is not None and "status" in summaries:
        cells = pd.DataFrame(
            {"method": method_labels(summaries), "batch": effective_batch(summaries), "status": summaries["status"]}
        )
        for (m, b), st in cells[cells["status"] != "completed"].groupby(["method", "batch"])["status"]:
            status[(m, float(b))] = "/".join(sorted(set(map(str, st))))
    out = pd.DataFrame({"method": [str(m) for m in table.index]})
    for b in table.columns:
        out[format_value(b)] = [
            _fmt(v, digits) if not _is_missing(v) else status.get((m, float(b)), "")
            for m, v in zip(table.index, table[b])
        ]
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
    language models, final test loss and the last record's training loss, GB sent per worker =
    ``comm_bytes`` / 1e9, comm rounds, training samples of all workers, wall and modeled
    time in seconds, time to the threshold T and speedup vs ``ddp`` on wall and modeled time, see
    the module docstring; bytes vs dense; modeled time at 1 and 10 Gbps when runs log the
    alpha-beta terms; and the target columns when runs have ``target_acc``), notes on runs
    that did not complete, the "accuracy vs effective batch" table when the runs differ in
    effective batch (:func:`batch_scaling_table`), and the figures of
    :func:`lsgd.analysis.plots.plot_runs`, the compression figure included (PNG embedded, SVG
    linked, relative links).

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
    figures = plot_frames(records, summaries, out_dir / FIGURES_DIR, compression_frame(runs))
    tables = tables_from_frames(records, summaries)

    given = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    lines = [
        "# lsgd report",
        "",
        (
            f"Runs from {', '.join(f'`{p}`' for p in given)}: {len(summaries)} run{'s' if len(summaries) != 1 else ''} "
            f"in {len(tables)} experiment{'s' if len(tables) != 1 else ''}."
        ),
        "",
        (
            "GB sent / worker = `comm_bytes` / 1e9 (payload bytes a worker handed to collectives and "
            "sends, mean over workers); bytes vs dense = `comm_bytes` / that of the experiment's dense "
            "run (`ddp` or `algo.compressor=none`). Wall time is measured on this machine. Modeled time "
            "is the cluster clock (`lsgd/comm.py`): the slowest worker's virtual time on the configured "
            "cluster, compute from `cluster.*` (a FLOP profile of the target device, or `step_time_s`) "
            "and communication at its alpha-beta cost, overlapped where the algorithm overlaps it; "
            "modeled @1 / @10 Gbps is the same clock with the inter-node link at 1 / 10 Gbps. (Runs "
            "recorded before the clock show measured compute plus the cost of every collective.) "
            "Runs without summary.json show status `running` and their progress so far."
        ),
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
        if t.batch_scaling is not None:
            what = "accuracy" if t.metric == "test_acc" else "perplexity"
            exp_summ = summaries[summaries["experiment_name"] == name]
            lines += [
                "",
                f"### {what} vs effective batch",
                "",
                (
                    f"Final test {what} of the completed runs (mean over runs with the same method and "
                    "effective batch); columns: effective batch = `batch_size` x world size."
                ),
                "",
                markdown_table(format_batch_scaling(t.batch_scaling, exp_summ)),
            ]
        if figures.get(name):
            lines += ["", "### Figures", ""]
            for title, files in figures[name].items():
                png = next(p for p in files if p.suffix == ".png")
                svg = next(p for p in files if p.suffix == ".svg")
                lines += [f"![{title}]({_rel(png, out_dir)})", f"[{title} (SVG)]({_rel(svg, out_dir)})", ""]
    path = out_dir / REPORT_FILE
    path.write_text("\n".join(lines).rstrip() + "\n")
    return path
