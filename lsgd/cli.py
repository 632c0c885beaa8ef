"""``lsgd``: the command line.

    lsgd train [HYDRA_OVERRIDES...]        one job (or a sweep with -m), e.g. algo=local_sgd algo.local_steps=8
    lsgd plot RUN_OR_SWEEP_DIRS... [--out DIR] [--width one|two]
    lsgd report RUN_OR_SWEEP_DIRS... [--out DIR] [--baseline ALGO|LABEL|KEY=VALUE,...] [--threshold T] [--width one|two]
    lsgd data DATASET [HYDRA_OVERRIDES...]  fetch a dataset (e.g. fashion_mnist) into dataset.root
    lsgd list [GROUP]                       the options of a config group with their one-line descriptions
    lsgd --version                          lsgd's version (and git commit of a checkout)

``lsgd train`` is a Hydra application (config groups under the packaged conf/, ``--help`` lists
them, ``--cfg job`` prints the composed config).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shutil
import signal
import sys
import tempfile
from pathlib import Path

from lsgd.config.resolvers import (
    register_resolvers as _register_resolvers,  # callers import it from here
)
from lsgd.config.resolvers import run_id  # noqa: F401  (public name, kept)

USAGE = """usage: lsgd <command> [args]

commands:
  train    train one job or a sweep (-m) with Hydra overrides, e.g.
             lsgd train algo=local_sgd algo.local_steps=8 model=cnn dataset=fashion_mnist
             lsgd train -m experiment=fmnist_demo algo=ddp,local_sgd,slowmo
  plot     figures (PNG, SVG and PDF) from run or sweep folders: lsgd plot results/fmnist_demo
  report   report.md and a self-contained report.html with tables (mean and 95% interval over seeds),
           LaTeX, CSV and figures: lsgd report results/fmnist_demo [--baseline ddp] [--width one|two]
  data     fetch a dataset before training: lsgd data fashion_mnist [dataset.root=DIR]
  calibrate  measure this machine's matmul and convolution FLOP/s (by shape), memory and first-touch bandwidth,
             batch-norm and max-pool rates and per-op overhead for
             cluster.device=cpu: lsgd calibrate [--threads N]
             --network [--nproc N]: this host's per-message overhead o instead (network.overhead_us; N local gloo ranks)
  list     the options of the config groups with their descriptions:
             lsgd list [algorithms|experiments|variants|models|datasets|optimizers|schedules|networks|...]
  emulate  the emulated cluster (launcher.emulate=true, root): lsgd emulate --cleanup [--all] removes
             the namespaces and links a killed launcher left (--all: those of running launches too)

