"""The numbers of the report, per experiment: one row per run and one per arm
(:class:`ExperimentTable`, :func:`experiment_tables`), and the accuracy-vs-effective-batch table
(:func:`batch_scaling_table`). :mod:`lsgd.analysis.formats` writes them as text and
:mod:`lsgd.analysis.report` puts them in report.md.

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
- wire bytes vs the baseline (``wire_vs_baseline``) = the run's wire bytes per worker / those of its
  baseline run (``baseline_run``: among the runs ``baseline`` selects, the run itself if it is one,
  else the one that matches it on the most differing non-``algo.*`` config keys, the seed first,
  then a completed one, then the first). The report's one byte measure: what travels.
- peak bytes / step = ``peak_step_bytes`` (summary, else the last record): the most wire bytes any
  rank, servers included, sent in one step (the peak bandwidth a method needs; NaN for a run
  recorded before the key); ``peak_vs_baseline`` its ratio to the baseline run's.
- payload vs dense (``bytes_vs_dense``) = the run's payload per worker (``comm_bytes``, over its
  worker ranks as above) / that of the experiment's dense baseline
  (a run with ``algo.name == "ddp"`` or ``algo.compressor == "none"``; a dense run is its own
  baseline; among several, the one that matches the run on the most differing non-``algo.*``
  config keys, then a completed one, then the first). n/a when the experiment has no dense run.
  The payload is what the algorithm hands to collectives and sends, not what travels: an
  all-reduce's tensor counts once (its ring sends 2(p-1)/p of it), a gossip step's message once
  per neighbour, so two methods with equal wire bytes can differ in payload (Adasum next to DDP)
  and a ratio of payloads is not one of wire bytes (D-PSGD on a ring next to DDP); the report
  shows it in the detailed table only.
- modeled time at 1 and 10 Gbps = the cluster clock's what-if entries ``modeled_time_1gbps_s``,
  ``modeled_time_10gbps_s`` (the same run's events priced on the inter-node link of the network
  preset of that bandwidth, ``network=1gbps`` / ``network=10gbps``: its bandwidth and its latency,
  50 / 10 us; overlap and waiting included; :mod:`lsgd.clock.network`), from summary.json, else from the
  last metrics record. Runs recorded before the cluster clock fall back to ``compute_time_s`` +
  ``NetworkModel(bandwidth_gbps, latency).cost(model_alpha_terms, model_beta_bytes)`` (no overlap)
  with the same latency (:func:`lsgd.clock.network.what_if_latency_us`; a bandwidth without a preset: the
  run's ``network.latency_us``, else 10 us) and the run's ``network.overhead_us`` (else 0); blank
  for runs that lack those keys.

Batch scaling (:func:`batch_scaling_table`): when an experiment's runs differ in effective batch
(``batch_size`` x world size), final test accuracy (perplexity) per method and effective batch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import pandas as pd

from lsgd.analysis.arms import (
    arm_keys,
    arm_labels,
    config_differences,
    label_key_names,
    order_key,
    seed_keys,
    select_runs,
    written_label_keys,
)
from lsgd.analysis.load import (
    ENV_COLUMNS,
    PathLike,
    _hashable,
    _num,
    read_runs,
    runs_frame,
    summaries_frame,
    world_sizes,
)
from lsgd.analysis.plots import eval_metric
from lsgd.analysis.stats import aggregate_seeds, paired_differences
from lsgd.clock.network import NetworkModel, what_if_latency_us
from lsgd.core.labels import format_value
from lsgd.core.labels import is_missing as _is_missing

#: ``algo.name`` of the default baseline the speedups are relative to (``--baseline`` chooses another).
BASELINE_ALGO = "ddp"

#: Bandwidths (Gbps) of the report's modeled-time columns (``modeled_1gbps_s``, ``modeled_10gbps_s``).
REPORT_BANDWIDTHS_GBPS = (1.0, 10.0)

#: Latency (us) of the modeled-time columns for a run whose config has no ``network.latency_us``.
DEFAULT_LATENCY_US = 10.0


def modeled_time_column(bandwidth_gbps: float) -> str:
    """Table column of the modeled time at ``bandwidth_gbps``: ``modeled_1gbps_s``, ``modeled_10gbps_s``."""
    return f"modeled_{format_value(bandwidth_gbps)}gbps_s"


def modeled_time_at(
    compute_time_s: float, alpha_terms: float, beta_bytes: float, bandwidth_gbps: float, latency_us: float,
    overhead_us: float = 0.0,
) -> float:
    """Seconds of a run on another network: measured ``compute_time_s`` + the alpha-beta cost
    ``alpha_terms`` messages (each latency + 2 ``overhead_us``, LogGP's o) + ``beta_bytes`` bytes
    (:meth:`lsgd.clock.network.NetworkModel.cost`). NaN if an argument is missing."""
    values = [_num(v) for v in (compute_time_s, alpha_terms, beta_bytes, bandwidth_gbps, latency_us)]
    if not all(math.isfinite(v) for v in values):
        return math.nan
    compute, a, b, bw, lat = values
    o = _num(overhead_us)
    return compute + NetworkModel(bandwidth_gbps=bw, latency_us=lat, overhead_us=o if math.isfinite(o) else 0.0).cost(a, b)


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
            After ``gb_sent_per_worker``: ``wire_vs_baseline`` (wire bytes per worker / the
            baseline run's), ``peak_step_bytes`` (bytes; NaN: not recorded), ``peak_vs_baseline``,
            ``baseline_run`` (that baseline run's run_id), ``floats_sent`` (payload / 4, per
            worker), ``bytes_vs_dense`` (payload per worker / the dense baseline's, see the module
            docstring), ``dense_run`` (that baseline's run_id); and ``modeled_1gbps_s``,
            ``modeled_10gbps_s`` (s) after ``modeled_time_s``. Last, the run's ``env.*`` columns
            (``env.commit``, ``env.torch``, ``env.cpu_capability``, ...;
            :func:`lsgd.analysis.load.environment_fields`).
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
        label_names: ``{key: its name in the labels}`` of those written as ``name=value`` under a
            name of their own (``{"algo.local_steps": "H"}``; :func:`lsgd.analysis.arms.label_key_names`).
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
    label_names: dict[str, str] | None = None
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
                   beta_bytes: float, latency: float, overhead_us: float = 0.0) -> float:
    """The run's modeled time at inter-node bandwidth ``bw``: the clock's what-if entry
    ``modeled_time_<bw>gbps_s`` (summary, else last record), else the pre-clock formula."""
    key = f"modeled_time_{bw:g}gbps_s"
    for src in (s, last):
        if src is not None and math.isfinite(_num(src.get(key))):
            return _num(src.get(key))
    if not all(math.isfinite(_num(v)) for v in (compute, alpha_terms, beta_bytes)):
        return math.nan
    return modeled_time_at(compute, alpha_terms, beta_bytes, bw, what_if_latency_us(bw, latency), overhead_us)


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
    return _closest_runs(summaries, keys, [is_dense_baseline(s) for _, s in summaries.iterrows()])


def _closest_runs(summaries: pd.DataFrame, keys: list[str], candidate) -> dict[str, str | None]:
    """``{run_dir: run_dir of its closest candidate or None}``: a candidate (``candidate``: one bool
    per row of ``summaries``) is its own; another run's is the candidate that matches it on the
    most of ``keys`` outside ``algo.*``, then a completed one, then the first (None: no candidate).
    The dense baseline of the payload ratio, the baseline run of the wire-bytes ratios."""
    rows = [s for _, s in summaries.iterrows()]
    dense = [s for s, c in zip(rows, candidate) if c]
    mine = {s["run_dir"] for s in dense}
    other = [k for k in keys if not k.startswith("algo.") and k in summaries.columns]
    out: dict[str, str | None] = {}
    for s in rows:
        if not dense:
            out[s["run_dir"]] = None
            continue
        if s["run_dir"] in mine:
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
    is_base = select_runs(summaries, baseline, labels).to_numpy()
    base_of = _closest_runs(summaries, keys + seed_keys(summaries), is_base)  # same seed first
    by_dir = summaries.set_index("run_dir", drop=False)

    def last_record(d):
        return run_records[d].iloc[-1] if len(run_records[d]) else None

    def peak(d):  # peak_step_bytes of run d: its summary, else its last record (NaN: not recorded)
        value = _num(by_dir.loc[d].get("peak_step_bytes"))
        last = last_record(d)
        return _num(last.get("peak_step_bytes")) if math.isnan(value) and last is not None else value
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
        wire = worker_bytes(s, last, "wire_bytes")
        base = base_of[s["run_dir"]]
        base_wire = worker_bytes(by_dir.loc[base], last_record(base), "wire_bytes") if base is not None else math.nan
        base_peak = peak(base) if base is not None else math.nan
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
            gb_sent_per_worker=wire / 1e9,
            wire_vs_baseline=wire / base_wire if base_wire > 0 else math.nan,
            peak_step_bytes=peak(s["run_dir"]),
            peak_vs_baseline=peak(s["run_dir"]) / base_peak if base_peak > 0 else math.nan,
            baseline_run=str(by_dir.loc[base, "run_id"]) if base is not None else None,
            floats_sent=comm_bytes / 4,
            bytes_vs_dense=comm_bytes / dense_bytes if dense_bytes > 0 else math.nan,
            dense_run=str(by_dir.loc[dense, "run_id"]) if dense is not None else None,
            comm_rounds=_num(s.get("comm_rounds")),
            samples=_num(s.get("samples")),
            wall_time_s=_num(s.get("wall_time_s")),
            modeled_time_s=_num(s.get("modeled_time_s")),
            **{
                modeled_time_column(bw): _clock_time_at(s, last, bw, compute, alpha_terms, beta_bytes, latency,
                                                        s.get("network.overhead_us"))
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
        label_names=label_key_names(summaries, keys),
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


# -- batch scaling --------------------------------------------------------------------------------
def effective_batch(summaries: pd.DataFrame) -> pd.Series:
    """Effective (global) batch of each run: config ``batch_size`` x
    :func:`lsgd.analysis.load.world_sizes` (NaN if unknown)."""
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
