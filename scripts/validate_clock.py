"""Hold the cluster clock (``modeled_time_s``) against measured time on the emulated cluster (issue 23).

Trains each arm of :data:`lsgd.analysis.clock_validation.ARMS` at each bandwidth (default 50, 200
and 1000 Mbit/s) and worker count (``--workers``, default 4), one ``lsgd train`` per run, one run
after another (needs root). The clock prices the host's per-message overhead (LogGP's o,
``network.overhead_us``): by default the study measures it first (``lsgd calibrate --network
--nproc R`` for each number of ranks R it runs, on the same host, with small all-reduces and no
training: the calibration is not fitted to the runs it is held against) and records it in
``calibration.json``; ``--overhead 0`` runs the clock without it. It writes the
table of :mod:`lsgd.analysis.clock_validation` (its docstring defines the window, measured, modeled
and error) under ``--out``: ``runs/`` (the run folders), ``validation.csv``, ``validation.md`` and
``validation_modeled_vs_measured.{png,pdf}``. ``--from-runs`` re-analyses the run folders of an
earlier study without running.

    python scripts/validate_clock.py --out results/clock_validation_study --workers 4,8   # as root, ~45 min
    python scripts/validate_clock.py --arms ddp,dpsgd_ring --bandwidths 50 --out /tmp/v
    python scripts/validate_clock.py --from-runs results/clock_validation_study/runs --out results/clock_validation_study
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from lsgd.analysis.clock_validation import (
    ARMS,
    DEFAULT_BANDWIDTHS_MBIT,
    DEFAULT_WORKERS,
    Arm,
    Result,
    analyse,
    arm_overrides,
    from_runs,
    markdown,
    ranks_of,
    run_name,
    write,
)


def run_dir_of(stderr: str) -> Path | None:
    """The run folder ``lsgd train`` printed (``lsgd: ... run folder <path>``)."""
    m = re.search(r"run folder (\S+)", stderr)
    return Path(m.group(1)) if m else None


def run_one(arm: Arm, mbit: float, runs: Path, steps: int | None, extra: list[str], timeout_s: float,
            workers: int = DEFAULT_WORKERS, overhead_us: float | None = None) -> Result:
    """Train one arm at ``mbit`` Mbit/s with ``workers`` workers on the emulated cluster, the clock
    pricing ``overhead_us`` per message end (None: the config's); its row."""
    o = [] if overhead_us is None else [f"network.overhead_us={overhead_us:.1f}"]
    cmd = [sys.executable, "-m", "lsgd.cli", "train", "experiment=clock_validation", *arm_overrides(arm, workers),
           f"network.bandwidth_gbps={mbit / 1000:g}", f"max_steps={steps or arm.steps}", f"results_dir={runs}",
           f"experiment_name={run_name(arm.name, mbit, workers)}", *o, *extra]
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        err, code = proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        err, code = (exc.stderr or b"").decode() if isinstance(exc.stderr, bytes) else (exc.stderr or ""), -1
    res = Result(arm.name, arm.label, mbit, "", "failed", workers=workers, load_before=load0,
                 load_after=os.getloadavg()[0])
    res.extra["launch_s"] = time.perf_counter() - t0
    run = run_dir_of(err)
    if run is None or code != 0:
        res.status = f"failed (exit {code})"
        print(f"  {arm.name} at {mbit:g} Mbit/s failed (exit {code}):\n{err[-2000:]}", file=sys.stderr)
        if run is not None:
            res.run_dir = str(run)
        return res
    return analyse(run, res)


def calibrate(ranks: int, out: Path) -> dict:
    """``lsgd calibrate --network --nproc ranks`` (:func:`lsgd.comm.calibration.measure_overhead`):
    the record, also kept in ``out/calibration.json`` by rank count."""
    from lsgd.comm.calibration import measure_overhead
    from lsgd.core.files import write_atomic

    record = measure_overhead(nproc=ranks)
    print(f"calibrated with {ranks} ranks: network.overhead_us={record['overhead_us']:.1f} "
          f"(p90 {record['overhead_us_p90']:.1f}, load {record['loadavg'][0]:.1f})", flush=True)
    path = out / "calibration.json"
    out.mkdir(parents=True, exist_ok=True)
    known = json.loads(path.read_text()) if path.exists() else {}
    known[str(ranks)] = record
    write_atomic(path, json.dumps(known, indent=1))
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("results/clock_validation_study"))
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of: {', '.join(ARMS)}")
    parser.add_argument("--bandwidths", default=",".join(map(str, DEFAULT_BANDWIDTHS_MBIT)), help="Mbit/s, comma-separated")
    parser.add_argument("--steps", type=int, default=None, help="max_steps of every arm (default: each arm's)")
    parser.add_argument("--workers", default=str(DEFAULT_WORKERS),
                        help="workers per run, comma-separated (every arm at each; a server rank on top where there is one)")
    parser.add_argument("--overhead", default="calibrate",
                        help="network.overhead_us of the runs: calibrate (default: `lsgd calibrate --network --nproc R` "
                             "for each rank count R of the study, before its runs, recorded in calibration.json), "
                             "config (the experiment's: 0), or a number in us")
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
        workers = [int(w) for w in args.workers.split(",")]
        if any(w < 2 for w in workers):
            parser.error(f"--workers must be >= 2 each, got {args.workers}")
        if args.overhead not in ("calibrate", "config"):
            try:
                fixed_o = float(args.overhead)
            except ValueError:
                parser.error(f"--overhead must be calibrate, config or a number of us, got {args.overhead!r}")
        if args.dry_run:
            for w in workers:
                for a in arms:
                    for b in bws:
                        print(a, f"{w} workers", f"{b:g} Mbit/s", " ".join(arm_overrides(ARMS[a], w)),
                              f"max_steps={args.steps or ARMS[a].steps}")
            return 0
        if os.geteuid() != 0:
            parser.error("the emulated cluster needs root")
        results = []
        t0 = time.perf_counter()
        print(f"load average at start: {os.getloadavg()}", flush=True)
        calibrations: dict[int, dict] = {}
        for w in workers:
            for a in arms:
                ranks = ranks_of(ARMS[a], w)
                if args.overhead == "calibrate" and ranks not in calibrations:
                    calibrations[ranks] = calibrate(ranks, args.out)
                o = (calibrations[ranks]["overhead_us"] if args.overhead == "calibrate"
                     else None if args.overhead == "config" else fixed_o)
                for b in bws:
                    r = run_one(ARMS[a], b, args.out / "runs", args.steps, args.extra, args.timeout, w, o)
                    results.append(r)
                    print(f"{a:18s} w{w} {b:6g} Mbit/s  measured {r.measured_s:8.3f} s  modeled {r.modeled_s:8.3f} s  "
                          f"error {100 * r.error:+6.1f}%  ({r.extra.get('launch_s', 0):.0f} s, load {r.load_before:.1f})",
                          flush=True)
                    write(results, args.out)
        print(f"load average at end: {os.getloadavg()}; {time.perf_counter() - t0:.0f} s in all", flush=True)
    verdict = write(results, args.out)
    print(markdown(results, verdict))
    return 0


if __name__ == "__main__":
    sys.exit(main())
