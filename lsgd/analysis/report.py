"""The report, as Markdown (report.md) and as one self-contained HTML page (report.html: the same
text, tables and figures embedded, :func:`markdown_to_html`): per experiment, a compact main table
over arms (runs that differ only in seed), a detailed table, CSV files with every number, a LaTeX
version of the main table, and the figures of :mod:`lsgd.analysis.plots`.

Arms and seeds (:mod:`lsgd.analysis.arms`, :mod:`lsgd.analysis.stats`): every number in a table is
the mean over the arm's runs (n, one per seed) with the half-width h of the 95% confidence interval
of that mean, Student t with n - 1 degrees of freedom: h = t_{0.975, n-1} s / sqrt(n), s the sample
standard deviation over the runs; ``m ± h``. An arm with n = 1 shows its value and no interval. A
quantity that some runs lack (a run that never reached T) is averaged over the runs that have it,
and the cell says ``(k of n)``. Runs that did not complete form arms of their own, marked with
their status.

Speedup vs the baseline, per experiment ("set" of runs):

- threshold T = the lowest final test accuracy among the set's completed runs, every seed counted
  (for language models: the highest final test perplexity), so every such run reaches it; runs
  that collapsed are left out: a run collapsed when its final evaluation is worse than its first
  (a blown-up run at chance accuracy would otherwise set T there and make every time to T that of
  the first evaluation). ``threshold`` (``lsgd report --threshold``) gives T instead,
- a run's time to T = ``wall_time_s`` (and ``modeled_time_s``) of its first evaluation record with
  ``test_acc >= T`` (``test_ppl <= T``),
- the baseline = the runs that ``baseline`` selects (:func:`lsgd.analysis.arms.select_runs`:
  ``algo.name`` ``ddp`` by default, or an arm label, or ``key=value`` pairs); its time to T = the
  mean over its runs that reached T,
- a run's speedup = the baseline's time to T / the run's time to T, on wall time and on modeled
  time; an arm's speedup is the mean of its runs' speedups (its interval covers the spread of the
  arm's seeds, the baseline's mean taken as exact). Missing (n/a) when the set has no completed
  run, no baseline run that reached T, or the run never reached T.

Paired differences, per arm: the arm's final metric minus that of the baseline's run of the same
seed, averaged over the seeds both have, with the paired Student t interval
(:func:`lsgd.analysis.paired_differences`); runs of one seed share data order and initialization,
so this interval is narrower than the arms' own intervals and says whether the difference is real
(it excludes 0). Each arm is paired with the completed baseline arm that matches it on the most
differing config keys outside ``algo.*`` (``--baseline`` may select several arms, e.g. ddp at
three batch sizes).

Communication, per run:

- GB on the wire / worker = the bytes one worker puts on the wire (``wire_bytes``: what travels under the
  standard algorithm of each collective, e.g. ``(p-1) n`` for an all-gather of n-byte inputs and
  ``2 (p-1)/p n`` for a ring all-reduce, n for a message), / 1e9, the mean over the worker ranks: a
  run with server ranks (``num_workers`` < ``world_size``: parameter server, asynchronous local SGD,
  ADSAGA) uses ``wire_bytes_workers``, the mean without the servers (n/a for such a run recorded
  before that key existed, whose ``wire_bytes`` averages the servers in). ``floats_sent`` is the
  payload (``comm_bytes``, what papers count as floats x 4) / 4 over the same worker ranks.
- bytes vs dense = the run's payload per worker (``comm_bytes``, over its worker ranks as above) /
  that of the experiment's dense baseline
  (a run with ``algo.name == "ddp"`` or ``algo.compressor == "none"``; a dense run is its own
  baseline; among several, the one that matches the run on the most differing non-``algo.*``
  config keys, then a completed one, then the first). n/a when the experiment has no dense run.
- modeled time at 1 and 10 Gbps = the cluster clock's what-if entries ``modeled_time_1gbps_s``,
  ``modeled_time_10gbps_s`` (the same run's events priced on the inter-node link of the network
  preset of that bandwidth, ``network=1gbps`` / ``network=10gbps``: its bandwidth and its latency,
  50 / 10 us; overlap and waiting included; :mod:`lsgd.clock.network`), from summary.json, else from the
  last metrics record. Runs recorded before the cluster clock fall back to ``compute_time_s`` +
  ``NetworkModel(bandwidth_gbps, latency).cost(model_alpha_terms, model_beta_bytes)`` (no overlap)
  with the same latency (:func:`lsgd.clock.network.what_if_latency_us`; a bandwidth without a preset: the
  run's ``network.latency_us``, else 10 us); blank for runs that lack those keys.

Environment (:func:`environment_table`, :func:`environment_note`): what produced the runs, from
their ``environment.json`` (:mod:`lsgd.training.provenance`): commit (``+dirty``: the tree had changes),
lsgd, torch, torch's CPU capability, CPU, GPU and python, one row per distinct combination with
the runs that share it; a run without the file shows ``-``. When the runs differ in torch version,
commit or CPU capability (their numerics may differ in the last bits), one line says so and names
the groups. The environment never splits an arm.

Batch scaling (:func:`batch_scaling_table`): when an experiment's runs differ in effective batch
(``batch_size`` x world size), final test accuracy (perplexity) per method and effective batch.
"""

from __future__ import annotations

import base64
import html
import math
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from lsgd.analysis.arms import (
    arm_keys,
    arm_labels,
    config_differences,
    order_key,
    seed_keys,
    select_runs,
    written_label_keys,
)
from lsgd.analysis.load import (
    ENV_COLUMNS,
    RUNNING,
    PathLike,
    _hashable,
    _num,
    compression_frame,
    read_runs,
    runs_frame,
    summaries_frame,
    world_sizes,
)
from lsgd.core.labels import BOOL_NAMES, VALUE_ONLY_KEYS, format_value, key_name
from lsgd.core.labels import is_missing as _is_missing
from lsgd.analysis.plots import check_width, eval_metric, plot_frames, safe_name
from lsgd.analysis.stats import CONFIDENCE, aggregate_seeds, paired_differences
from lsgd.clock.network import NetworkModel, what_if_latency_us

