"""Analysis of finished (or running) runs: run folders -> pandas DataFrames -> figures and a report.

    from lsgd.analysis import load_runs, load_summaries, differing_keys, plot_runs, write_report
    from lsgd.analysis import aggregate_seeds, arm_labels

    records = load_runs("results/fmnist_demo")      # one row per metrics.jsonl record
    runs = load_summaries("results/fmnist_demo")    # one row per run
    comp = load_compression("results/gravac")       # one row per per-step compression row
    batch_scaling_table(load_summaries("results/adasum"))  # method x effective batch -> final acc
    differing_keys(runs)                            # e.g. ['algo.name', 'algo.local_steps', 'seed']
    arm_keys(runs)                                  # the same without the seeds: ['algo.name', 'algo.local_steps']
    arm_labels(runs)                                # {run_dir: 'local SGD, H=8'}: runs differing only in seed share one
    config_label(runs.iloc[0], extra=["seed"])      # one run from its row (config + labels.json): 'local SGD, H=8, seed=1'
    write_report("results/fmnist_demo", "out", width="one")   # report.md, report.html, figures 3.25 in wide
    aggregate_seeds(runs)                           # one row per arm: n, <col>_mean, <col>_ci (95% t), <col>_sd, ...
    aggregate_seeds(runs, by=["algo.name"], values=["final_test_acc"])   # your own grouping
    plot_runs("results/fmnist_demo", "results/fmnist_demo/plots")
    write_report("results/fmnist_demo", "results/fmnist_demo/report", baseline="ddp")

The run-folder format these read is docs/results.md. Statistics over seeds:
:mod:`lsgd.analysis.stats` (mean and Student t interval per arm, curves on a common grid).

The modules, in the order the data flows: ``load`` (run folders -> frames), ``arms`` (runs that
differ only in seed), ``stats`` (means and intervals over seeds), ``plots`` (the figures),
``tables`` (the report's numbers: per run and per arm, time to T, speedups, bytes, batch scaling),
``formats`` (their cells, Markdown and LaTeX), ``environment`` (what produced the runs),
``modeled_cluster`` (what their modeled numbers model: each run's cluster in words),
``html_page`` (report.html), ``report`` (report.md and report.html). The studies' own tables:
``clock_validation``, ``time_claims``, ``gravac_gains``, ``suboptimality`` (ADSAGA), ``bench``
(``make bench``'s BENCH lines), ``p2p_trace`` (the point-to-point trace); their entry points are
in scripts/.
"""

from lsgd.analysis.arms import arm_keys, arm_labels, config_label, select_runs
from lsgd.analysis.load import (
    DEFAULT_IGNORED_KEYS,
    differing_keys,
    find_run_dirs,
    flatten_config,
    load_compression,
    load_runs,
    load_summaries,
    run_labels,
)
from lsgd.analysis.plots import plot_runs
from lsgd.analysis.report import write_report
from lsgd.analysis.stats import aggregate_curves, aggregate_seeds, paired_differences, t_halfwidth
from lsgd.analysis.tables import ExperimentTable, batch_scaling_table, experiment_tables, time_to_threshold

__all__ = [
    "DEFAULT_IGNORED_KEYS",
    "ExperimentTable",
    "aggregate_curves",
    "aggregate_seeds",
    "paired_differences",
    "arm_keys",
    "arm_labels",
    "batch_scaling_table",
    "config_label",
    "differing_keys",
    "experiment_tables",
    "find_run_dirs",
    "flatten_config",
    "load_compression",
    "load_runs",
    "load_summaries",
    "plot_runs",
    "run_labels",
    "select_runs",
    "t_halfwidth",
    "time_to_threshold",
    "write_report",
]