`lsgd train --help` shows the config groups and their options; `lsgd --version` the version.
Shell completion of `lsgd train` overrides (Hydra's): eval "$(lsgd train -sc install=bash)".
"""

#: ``lsgd list`` names (plural, as users say them) of the config groups under conf/
GROUPS = {
    "algorithms": "algo", "experiments": "experiment", "variants": "variant", "models": "model",
    "datasets": "dataset", "optimizers": "optim", "schedules": "schedule", "networks": "network",
    "launchers": "launcher", "loggers": "logger", "debug": "debug",
}  # fmt: skip


def _config_path() -> str:
    return "pkg://lsgd.conf"


def _debug_experiment_hint(argv: list[str]) -> str:
    """The hint for a config that fails with both ``debug=`` and ``experiment=`` on the command
    line: debug=default replaces the data set and model with its tiny synthetic ones, which an
    experiment's own keys may not fit (``experiment=async_text``'s sequence keys); '' otherwise."""
    debug = next((a for a in argv if a.startswith("debug=")), None)
    experiment = next((a.split("=", 1)[1] for a in argv if a.startswith("experiment=")), None)
    if debug is None or experiment is None:
        return ""
    return (f" ({debug} replaces experiment={experiment}'s data set and model with its tiny synthetic ones; for a "
            f"short run of the experiment itself: lsgd train experiment={experiment} max_steps=20)")


def train(argv: list[str]) -> int:
    """Run the Hydra application with ``argv`` as its command line."""
    import hydra

    from lsgd.launch.environment import detect_launch_env

    from lsgd.config.validation import check_override_keys
    from lsgd.core.errors import ConfigError

    _register_resolvers()
    if not any(a in ("-sc", "--shell-completion", "-h", "--help", "--hydra-help") for a in argv):
        try:  # a typo in a key (with or without +) is an error with a suggestion, before anything runs
            check_override_keys(argv)
        except ConfigError as exc:
            print(f"lsgd: invalid configuration: {exc}", file=sys.stderr)
            return 2
    if "-m" in argv or "--multirun" in argv:
        import lsgd.launch.status

        lsgd.launch.status.SWEEP_JOBS = _sweep_jobs(argv)
    env = detect_launch_env(os.environ)
    scratch = None
    if env is not None and env.rank != 0 and env.world_size > 1:
        # a non-zero rank of an external torchrun/srun launch: no output folders of its own (it
        # learns each run folder from rank 0); a sweep's folders go to a scratch folder removed at the end
        if "-m" in argv or "--multirun" in argv:
            scratch = tempfile.mkdtemp(prefix=f"lsgd-rank{env.rank}-sweep-")
            argv = argv + [f"hydra.sweep.dir={scratch}", "hydra.output_subdir=null"]
        else:
            argv = argv + ["hydra.output_subdir=null", "hydra.run.dir=."]

    invalid: list[str] = []  # sweep arms rejected by validation

    @hydra.main(version_base="1.3", config_path=_config_path(), config_name="config")
    def _train(cfg):
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        from lsgd.core.errors import ConfigError
        from lsgd.launch.launcher import run
        from lsgd.launch.status import record_invalid, remove_unstarted

        try:
            return run(cfg)
        except KeyboardInterrupt:  # Ctrl-C before the run folder was made: leave none behind
            if HydraConfig.initialized():
                remove_unstarted(Path(HydraConfig.get().runtime.output_dir))
            raise
        except ConfigError as exc:  # a clear one-line message, no traceback, before any worker
            print(f"lsgd: invalid configuration: {exc}{_debug_experiment_hint(argv)}", file=sys.stderr)
            if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
                # one arm of a sweep: record it as failed with its message, go on with the others
                record_invalid(cfg, Path(HydraConfig.get().runtime.output_dir), exc)
                invalid.append(str(exc))
                return None
            if HydraConfig.initialized():  # a run that never started leaves no folder behind
                remove_unstarted(Path(HydraConfig.get().runtime.output_dir))
            sys.exit(2)

    saved = sys.argv
    # Hydra names the program in its shell-completion script (`complete ... lsgd`) after argv[0]
    completion = any(a in ("-sc", "--shell-completion") for a in argv)
    sys.argv = ["lsgd" if completion else "lsgd train"] + list(argv)
    try:
        _train()
    finally:
        sys.argv = saved
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    if invalid:
        print(f"lsgd: {len(invalid)} sweep job(s) had an invalid configuration (status failed in their "
              "summary.json); the others ran", file=sys.stderr)
        return 2
    return 0


def _sweep_jobs(argv: list[str]) -> int | None:
    """The number of jobs of ``lsgd train -m ARGV`` (the product of the sweeps' lengths; Hydra's
    basic sweeper), or None when it cannot be told (range / interval sweeps)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides([a for a in argv if "=" in a and not a.startswith("-")])
        total = 1
        for o in parsed:
            if o.is_sweep_override() and not o.key_or_group.startswith("hydra"):
                total *= len(list(o.sweep_string_iterator()))
        return total
    except Exception:  # noqa: BLE001 - a count is a courtesy; Hydra reports bad overrides itself
        return None