#: ``algo.name`` of the default baseline the speedups are relative to (``--baseline`` chooses another).
BASELINE_ALGO = "ddp"

REPORT_FILE = "report.md"
HTML_FILE = "report.html"
FIGURES_DIR = "figures"

#: Header of the tables' bytes column (``gb_sent_per_worker``: wire bytes per worker, workers only).
GB_SENT = "GB on the wire / worker"

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
    ``alpha_terms`` latencies + ``beta_bytes`` bytes (:meth:`lsgd.clock.network.NetworkModel.cost`).
    NaN if an argument is missing."""
    values = [_num(v) for v in (compute_time_s, alpha_terms, beta_bytes, bandwidth_gbps, latency_us)]
    if not all(math.isfinite(v) for v in values):
        return math.nan
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
    """The comparison of one experiment's runs, per run and per arm.

    Attributes:
        experiment: ``experiment_name``.
        metric: ``"test_acc"`` or ``"test_ppl"``.
        threshold: T (see the module docstring); None if the set has no completed run with a final
            value of ``metric`` and none was given.
        threshold_given: True when T was given (``threshold`` of :func:`experiment_table`).
        collapsed_runs: run_ids of the completed runs left out of T because they collapsed (final
            evaluation worse than the first).
        baseline_runs: run_ids of the baseline's runs (``baseline`` selects them).
        keys: the config keys that differ between the arms (seeds excluded; label columns of
            ``table``).
        table: one row per run, numbers as floats (NaN where n/a). Columns: ``run_id``, ``run_dir``,
            ``arm`` (the readable label of the run's arm, :func:`lsgd.analysis.arms.arm_labels`),
            ``seed``, ``algo``, the differing keys other than ``algo.name``, ``status``,
            ``final_<metric>``, ``best_<metric>``, ``final_test_loss`` (the last evaluation's),
            ``final_train_loss`` (the last record's: mean training loss of the workers' minibatches
            since the record before), ``gb_sent_per_worker`` (wire bytes per worker / 1e9, worker
            ranks only: module docstring), ``comm_rounds``,
            ``samples`` (training samples of all workers), ``wall_time_s``, ``modeled_time_s`` (s), ``time_to_T_wall_s``,
            ``time_to_T_modeled_s`` (s), ``speedup_wall``, ``speedup_modeled``, and, when a run
            has a target, ``target_acc``, ``time_to_target_s``, ``modeled_time_to_target_s`` (s).
            Also ``bytes_vs_dense`` (payload per worker / the dense baseline's, see the module
            docstring), ``dense_run`` (that baseline's run_id), ``floats_sent`` (payload / 4, per worker)
            after ``gb_sent_per_worker``, and ``modeled_1gbps_s``, ``modeled_10gbps_s`` (s) after
            ``modeled_time_s``. Last, the run's ``env.*`` columns (``env.commit``, ``env.torch``,
            ``env.cpu_capability``, ...; :func:`lsgd.analysis.load.environment_fields`).
        batch_scaling: :func:`batch_scaling_table` of the experiment when its runs differ in
            effective batch, else None.
        arms: one row per arm and status: :func:`lsgd.analysis.aggregate_seeds` of ``table`` by
            ``arm``, ``algo``, the other differing keys and ``status``: ``n``, ``seeds``,
            ``run_ids``, then ``<column>_mean``, ``_ci`` (half-width of the 95% t interval),
            ``_sd``, ``_n``, ``_min``, ``_max`` for each numeric column of ``table``.
        baseline: the selector the speedups used (``"ddp"`` by default).
        differences: :func:`lsgd.analysis.arms.config_differences` of the runs (what differs,
            seeds included).
        label_keys: the keys written in the arm labels (:func:`lsgd.analysis.arms.written_label_keys`).
    """

    experiment: str
    metric: str
    threshold: float | None
    baseline_runs: list[str]
    keys: list[str]
    table: pd.DataFrame
    batch_scaling: pd.DataFrame | None = None
    arms: pd.DataFrame | None = None
    baseline: str = BASELINE_ALGO
    differences: dict[str, list[str]] | None = None
    label_keys: list[str] | None = None
    threshold_given: bool = False
    collapsed_runs: list[str] = field(default_factory=list)


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
    if not all(math.isfinite(_num(v)) for v in (compute, alpha_terms, beta_bytes)):
        return math.nan
    return modeled_time_at(compute, alpha_terms, beta_bytes, bw, what_if_latency_us(bw, latency))


def worker_bytes(s, last, key: str) -> float:
    """Mean of ``key`` (``comm_bytes`` or ``wire_bytes``) over a run's worker ranks: its
    ``<key>_workers`` (recorded by runs with server ranks; summary, else last record), else ``key``
    when every rank is a worker, else NaN (a server run recorded before ``<key>_workers``: its
    ``key`` averages the servers in)."""
    for src in (s, last):
        if src is not None and math.isfinite(_num(src.get(f"{key}_workers"))):
            return _num(src.get(f"{key}_workers"))
    workers = _num(s.get("num_workers"))
    world = _num(s.get("summary.world_size", s.get("world_size")))
    if math.isfinite(workers) and math.isfinite(world) and workers < world:
        return math.nan
    return _num(s.get(key))


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


def experiment_table(
    experiment: str,
    records: pd.DataFrame,
    summaries: pd.DataFrame,
    baseline: str = BASELINE_ALGO,
    threshold: float | None = None,
) -> ExperimentTable:
    """The :class:`ExperimentTable` of one experiment from its load_runs / load_summaries rows.

    ``baseline``: the runs the speedups are relative to (:func:`lsgd.analysis.arms.select_runs`).
    ``threshold``: T in the unit of the experiment's metric (test accuracy in [0, 1], or test
    perplexity); None: from the completed runs that did not collapse (module docstring).

    Raises:
        ValueError: ``threshold`` is not a finite number.
    """
    if threshold is not None and not math.isfinite(float(threshold)):
        raise ValueError(f"threshold must be a finite number, got {threshold!r}")
    keys = arm_keys(summaries)
    labels = arm_labels(summaries)
    metric = eval_metric(records)
    if metric is None:
        has_ppl = "final_test_ppl" in summaries and summaries["final_test_ppl"].notna().any()
        has_acc = "final_test_acc" in summaries and summaries["final_test_acc"].notna().any()
        metric = "test_ppl" if has_ppl and not has_acc else "test_acc"
    higher_better = metric == "test_acc"
    pick_best = max if higher_better else min

    rows = []
    collapsed: dict[str, bool] = {}  # run_id -> final evaluation worse than the first
    run_records = {d: records[records["run_dir"] == d] for d in summaries["run_dir"]}
    dense_of = _dense_baselines(summaries, keys + seed_keys(summaries))  # same seed first
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
        row = {"run_id": s["run_id"], "run_dir": s["run_dir"], "arm": labels[s["run_dir"]],
               "seed": s.get("seed"), "algo": s.get("algo.name", s.get("algo"))}  # fmt: skip
        first = float(evals.iloc[0]) if len(evals) > 1 else math.nan
        collapsed[s["run_id"]] = bool(final < first if higher_better else final > first)
        row.update({k: s[k] for k in keys if k != "algo.name"})
        last = r.iloc[-1] if len(r) else None
        comm_bytes = worker_bytes(s, last, "comm_bytes")
        dense = dense_of[s["run_dir"]]
        if dense is not None:
            dense_records = run_records[dense]
            dense_bytes = worker_bytes(by_dir.loc[dense], dense_records.iloc[-1] if len(dense_records) else None,
                                       "comm_bytes")
        else:
            dense_bytes = math.nan
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
            gb_sent_per_worker=worker_bytes(s, last, "wire_bytes") / 1e9,
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
        row.update({c: s.get(c) for c in ENV_COLUMNS})  # (placed last below)
        rows.append(row)
    table = pd.DataFrame(rows)

    completed = table["status"] == "completed"
    fell = completed & table["run_id"].map(collapsed).fillna(False).astype(bool)
    finals = table.loc[completed & ~fell, f"final_{metric}"].dropna()
    if not len(finals):  # every completed run collapsed: T from all of them
        finals = table.loc[completed, f"final_{metric}"].dropna()
    threshold_given = threshold is not None
    if threshold_given:
        threshold = float(threshold)
    else:
        threshold = float(finals.min() if higher_better else finals.max()) if len(finals) else None
    for col, time_col in (("wall", "wall_time_s"), ("modeled", "modeled_time_s")):
        table[f"time_to_T_{col}_s"] = [
            time_to_threshold(run_records[d], threshold, metric, time_col) if threshold is not None else math.nan
            for d in table["run_dir"]
        ]
    is_base = select_runs(summaries, baseline, labels).to_numpy()
    for col in ("wall", "modeled"):
        base_times = table.loc[is_base, f"time_to_T_{col}_s"].dropna()
        base = float(base_times.mean()) if len(base_times) else math.nan
        table[f"speedup_{col}"] = [_speedup(base, t) for t in table[f"time_to_T_{col}_s"]]
    # the target columns (if any) last, then the environment
    target_cols = [c for c in ("target_acc", "time_to_target_s", "modeled_time_to_target_s") if c in table]
    table = table[[c for c in table.columns if c not in target_cols and c not in ENV_COLUMNS] + target_cols
                  + list(ENV_COLUMNS)]
    batches = effective_batch(summaries).dropna()
    by = ["arm", "algo", *[k for k in keys if k != "algo.name"], "status"]
    values = [c for c in table.columns if c not in by and c != "seed" and pd.api.types.is_numeric_dtype(table[c])]
    # arms in print order: the baseline first, then algorithms in order of first appearance, then
    # the other keys ascending (numbers as numbers), completed runs before the others
    algo_rank = {a: i for i, a in enumerate(dict.fromkeys(table["algo"].map(format_value)))}
    order = sorted(
        range(len(table)),
        key=lambda i: (
            not is_base[i],
            algo_rank[format_value(table["algo"].iloc[i])],
            *(order_key(table[k].iloc[i]) for k in by[2:-1]),
            table["status"].iloc[i] != "completed",
        ),
    )
    return ExperimentTable(
        experiment=str(experiment),
        metric=metric,
        threshold=threshold,
        threshold_given=threshold_given,
        collapsed_runs=[str(x) for x in table.loc[fell, "run_id"]],
        baseline_runs=[str(x) for x in table.loc[is_base, "run_id"]],
        keys=keys,
        table=table,
        batch_scaling=batch_scaling_table(summaries, metric) if batches.nunique() > 1 else None,
        arms=_with_paired_differences(aggregate_seeds(table.iloc[order], by=by, values=values), table, by,
                                      is_base, f"final_{metric}"),
        baseline=str(baseline),
        differences=config_differences(summaries, keys),
        label_keys=written_label_keys(summaries, keys),
    )


def _with_paired_differences(
    arms: pd.DataFrame, table: pd.DataFrame, by: list[str], is_base, column: str
) -> pd.DataFrame:
    """``arms`` with the paired-by-seed difference of ``column`` from the baseline
    (:func:`lsgd.analysis.paired_differences`): ``paired_diff_<column>_mean``, ``_ci``, ``_n``
    (pairs), and ``paired_with`` (the baseline arm's label; ``"baseline"`` on a baseline arm; ""
    when the experiment has no completed baseline arm). Each arm is paired with the completed
    baseline arm that matches it on the most differing config keys outside ``algo.*`` (the first
    such arm on a tie), as the dense baseline is chosen for bytes vs dense."""
    key = lambda row: tuple(_hashable(row[c]) for c in by)  # noqa: E731
    run_arm = [key(r) for _, r in table.iterrows()]
    base_keys = {k for k, b in zip(run_arm, is_base) if b}
    runs = {key(r): [i for i, k in enumerate(run_arm) if k == key(r)] for _, r in arms.iterrows()}
    bases = [i for i, r in arms.iterrows() if key(r) in base_keys and r["status"] == "completed"]
    other = [c for c in by if c not in ("arm", "algo", "status") and not str(c).startswith("algo.")]
    out = arms.copy()
    cols = {f"paired_diff_{column}_{s}": [] for s in ("mean", "ci", "n")}
    paired_with = []
    for i, r in arms.iterrows():
        if key(r) in base_keys:
            stat, name = {"mean": 0.0, "ci": math.nan, "n": len(runs[key(r)])}, "baseline"
        elif not bases:
            stat, name = {"mean": math.nan, "ci": math.nan, "n": 0}, ""
        else:
            j = max(bases, key=lambda j: (sum(_hashable(arms.at[j, c]) == _hashable(r[c]) for c in other), -j))
            mine, theirs = table.iloc[runs[key(r)]], table.iloc[runs[key(arms.loc[j])]]
            try:
                stat = paired_differences(mine[column], mine["seed"], theirs[column], theirs["seed"])
            except ValueError:  # two runs of one seed (a rerun): no pairing
                stat = {"mean": math.nan, "ci": math.nan, "n": 0}
            name = str(arms.at[j, "arm"])
        for s in ("mean", "ci", "n"):
            cols[f"paired_diff_{column}_{s}"].append(stat[s])
        paired_with.append(name)
    for c, v in cols.items():
        out[c] = v
    out["paired_with"] = paired_with
    return out


def _paired_cells(arms: pd.DataFrame, column: str, digits: str) -> pd.Series:
    """Cells of the paired difference (:func:`_with_paired_differences`): ``baseline``, ``+m ± h``,
    ``+m (1 pair)`` or ``n/a`` (no seed in common)."""
    def cell(m, h, n, with_):
        if with_ == "baseline":
            return "baseline"
        if not n or not math.isfinite(m):
            return "n/a"
        if n == 1:
            return f"{format(m, '+' + digits)} (1 pair)"
        return f"{format(m, '+' + digits)}{PM}{format(h, digits)}"

    pre = f"paired_diff_{column}"
    return pd.Series([cell(*v) for v in zip(arms[f"{pre}_mean"], arms[f"{pre}_ci"], arms[f"{pre}_n"],
                                           arms["paired_with"])], index=arms.index, dtype=object)  # fmt: skip


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
    summaries: pd.DataFrame, metric: str | None = None, completed_only: bool = True, stat: str = "mean"
) -> pd.DataFrame:
    """Final test accuracy (or perplexity) per method and effective batch: the Adasum study table.

    Args:
        summaries: :func:`lsgd.analysis.load_summaries` rows (usually one experiment's).
        metric: ``"test_acc"`` or ``"test_ppl"``; None: ``test_acc`` if any run has a
            ``final_test_acc``, else ``test_ppl`` (language models).
        completed_only: use only runs with status ``completed``.
        stat: which statistic of :func:`lsgd.analysis.aggregate_seeds` the cells hold: ``mean``
            (default), ``ci`` (half-width of the 95% t interval), ``n`` (runs with a value),
            ``sd``, ``min``, ``max``.

    Returns:
        One row per method (index ``method``, see :func:`method_labels`, sorted), one column per
        effective batch = ``batch_size`` x world size (ints, ascending; :func:`effective_batch`),
        cells the final ``metric`` (``final_test_acc`` in [0, 1] or ``final_test_ppl``), the mean
        (or ``stat``) over runs with the same method and effective batch (seeds); NaN where no
        such run. Runs with an unknown effective batch are left out. ``attrs["metric"]`` is the
        metric used.
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
    agg = aggregate_seeds(cells, by=["method", "batch"], values=["value"])
    table = agg.pivot(index="method", columns="batch", values=f"value_{stat}") if len(agg) else pd.DataFrame()
    table = table.reindex(index=methods, columns=batches).astype(float)
    table.index.name, table.columns.name = "method", "effective batch"
    table.attrs["metric"] = metric
    return table


def tables_from_frames(
    records: pd.DataFrame, summaries: pd.DataFrame, baseline: str = BASELINE_ALGO, threshold: float | None = None
) -> dict[str, ExperimentTable]:
    """:func:`experiment_tables` on frames already loaded (``threshold``: T for every experiment)."""
    out = {}
    for experiment, summ in summaries.groupby("experiment_name", sort=True):
        summ = summ.copy()
        summ.attrs = dict(summaries.attrs)
        recs = records[records["experiment_name"] == experiment]
        out[str(experiment)] = experiment_table(str(experiment), recs, summ, baseline=baseline, threshold=threshold)
    return out


def experiment_tables(
    paths: PathLike | Iterable[PathLike], baseline: str = BASELINE_ALGO, threshold: float | None = None
) -> dict[str, ExperimentTable]:
    """``{experiment_name: ExperimentTable}`` for the runs in ``paths`` (the numbers of the report).

    ``baseline``: the runs the speedups are relative to (:func:`lsgd.analysis.arms.select_runs`:
    an ``algo.name``, an arm label or ``key=value`` pairs; ``ddp`` by default). ``threshold``: T
    for every experiment (None: from each experiment's runs, see the module docstring).

    Raises:
        FileNotFoundError: a path does not exist or holds no run folder.
        ValueError: no paths, or an unreadable run file.
    """
    runs = read_runs(paths)
    return tables_from_frames(runs_frame(runs), summaries_frame(runs), baseline=baseline, threshold=threshold)


# -- environment ----------------------------------------------------------------------------------
#: The report's environment columns (``env.*`` of :func:`lsgd.analysis.load_summaries`) and headers.
ENV_HEADERS = {
    "env.commit": "commit", "env.lsgd": "lsgd", "env.torch": "torch", "env.cpu_capability": "CPU capability",
    "env.cpu": "CPU", "env.gpu": "GPU", "env.python": "python",
}  # fmt: skip

#: Environment columns whose differences between runs :func:`environment_note` states (numerics
#: differ in the last bits between torch versions, code versions and CPU kernels): (singular, plural).
ENV_DIFFERENCES = {
    "env.torch": ("torch version", "torch versions"),
    "env.commit": ("commit", "commits"),
    "env.cpu_capability": ("CPU capability", "CPU capabilities"),
}  # fmt: skip

#: A cell of an environment column the run did not record (no environment.json, not a git checkout).
UNKNOWN = "-"


def _env_cell(value) -> str:
    return UNKNOWN if _is_missing(value) or value == "" else str(value)


def _runs(n: int) -> str:
    return f"{n} run{'s' if n != 1 else ''}"


def has_environment(summaries: pd.DataFrame) -> bool:
    """Whether any run of ``summaries`` has an ``environment.json`` (an ``env.*`` value)."""
    cols = [c for c in ENV_COLUMNS if c in summaries]
    return bool(cols) and bool(summaries[cols].notna().any().any())


def environment_table(summaries: pd.DataFrame) -> pd.DataFrame:
    """One row per distinct environment of the runs (cells strings, ``-`` where not recorded):
    ``runs`` (how many), the :data:`ENV_HEADERS` columns (commit, lsgd, torch, CPU capability, CPU,
    GPU, python) and ``run ids`` (``all`` when every run shares the one row); rows in order of
    their first run."""
    cells = pd.DataFrame({h: (summaries[c] if c in summaries else pd.Series(None, index=summaries.index))
                          .map(_env_cell) for c, h in ENV_HEADERS.items()})  # fmt: skip
    keys = [tuple(r) for r in cells.itertuples(index=False)]
    groups: dict[tuple, list[str]] = {}
    for key, run_id in zip(keys, summaries["run_id"].astype(str)):
        groups.setdefault(key, []).append(run_id)
    rows = []
    for key, ids in groups.items():
        rows.append({"runs": str(len(ids)), **dict(zip(ENV_HEADERS.values(), key)),
                     "run ids": "all" if len(groups) == 1 else ", ".join(ids)})  # fmt: skip
    return pd.DataFrame(rows, columns=["runs", *ENV_HEADERS.values(), "run ids"])


def environment_differences(summaries: pd.DataFrame) -> dict[str, dict[str, int]]:
    """``{env column: {value: runs}}`` for each :data:`ENV_DIFFERENCES` column in which the runs
    hold at least two recorded values (``-``: runs that recorded none), values in sorted order."""
    out = {}
    for col in ENV_DIFFERENCES:
        if col not in summaries:
            continue
        values = summaries[col].map(_env_cell)
        known = sorted(v for v in values.unique() if v != UNKNOWN)
        if len(known) > 1:
            counts = values.value_counts()
            out[col] = {v: int(counts[v]) for v in [*known, *([UNKNOWN] if UNKNOWN in counts else [])]}
    return out


def environment_note(summaries: pd.DataFrame) -> str:
    """One line on what produced the runs of ``summaries``. When they differ in torch version,
    commit or CPU capability it names the groups: ``**The runs differ in their environment:** 2
    torch versions: 2.4.1 (12 runs), 2.5.0 (3 runs).``; else the shared values (or that no run
    recorded its environment)."""
    n = len(summaries)
    if not has_environment(summaries):
        return f"Environment: not recorded (no environment.json in the {_runs(n)}: made before lsgd wrote it)."
    diffs = environment_differences(summaries)
    recorded = int(summaries[[c for c in ENV_COLUMNS if c in summaries]].notna().any(axis=1).sum())
    missing = f"; {_runs(n - recorded)} without environment.json" if recorded < n else ""
    if diffs:
        parts = []
        for col, counts in diffs.items():
            one, many = ENV_DIFFERENCES[col]
            k = len([v for v in counts if v != UNKNOWN])
            parts.append(f"{k} {many if k != 1 else one}: " + ", ".join(f"{v} ({_runs(c)})" for v, c in counts.items()))
        return f"**The runs differ in their environment:** {'; '.join(parts)}{missing}."
    shared = []
    for col in ENV_DIFFERENCES:
        values = [v for v in summaries[col].map(_env_cell).unique() if v != UNKNOWN] if col in summaries else []
        shared.append(f"{ENV_DIFFERENCES[col][0].replace(' version', '')} {values[0] if values else UNKNOWN}")
    who = ("the run" if n == 1 else f"all {n} runs") if not missing else f"{recorded} of {_runs(n)}{missing}"
    return f"Environment: {', '.join(shared)} ({who})."


# -- markdown, LaTeX, CSV -------------------------------------------------------------------------
#: Separator of a mean and its interval's half-width in the tables (LaTeX: ``$\pm$``).
PM = " ± "


def _fmt(value, digits: str) -> str:
    x = _num(value)
    return "n/a" if math.isnan(x) else format(x, digits)


def format_stat(mean, ci=math.nan, n_value=None, n=None, digits: str = ".3g") -> str:
    """A table cell: ``"m ± h"`` (mean and half-width of its interval, both formatted with
    ``digits``), ``"m"`` when there is no interval (one run) or it is exactly 0 (a deterministic
    quantity, the same in every run: bytes, modeled time), ``"n/a"`` when there is no mean;
    ``" (k of n)"`` appended when only ``n_value`` = k of the arm's ``n`` runs have a value."""
    m = _num(mean)
    if math.isnan(m):
        return "n/a"
    text = format(m, digits)
    h = _num(ci)
    if math.isfinite(h) and h != 0:
        text += f"{PM}{format(h, digits)}"
    k, total = _num(n_value), _num(n)
    if math.isfinite(k) and math.isfinite(total) and 0 < k < total:
        text += f" ({int(k)} of {int(total)})"
    return text


def _stat_cells(arms: pd.DataFrame, column: str, digits: str) -> pd.Series:
    """:func:`format_stat` of ``column`` for each arm of an ``ExperimentTable.arms`` frame."""
    if f"{column}_mean" not in arms:
        return pd.Series("n/a", index=arms.index, dtype=object)
    return pd.Series(
        [
            format_stat(m, h, k, n, digits)
            for m, h, k, n in zip(arms[f"{column}_mean"], arms[f"{column}_ci"], arms[f"{column}_n"], arms["n"])
        ],
        index=arms.index,
        dtype=object,
    )


def arm_names(arms: pd.DataFrame) -> pd.Series:
    """Row labels of the tables: the arm's label, with its status appended when that is not
    ``completed`` (``"local SGD, H=4 (running)"``)."""
    return pd.Series(
        [str(a) if st == "completed" else f"{a} ({st})" for a, st in zip(arms["arm"], arms["status"])],
        index=arms.index,
        dtype=object,
    )


def _metric_words(metric: str) -> tuple[str, str]:
    """(column word, digits) of the eval metric."""
    return ("test acc", ".4f") if metric == "test_acc" else ("test ppl", ".2f")


def format_main_table(t: ExperimentTable) -> pd.DataFrame:
    """The report's main table: one row per arm, cells ``mean ± half-width`` (strings).

    Columns: ``method`` (the arm's label, :func:`arm_names`), ``n`` (runs = seeds), final and best
    test accuracy (or perplexity), ``GB on the wire / worker``, ``bytes vs dense``, ``modeled time (s)``,
    ``time to T, modeled (s)``, ``speedup vs <baseline>, modeled`` and ``Δ final <metric> vs
    <baseline>, paired`` (the mean difference from the baseline over the seeds both have, with the
    paired t interval; :func:`_with_paired_differences`), see the module docstring.
    """
    a = t.arms
    m, acc_digits = _metric_words(t.metric)
    out = pd.DataFrame({"method": arm_names(a), "n": a["n"].map(lambda n: str(int(n)))})
    out[f"final {m}"] = _stat_cells(a, f"final_{t.metric}", acc_digits)
    out[f"best {m}"] = _stat_cells(a, f"best_{t.metric}", acc_digits)
    out[GB_SENT] = _stat_cells(a, "gb_sent_per_worker", ".4g")
    out["bytes vs dense"] = _stat_cells(a, "bytes_vs_dense", ".3g")
    out["modeled time (s)"] = _stat_cells(a, "modeled_time_s", ".3g")
    out["time to T, modeled (s)"] = _stat_cells(a, "time_to_T_modeled_s", ".3g")
    out[f"speedup vs {t.baseline}, modeled"] = _stat_cells(a, "speedup_modeled", ".2f")
    out[f"Δ final {m} vs {t.baseline}, paired"] = _paired_cells(a, f"final_{t.metric}", acc_digits)
    return out


def format_table(t: ExperimentTable) -> pd.DataFrame:
    """The report's detailed table: one row per arm with every number (``mean ± half-width``),
    readable headers, ``n/a`` for missing.

    Columns: ``method``, ``algo`` and the other differing config keys as written in the configs,
    ``status``, ``n``, ``seeds``, final and best metric, final test and train loss, GB on the
    wire per worker, bytes vs dense, comm rounds, samples, wall and modeled time (s), modeled time at 1 and
    10 Gbps (when runs log the alpha-beta terms), time to T and speedup on wall and modeled time,
    the paired-by-seed difference of the final metric from the baseline and the baseline arm it is
    paired with, and the target columns when runs have ``target_acc``.
    """
    a = t.arms
    m, acc_digits = _metric_words(t.metric)
    out = pd.DataFrame({"method": arm_names(a), "algo": a["algo"].map(format_value)})
    for k in t.keys:
        if k != "algo.name":
            out[k] = a[k].map(format_value)
    out["status"] = a["status"].astype(str)
    out["n"] = a["n"].map(lambda n: str(int(n)))
    out["seeds"] = a["seeds"].astype(str) if "seeds" in a else ""
    out[f"final {m}"] = _stat_cells(a, f"final_{t.metric}", acc_digits)
    out[f"best {m}"] = _stat_cells(a, f"best_{t.metric}", acc_digits)
    out["final test loss"] = _stat_cells(a, "final_test_loss", ".4f")
    out["final train loss"] = _stat_cells(a, "final_train_loss", ".4f")
    out[GB_SENT] = _stat_cells(a, "gb_sent_per_worker", ".4g")
    out["bytes vs dense"] = _stat_cells(a, "bytes_vs_dense", ".3g")
    out["comm rounds"] = _stat_cells(a, "comm_rounds", ".0f")
    out["samples"] = _stat_cells(a, "samples", ".0f")
    out["wall time (s)"] = _stat_cells(a, "wall_time_s", ".1f")
    out["modeled time (s)"] = _stat_cells(a, "modeled_time_s", ".3g")
    for bw in REPORT_BANDWIDTHS_GBPS:  # only for runs that log the alpha-beta terms; blank otherwise
        col = modeled_time_column(bw)
        if f"{col}_mean" in a and a[f"{col}_mean"].notna().any():
            cells = _stat_cells(a, col, ".3g")
            out[f"modeled @{format_value(bw)} Gbps (s)"] = cells.where(a[f"{col}_mean"].notna(), "")
    out["time to T, wall (s)"] = _stat_cells(a, "time_to_T_wall_s", ".1f")
    out["time to T, modeled (s)"] = _stat_cells(a, "time_to_T_modeled_s", ".3g")
    out[f"speedup vs {t.baseline}, wall"] = _stat_cells(a, "speedup_wall", ".2f")
    out[f"speedup vs {t.baseline}, modeled"] = _stat_cells(a, "speedup_modeled", ".2f")
    out[f"Δ final {m} vs {t.baseline}, paired"] = _paired_cells(a, f"final_{t.metric}", acc_digits)
    out["paired with"] = a["paired_with"].astype(str)
    if "time_to_target_s_mean" in a:
        out["target acc"] = _stat_cells(a, "target_acc", ".4f")
        out["time to target, wall (s)"] = _stat_cells(a, "time_to_target_s", ".1f")
        out["time to target, modeled (s)"] = _stat_cells(a, "modeled_time_to_target_s", ".3g")
    return out


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


#: LaTeX's special characters and how text writes them (the caption; cells are escaped by pandas).
_LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}  # fmt: skip


def latex_escape(text: str) -> str:
    """``text`` with LaTeX's special characters escaped (as pandas' ``escape="latex"`` does)."""
    return "".join(_LATEX_SPECIAL.get(ch, ch) for ch in str(text))


def latex_table(frame: pd.DataFrame, caption: str, label: str) -> str:
    """``frame`` (cells already strings, e.g. :func:`format_main_table`) as a LaTeX ``table`` with
    booktabs rules (``\\toprule``, ``\\midrule``, ``\\bottomrule``; needs ``\\usepackage{booktabs}``),
    written by :meth:`pandas.io.formats.style.Styler.to_latex`: text escaped for LaTeX, ``±`` as
    ``$\\pm$`` and ``Δ`` as ``$\\Delta$`` (pdflatex knows neither character), the first column
    left-aligned and the others right-aligned; ``caption`` is escaped too (``label`` must be a plain
    LaTeX label)."""
    styler = frame.style.hide(axis="index").format(escape="latex").format_index(escape="latex", axis=1)
    tex = styler.to_latex(
        hrules=True,
        column_format="l" + "r" * (frame.shape[1] - 1),
        caption=latex_escape(caption),
        label=label,
        position="htbp",
        position_float="centering",
    )
    return tex.replace(PM.strip(), r"$\pm$").replace("Δ", r"$\Delta$")


def format_batch_scaling(
    table: pd.DataFrame,
    summaries: pd.DataFrame | None = None,
    ci: pd.DataFrame | None = None,
    n: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """The report's view of a :func:`batch_scaling_table`: a ``method`` column, one column per
    effective batch, formatted values (``m ± h (n=k)`` when ``ci`` and ``n``, the same table with
    ``stat="ci"`` and ``stat="n"``, are given); an empty cell shows the status of the runs there
    that did not complete (e.g. ``diverged``) when ``summaries`` is given, else is blank."""
    metric = table.attrs.get("metric", "test_acc")
    digits = ".4f" if metric == "test_acc" else ".2f"
    status: dict[tuple, str] = {}
    if summaries is not None and "status" in summaries:
        cells = pd.DataFrame(
            {"method": method_labels(summaries), "batch": effective_batch(summaries), "status": summaries["status"]}
        )
        for (m, b), st in cells[cells["status"] != "completed"].groupby(["method", "batch"])["status"]:
            status[(m, float(b))] = "/".join(sorted(set(map(str, st))))

    def cell(m, b, v):
        if _is_missing(v):
            return status.get((m, float(b)), "")
        if ci is None or n is None:
            return _fmt(v, digits)
        return f"{format_stat(v, ci.at[m, b], digits=digits)} (n={int(n.at[m, b])})"

    out = pd.DataFrame({"method": [str(m) for m in table.index]})
    for b in table.columns:
        out[format_value(b)] = [cell(m, b, v) for m, v in zip(table.index, table[b])]
    return out


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
    names = t.label_keys or []
    short = [f"{key_name(k, names)} = `{k}`" for k in names
             if k not in VALUE_ONLY_KEYS and k not in BOOL_NAMES and key_name(k, names) != k]  # fmt: skip
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
            f"- **Speedup vs {baseline}.** The baseline's time to T (the mean over the runs that "
            f"`--baseline {baseline}` selects and that reached T) divided by the run's time to T; an "
            "arm's speedup is the mean over its runs."
        ),
        (
            f"- **{GB_SENT}** = `wire_bytes` / 1e9: the bytes a worker puts on the wire (what travels "
            "under the standard algorithm of each collective: a ring all-reduce of n bytes sends "
            "2(p-1)/p n, an all-gather of n-byte inputs (p-1) n, a message n), the mean over the "
            "worker ranks (servers excluded: `wire_bytes_workers` where a run has server ranks); "
            "**bytes vs dense** = the payload a worker handed to collectives and sends (`comm_bytes`, "
            "over the same ranks) / that of the experiment's dense run (`ddp` or "
            "`algo.compressor=none`, the same seed where there is one)."
        ),
        (
            "- **Wall time** is measured on the machine that ran the job. **Modeled time** is the "
            "cluster clock (`lsgd/comm/communicator.py`): the slowest worker's virtual time on the configured "
            "cluster, compute from `cluster.*` (a FLOP profile of the target device, or `step_time_s`) "
            "and communication at its alpha-beta cost, overlapped where the algorithm overlaps it; "
            "modeled @1 / @10 Gbps is the same clock with the inter-node link of the `network=1gbps` / "
            "`network=10gbps` preset (1 Gbps at 50 us latency, 10 Gbps at 10 us). (Runs "
            "recorded before the clock show measured compute plus the cost of every collective.)"
        ),
        (
            f"- **Figures.** One line per arm: the mean over its runs, with a band: the {pct} t interval "
            "for n >= 3, the min-max range for n = 2, none for n = 1. Where the seeds' x values differ "
            "(wall time), each run's curve is linearly interpolated onto the union of the runs' x "
            "values inside the range all of them cover."
        ),
        "- Runs without summary.json show status `running` and their progress so far.",
    ]


