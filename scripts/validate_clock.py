"""Hold the cluster clock (``modeled_time_s``) against measured time on the emulated cluster (issue 23).

Trains each arm of :data:`lsgd.analysis.clock_validation.ARMS` at each bandwidth (default 50, 200
and 1000 Mbit/s), one ``lsgd train`` per run, one run after another (needs root), and writes the
table of :mod:`lsgd.analysis.clock_validation` (its docstring defines the window, measured, modeled
and error) under ``--out``: ``runs/`` (the run folders), ``validation.csv``, ``validation.md`` and
``validation_modeled_vs_measured.{png,pdf}``. ``--from-runs`` re-analyses the run folders of an
earlier study without running.

    python scripts/validate_clock.py --out results/clock_validation_study            # as root, ~20 min
    python scripts/validate_clock.py --arms ddp,dpsgd_ring --bandwidths 50 --out /tmp/v
    python scripts/validate_clock.py --from-runs results/clock_validation_study/runs --out results/clock_validation_study
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from lsgd.analysis.clock_validation import (
    ARMS,
    DEFAULT_BANDWIDTHS_MBIT,
    Arm,
    Result,
    analyse,
    from_runs,
    markdown,
    write,
)


def run_dir_of(stderr: str) -> Path | None:
    """The run folder ``lsgd train`` printed (``lsgd: ... run folder <path>``)."""
    m = re.search(r"run folder (\S+)", stderr)
    return Path(m.group(1)) if m else None


def run_one(arm: Arm, mbit: float, runs: Path, steps: int | None, extra: list[str], timeout_s: float) -> Result:
    """Train one arm at ``mbit`` Mbit/s on the emulated cluster; its row."""
    cmd = [sys.executable, "-m", "lsgd.cli", "train", "experiment=clock_validation", *arm.overrides,
           f"network.bandwidth_gbps={mbit / 1000:g}", f"max_steps={steps or arm.steps}", f"results_dir={runs}",
           f"experiment_name={arm.name}_{mbit:g}mbit", *extra]
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        err, code = proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        err, code = (exc.stderr or b"").decode() if isinstance(exc.stderr, bytes) else (exc.stderr or ""), -1
    res = Result(arm.name, arm.label, mbit, "", "failed", load_before=load0, load_after=os.getloadavg()[0])
    res.extra["launch_s"] = time.perf_counter() - t0
    run = run_dir_of(err)
    if run is None or code != 0:
        res.status = f"failed (exit {code})"
        print(f"  {arm.name} at {mbit:g} Mbit/s failed (exit {code}):\n{err[-2000:]}", file=sys.stderr)
        if run is not None:
            res.run_dir = str(run)
        return res
    return analyse(run, res)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("results/clock_validation_study"))
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of: {', '.join(ARMS)}")
    parser.add_argument("--bandwidths", default=",".join(map(str, DEFAULT_BANDWIDTHS_MBIT)), help="Mbit/s, comma-separated")
    parser.add_argument("--steps", type=int, default=None, help="max_steps of every arm (default: each arm's)")
    parser.add_argument("--warmup-step", type=int, default=8, help="the window starts at the first record at or after this step")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per run")
    parser.add_argument("--from-runs", type=Path, default=None, help="analyse these run folders instead of running")
    parser.add_argument("--dry-run", action="store_true", help="print the runs, run nothing")
    parser.add_argument("extra", nargs="*", help="more lsgd train overrides for every run (e.g. launcher.nproc_per_node=8)")
    args = parser.parse_args(argv)
    if args.from_runs is not None:
        results = from_runs(args.from_runs, args.warmup_step)
    else:
        arms = [a.strip() for a in args.arms.split(",") if a.strip()]
        unknown = [a for a in arms if a not in ARMS]
        if unknown:
            parser.error(f"unknown arm(s) {', '.join(unknown)}; allowed: {', '.join(ARMS)}")
        bws = [float(b) for b in args.bandwidths.split(",")]
        if args.dry_run:
            for a in arms:
                for b in bws:
                    print(a, f"{b:g} Mbit/s", " ".join(ARMS[a].overrides), f"max_steps={args.steps or ARMS[a].steps}")
            return 0
        if os.geteuid() != 0:
            parser.error("the emulated cluster needs root")
        results = []
        t0 = time.perf_counter()
        print(f"load average at start: {os.getloadavg()}", flush=True)
        for a in arms:
            for b in bws:
                r = run_one(ARMS[a], b, args.out / "runs", args.steps, args.extra, args.timeout)
                results.append(r)
                print(f"{a:18s} {b:6g} Mbit/s  measured {r.measured_s:8.3f} s  modeled {r.modeled_s:8.3f} s  "
                      f"error {100 * r.error:+6.1f}%  ({r.extra.get('launch_s', 0):.0f} s, load {r.load_before:.1f})",
                      flush=True)
                write(results, args.out)
        print(f"load average at end: {os.getloadavg()}; {time.perf_counter() - t0:.0f} s in all", flush=True)
    verdict = write(results, args.out)
    print(markdown(results, verdict))
    return 0


if __name__ == "__main__":
    sys.exit(main())