def _analysis(cmd: str, argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog=f"lsgd {cmd}")
    parser.add_argument("paths", nargs="+", help="run folders, sweep folders or experiment folders")
    parser.add_argument("--out", default=None, help="output folder (default: <first path>/report for report, <first path>/plots for plot)")
    parser.add_argument(
        "--width", choices=("one", "two"), default=None,
        help="figures for a paper: exactly one column (3.25 in) or two columns (6.75 in) wide, fonts "
             "readable at that size (ICML's widths; they fit IEEE and ACM columns); default: 7 x 4.5 in",
    )  # fmt: skip
    if cmd == "report":
        parser.add_argument(
            "--baseline", default="ddp",
            help="the runs speedups are relative to: an algo.name (default: ddp), an arm label as the "
                 "report writes it ('local SGD, H=8') or key=value pairs ('algo.name=local_sgd,algo.local_steps=8')",
        )  # fmt: skip
        parser.add_argument(
            "--threshold", type=float, default=None,
            help="T, the value whose time to reach the speedups compare, in the metric's unit (test accuracy "
                 "in [0, 1], or test perplexity); default: the worst final value among the completed runs "
                 "that did not collapse",
        )  # fmt: skip
    args = parser.parse_args(argv)
    if getattr(args, "threshold", None) is not None and not math.isfinite(args.threshold):
        parser.error(f"--threshold must be a finite number (test accuracy in [0, 1], or test perplexity), got {args.threshold}")
    from pathlib import Path

    missing = [p for p in args.paths if not Path(p).exists()]
    if missing:
        print(f"lsgd {cmd}: no such folder: {', '.join(missing)}", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else Path(args.paths[0]) / ("report" if cmd == "report" else "plots")
    try:
        return _write_analysis(cmd, args, out)
    except (FileNotFoundError, ValueError) as exc:  # no run folder, unreadable runs: the user's input
        print(f"lsgd {cmd}: {exc}", file=sys.stderr)
        return 2


def _write_analysis(cmd: str, args, out) -> int:
    import warnings

    from lsgd.analysis.plots import SparseCurveWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SparseCurveWarning)
        if cmd == "plot":
            from lsgd.analysis.plots import plot_runs

            files = plot_runs(args.paths, out, width=args.width)
            for f in files:
                print(f)
        else:
            from lsgd.analysis.report import write_report

            path = write_report(args.paths, out, baseline=args.baseline, threshold=args.threshold, width=args.width)
            print(f"report written to {path} and {path.with_name('report.html')}")
    for w in caught:  # a figure with dots for curves: one plain line each; others as Python shows them
        if issubclass(w.category, SparseCurveWarning):
            print(f"lsgd {cmd}: warning: {w.message}", file=sys.stderr)
        else:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    return 0


