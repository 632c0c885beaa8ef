"""Analysis of finished (or running) runs: run folders -> pandas DataFrames -> figures and a report.

    from lsgd.analysis import load_runs, load_summaries, differing_keys, plot_runs, write_report

    records = load_runs("results/fmnist_demo")      # one row per metrics.jsonl record
    runs = load_summaries("results/fmnist_demo")    # one row per run
    comp = load_compression("results/gravac")       # one row per per-step compression row
    batch_scaling_table(load_summaries("results/adasum"))  # method x effective batch -> final acc
    differing_keys(runs)                            # e.g. ['algo.name', 'algo.local_steps']
    plot_runs("results/fmnist_demo", "results/fmnist_demo/plots")
    write_report("results/fmnist_demo", "results/fmnist_demo/report")

The run-folder format these read is docs/run_format.md.
"""

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
from lsgd.analysis.report import (
    ExperimentTable,
    batch_scaling_table,
    experiment_tables,
    time_to_threshold,
    write_report,
)

__all__ = [
    "DEFAULT_IGNORED_KEYS",
    "ExperimentTable",
    "batch_scaling_table",
    "differing_keys",
    "experiment_tables",
    "find_run_dirs",
    "flatten_config",
    "load_compression",
    "load_runs",
    "load_summaries",
    "plot_runs",
    "run_labels",
    "time_to_threshold",
    "write_report",
]