def _rel(path: Path, start: Path) -> str:
    return Path(os.path.relpath(path, start)).as_posix()


def write_atomic(path: PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` through a temporary file in the same folder renamed over
    it (:func:`os.replace`): a reader sees the old file or the new one, never a half-written one.
    Returns the path."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


#: Style of report.html: readable tables (borders, zebra rows, wide ones scroll), figures at most
#: the page's width.
HTML_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; margin: 2em auto;
       max-width: 1400px; padding: 0 1em; line-height: 1.45; color: #1b1b1b; background: #fff; }
h1, h2, h3 { line-height: 1.2; } h2 { border-bottom: 1px solid #ccc; padding-bottom: .2em; margin-top: 2em; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.85em; display: block; overflow-x: auto; }
th, td { border: 1px solid #bbb; padding: .25em .55em; white-space: nowrap; }
th { background: #eef0f3; } tr:nth-child(even) td { background: #f8f9fa; }
img { max-width: 100%; height: auto; display: block; margin: 1em 0 .3em; }
code { background: #f1f1f1; padding: 0 .2em; border-radius: 3px; }
"""


def _data_uri(path: Path) -> str:
    kind = {".png": "image/png", ".svg": "image/svg+xml", ".jpg": "image/jpeg", ".jpeg": "image/jpeg"}
    mime = kind.get(path.suffix.lower(), "application/octet-stream")
    return f"data:{mime};base64,{base64.b64encode(path.read_bytes()).decode('ascii')}"


def print_width_in(path: Path) -> float | None:
    """The width in inches at which the image file ``path`` prints: its pixel width over the
    resolution its header records (PNG ``pHYs``, which matplotlib's ``savefig(dpi=...)`` writes;
    read with Pillow). None when the file records no resolution or is not a raster image."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as img:
            dpi = img.info.get("dpi")
            width = img.size[0]
    except (UnidentifiedImageError, OSError):
        return None
    if not dpi or not dpi[0] or float(dpi[0]) <= 1:  # no pHYs (Pillow may report 1 for "unknown")
        return None
    return width / float(dpi[0])


def markdown_to_html(text: str, base: PathLike, title: str = "lsgd report") -> str:
    """A self-contained HTML page of the Markdown ``text`` (report.md): rendered by markdown-it-py
    (CommonMark with GitHub's tables; raw HTML in the text is escaped, not passed through), every
    image whose source is a relative path under ``base`` embedded as a base64 ``data:`` URI, so
    the page shows its tables and figures with no other file; links (SVG, PDF, CSV, LaTeX) stay
    relative to ``base``. Styles inline (:data:`HTML_STYLE`), no script.

    Each embedded image is shown at its print size: a CSS ``width`` in ``in`` (1 in = 96 CSS px)
    from its pixel width and recorded resolution (:func:`print_width_in`), so a ``--width one``
    figure (975 px at 300 dpi) is 3.25 in wide on the page as in the paper, not 975 px; height
    follows the aspect ratio, and the page's width still caps it (``max-width: 100%``).

    Raises:
        FileNotFoundError: an image the text names is missing under ``base``.
    """
    from markdown_it import MarkdownIt

    base = Path(base)
    md = MarkdownIt("commonmark", {"html": False}).enable("table")
    tokens = md.parse(text)
    for token in tokens:
        for child in token.children or []:
            src = child.attrGet("src") if child.type == "image" else None
            if src and "://" not in src and not src.startswith(("data:", "/")):
                inches = print_width_in(base / src)
                child.attrSet("src", _data_uri(base / src))
                if inches is not None:
                    child.attrSet("style", f"width: {inches:.4g}in")
    body = md.renderer.render(tokens, md.options, {})
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f"<title>{html.escape(title)}</title>\n<style>{HTML_STYLE}</style>\n</head>\n<body>\n{body}</body>\n</html>\n")


#: Files written next to report.md per experiment: the main table in LaTeX, every number per arm
#: and per run in CSV (``{name}``: the experiment's :func:`lsgd.analysis.plots.safe_name`).
LATEX_FILE, ARMS_CSV, RUNS_CSV = "{name}_main.tex", "{name}_arms.csv", "{name}_runs.csv"


def write_report(
    paths: PathLike | Iterable[PathLike],
    out_dir: PathLike,
    baseline: str = BASELINE_ALGO,
    threshold: float | None = None,
    width: str | None = None,
) -> Path:
    """Write ``out_dir/report.md`` comparing the runs in ``paths``, with figures in ``out_dir/figures``,
    and ``out_dir/report.html``, the same report as one self-contained page (tables, and the
    figures embedded as base64 PNG: :func:`markdown_to_html`) to open in a browser or send as one
    file. Both are written atomically (:func:`write_atomic`).

    The report says once what produced its runs (:func:`environment_note`: the shared torch,
    commit and CPU capability, or the groups where runs differ), states its definitions once
    (:func:`definitions_text`: arms and seeds, the interval, T, speedup, bytes, wall and modeled
    time, the figures' bands), then per experiment:
    the number of runs and arms and the config keys that differ (seeds included); the threshold T;
    the main table (:func:`format_main_table`: one row per arm, ``mean ± half-width`` and n);
    links to its LaTeX version and the CSV files; the detailed table (:func:`format_table`);
    notes on runs that did not complete; the "accuracy vs effective batch" table when the runs
    differ in effective batch (:func:`batch_scaling_table`); the environment table
    (:func:`environment_table`, when some run has ``environment.json``), after a line naming
    the groups when the runs differ in torch, commit or CPU capability; and the figures of
    :func:`lsgd.analysis.plots.plot_runs` (PNG embedded, SVG linked, relative links).

    Files next to report.md, per experiment ``<name>`` (:func:`lsgd.analysis.plots.safe_name`):
    ``<name>_main.tex`` (the main table, booktabs), ``<name>_arms.csv`` (``ExperimentTable.arms``:
    every column's mean, interval half-width, sd, n, min and max per arm) and ``<name>_runs.csv``
    (``ExperimentTable.table``: one row per run).

    Args:
        paths: a run folder, a folder containing run folders at any depth, or a list of these.
        out_dir: output folder (created if missing).
        baseline: the runs the speedups are relative to: an ``algo.name`` (default ``ddp``), an
            arm label (``"local SGD, H=8"``) or ``key=value`` pairs joined by commas.
        threshold: T for every experiment, in its metric's unit (test accuracy in [0, 1], or test
            perplexity); None: from each experiment's runs (module docstring).
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
    figures = plot_frames(records, summaries, out_dir / FIGURES_DIR, compression_frame(runs), width=width)
    tables = tables_from_frames(records, summaries, baseline=baseline, threshold=threshold)

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
            for title, fig_files in figures[name].items():
                by = {p.suffix: p for p in fig_files}
                links = " · ".join(f"[{ext[1:].upper()}]({_rel(by[ext], out_dir)})" for ext in (".svg", ".pdf") if ext in by)
                lines += [f"![{title}]({_rel(by['.png'], out_dir)})", "",
                          f"*{name}: {title}.* {links}", ""]
    text = "\n".join(lines).rstrip() + "\n"
    write_atomic(out_dir / HTML_FILE, markdown_to_html(text, out_dir))
    return write_atomic(out_dir / REPORT_FILE, text)