def data(argv: list[str]) -> int:
    """Fetch the dataset ``argv[0]`` (a ``dataset/`` option) with optional ``dataset.*`` overrides."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from lsgd.data import prepare

    from lsgd.core.errors import ConfigError

    if not argv:
        print("usage: lsgd data DATASET [dataset.KEY=VALUE ...]", file=sys.stderr)
        return 2
    _register_resolvers()
    options = _group_options("dataset")
    if argv[0] not in options:
        print(f"lsgd data: unknown dataset {argv[0]!r}; allowed: {', '.join(options)}", file=sys.stderr)
        return 2
    with initialize_config_module(config_module="lsgd.conf", version_base="1.3"):
        cfg = compose("config", overrides=[f"dataset={argv[0]}"] + argv[1:])
    try:
        prepare(OmegaConf.to_container(cfg.dataset, resolve=True))
    except (ConfigError, OSError, RuntimeError) as exc:  # no network, no space, a bad file: one line
        print(f"lsgd data: {argv[0]} could not be prepared: {exc}", file=sys.stderr)
        return 1
    print(f"dataset {argv[0]} ready")
    return 0


def calibrate(argv: list[str]) -> int:
    """``lsgd calibrate [--threads N]``: measure this machine for ``cluster.device=cpu``
    (:func:`lsgd.compute.calibration.calibrate_cpu`) with N torch threads (default: torch's current count) and
    store the figures where that preset reads them (:func:`lsgd.compute.calibration.cpu_profile_path`).
    ``lsgd calibrate --network [--nproc N] [--repeats N]``: measure this host's per-message overhead
    (LogGP's o, ``network.overhead_us``) with N local gloo ranks (default 2; as many as the runs it is
    for: :func:`lsgd.comm.calibration.measure_overhead`) and store it beside
    (:func:`lsgd.comm.calibration.network_profile_path`)."""
    import argparse

    parser = argparse.ArgumentParser(prog="lsgd calibrate", description=calibrate.__doc__)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's current count)")
    parser.add_argument("--network", action="store_true",
                        help="measure this host's per-message overhead o (network.overhead_us) instead of the cpu profile")
    parser.add_argument("--repeats", type=int, default=None,
                        help="with --network: round trips per message size (default 200; 3 sizes, 1 B to 1 KiB)")
    parser.add_argument("--nproc", type=int, default=None,
                        help="with --network: gloo ranks on this host (default 2; as many as the runs it is for)")
    args = parser.parse_args(argv)
    if args.repeats is not None and not args.network:
        parser.error("--repeats is for --network")
    if args.nproc is not None and not args.network:
        parser.error("--nproc is for --network")
    if args.network:
        args.repeats = 200 if args.repeats is None else args.repeats
        if args.threads is not None:
            parser.error("--threads is for the cpu profile; --network runs one torch thread per rank")
        if args.repeats < 1:
            parser.error(f"--repeats must be >= 1, got {args.repeats}")
        args.nproc = 2 if args.nproc is None else args.nproc
        if args.nproc < 2:
            parser.error(f"--nproc must be >= 2, got {args.nproc}")
        return _calibrate_network(args.repeats, args.nproc)

    import torch

    from lsgd.compute.calibration import calibrate_cpu, write_cpu_profile

    if args.threads is not None:
        if args.threads < 1:
            parser.error(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    record = calibrate_cpu()
    path = write_cpu_profile(record)
    curve = ", ".join(f"k={int(k)}: {r / 1e9:.1f}" for k, r in record["matmul_curve"])
    conv = ", ".join(f"c={int(c)}: {r / 1e9:.1f}" for c, r in record["conv_curve"])
    rates = ", ".join(f"{key} {r / 1e9:.2f}" for key, r in record["element_rates"].items())
    print(f"{record['cpu']}, {record['threads']} thread(s): matmul {record['peak_flops'] / 1e9:.1f} GFLOP/s "
          f"(by smallest dimension: {curve}), convolution GFLOP/s ({conv}), memory "
          f"{record['memory_bandwidth'] / 1e9:.1f} GB/s, first touch {record['first_touch_bandwidth'] / 1e9:.2f} GB/s, "
          f"G elements/s ({rates}), per-op overhead {record['launch_s'] * 1e6:.2f} us")
    print(f"written to {path} (cluster.device=cpu reads it; the figures belong to this machine)")
    return 0


def _calibrate_network(repeats: int, nproc: int = 2) -> int:
    """``lsgd calibrate --network``: measure, store and print this host's per-message overhead."""
    from lsgd.comm.calibration import measure_overhead, overhead_line, write_network_profile

    try:
        record = measure_overhead(repeats=repeats, nproc=nproc)
    except RuntimeError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    path = write_network_profile(record)
    one = record["one_way_us"]
    sizes = ", ".join(f"{n} B {us:.1f}" for n, us in record["by_size"].items())
    load = record["loadavg"]
    ar = record["allreduce_us"]
    print(f"{record['cpu']}: {nproc} local gloo ranks, {record['repeats']} of each size "
          f"({', '.join(map(str, record['sizes']))} B); all-reduce of {nproc} ranks median {ar['median']:.1f} us = "
          f"{2 * (nproc - 1)} message steps of 2 o + L: o median {record['overhead_us']:.1f} us, "
          f"p90 {record['overhead_us_p90']:.1f}, mean {record['overhead_us_mean']:.1f} (latency L not separated: "
          f"o + L/2); ping-pong of ranks 0 and 1: one way median {one['median']:.1f} us (by size: {sizes}), "
          f"o {record['pingpong_overhead_us']:.1f} us; load average {'-' if load[0] is None else f'{load[0]:.2f}'}")
    print(f"written to {path} (network.overhead_us=measured reads its median; the figure belongs to this host "
          f"and to {nproc} ranks on it)")
    print(overhead_line(record))
    return 0


def _conf_dir():
    import importlib.resources

    return importlib.resources.files("lsgd.conf")


def _group_options(group: str) -> list[str]:
    """The options of config group ``group`` (its YAML files under conf/), sorted."""
    from lsgd.config.validation import group_options

    return group_options(group)


#: words whose full stop ends no sentence ("Lian et al. 2018")
ABBREVIATIONS = ("et al", "e.g", "i.e", "vs", "cf", "sec", "eq", "alg", "fig", "no")


def describe_option(text: str) -> str:
    """The one-line description of a config file: the first sentence of its leading comment
    (after ``# @package``), wrapped lines joined; empty when it has none."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        body = line[1:].strip()
        if body.startswith("@package"):
            continue
        if not body:
            if lines:
                break
            continue
        lines.append(body)
    words = " ".join(lines)
    for m in re.finditer(r"\.\s", words):  # the first full stop that ends no abbreviation
        if not words[: m.start()].lower().endswith(ABBREVIATIONS):
            return words[: m.start() + 1]
    return words


def list_options(argv: list[str]) -> int:
    """``lsgd list [GROUP ...]``: every option of the named groups (all when none) with its
    description, one per line: for algorithms, models, datasets, optimizers and schedules the
    registry's entry (label, summary, paper; :func:`registry_of`), for the other groups the first
    sentence of the option's YAML comment."""
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `lsgd list | head` ends quietly
    wanted = argv or list(GROUPS)
    unknown = [g for g in wanted if g not in GROUPS and g not in GROUPS.values()]
    if unknown:
        print(f"lsgd list: unknown group {unknown[0]!r}; allowed: {', '.join(GROUPS)}", file=sys.stderr)
        return 2
    for name in wanted:
        group = GROUPS.get(name, name)
        options = _group_options(group)
        registry = registry_of(group)
        print(f"{name} ({group}=...):")
        width = max(map(len, options), default=0)
        for option in options:
            if registry is not None and option in registry:
                entry = registry.entry(option)
                text = entry.summary
                if not text:  # the option's YAML header says it
                    text = describe_option((_conf_dir() / group / f"{option}.yaml").read_text())
                elif entry.label and entry.label != option and not text.lower().startswith(entry.label.lower()):
                    text = f"{entry.label}: {text}"
                if entry.paper:
                    text += f" [{entry.paper}]"
            else:
                text = describe_option((_conf_dir() / group / f"{option}.yaml").read_text())
            print(f"  {option:{width}s}  {text}")
    return 0


def registry_of(group: str):
    """The registry (:mod:`lsgd.core.registry`) whose names a config group's options are, or None for
    groups that are only presets (experiments, variants, networks, launchers, loggers, debug)."""
    if group == "algo":
        from lsgd.algorithms import ALGORITHMS

        return ALGORITHMS
    if group == "model":
        from lsgd.models import MODELS

        return MODELS
    if group == "dataset":
        from lsgd.data import DATASETS

        return DATASETS
    if group in ("optim", "schedule"):
        from lsgd.training.optim import OPTIMIZERS, SCHEDULES

        return OPTIMIZERS if group == "optim" else SCHEDULES
    return None


def version() -> str:
    """``lsgd <version>`` plus ``(commit <short>[+dirty])`` in a git checkout."""
    from lsgd.training.provenance import lsgd_info

    info = lsgd_info()
    commit = info.get("commit_short")
    return f"lsgd {info.get('version')}" + (f" (commit {commit}{'+dirty' if info.get('dirty') else ''})" if commit else "")


def main(argv: list[str] | None = None) -> int:
    """``lsgd ARGV``; returns the exit code. Ctrl-C outside a run's training loop (which stops at
    its next step with a checkpoint: lsgd.training.preemption) prints one line and returns 130."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print("lsgd: interrupted (SIGINT)", file=sys.stderr, flush=True)
        return 130


def _main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "--version":
        print(version())
        return 0
    if cmd in ("-sc", "--shell-completion"):
        # Hydra's completion script calls the program itself (`lsgd -sc query=bash`) with the line
        # typed so far in COMP_LINE: complete it as `lsgd train`'s overrides
        line = os.environ.get("COMP_LINE", "").split(" ", 2)
        if len(line) >= 2 and line[1] == "train":
            os.environ["COMP_LINE"] = " ".join([line[0]] + line[2:])
        return train(argv)
    if cmd == "train":
        return train(rest)
    if cmd in ("plot", "report"):
        return _analysis(cmd, rest)
    if cmd == "data":
        return data(rest)
    if cmd == "list":
        return list_options(rest)
    if cmd == "calibrate":
        return calibrate(rest)
    if cmd == "emulate":  # issue 23 (lsgd.launch.emulate)
        from lsgd.launch.emulate import main as emulate_main

        return emulate_main(rest)
    print(f"lsgd: unknown command {cmd!r}; allowed: train, plot, report, data, list, calibrate, emulate, --version\n\n{USAGE}",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
