"""The papers' time claims in measured wall-clock time on the emulated 100 Mbit/s link (issue 23).

Runs the arms of :data:`lsgd.analysis.time_claims.STUDIES` one at a time on the emulated cluster
(``launcher=emulated``, every worker in its own network namespace; needs root), recording the
load average before and after each run, and writes the table of :mod:`lsgd.analysis.time_claims`
(its docstring says how evaluation time is taken out of the wall time) to ``--out``/time_claims.md.
``--from-runs`` only tabulates earlier run folders.

    python scripts/time_claims.py --study demo,swarm,swarm8,swarm8_fine,async --out results/time_claims   # as root, ~35 min
    python scripts/time_claims.py --study demo,swarm --out results/time_claims seed=1          # a second seed
    python scripts/time_claims.py --from-runs results/time_claims/runs --out results/time_claims --target async=14
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from lsgd.analysis.time_claims import COMMON, DEFAULT_TARGETS, STUDIES, table


def run_arm(name: str, overrides: tuple[str, ...], runs: Path, extra: list[str]) -> dict:
    cmd = [sys.executable, "-m", "lsgd.cli", "train", *overrides, *COMMON, f"results_dir={runs}",
           f"experiment_name={name}", *extra]
    load0 = Path("/proc/loadavg").read_text().split()[:3]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    out = {"arm": name, "cmd": "lsgd train " + " ".join(cmd[4:]), "rc": proc.returncode,
           "load_before": load0, "load_after": Path("/proc/loadavg").read_text().split()[:3],
           "launch_s": time.perf_counter() - t0}
    print(json.dumps(out), flush=True)
    if proc.returncode:
        print(proc.stderr[-3000:], file=sys.stderr)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--study", default="demo", help=f"comma-separated: {', '.join(STUDIES)}")
    p.add_argument("--arms", default=None, help="comma-separated arm names (default: every arm of the studies)")
    p.add_argument("--out", type=Path, default=Path("results/time_claims"))
    p.add_argument("--from-runs", type=Path, default=None, help="only tabulate these run folders")
    p.add_argument("--target", action="append", default=[], help="STUDY_OR_ARM=VALUE (test_acc, or test_ppl)")
    p.add_argument("--stop-at", default=None, help="HH:MM (UTC): start no run after this time")
    p.add_argument("extra", nargs="*", help="more lsgd train overrides for every run")
    a = p.parse_args(argv)
    targets = dict(DEFAULT_TARGETS)
    targets.update({k: float(v) for k, v in (t.split("=", 1) for t in a.target)})
    runs = a.from_runs or a.out / "runs"
    if a.from_runs is None:
        if os.geteuid() != 0:
            print("the emulated launcher needs root", file=sys.stderr)
            return 2
        runs.mkdir(parents=True, exist_ok=True)
        wanted = set(a.arms.split(",")) if a.arms else None
        with open(a.out / "launches.jsonl", "a") as f:
            for study in a.study.split(","):
                for name, ov in STUDIES[study].items():
                    if a.stop_at and time.strftime("%H:%M", time.gmtime()) >= a.stop_at:
                        print(f"{a.stop_at} UTC passed: {name} not started", flush=True)
                        continue
                    if wanted is None or name in wanted:
                        f.write(json.dumps(run_arm(name, ov, runs, a.extra)) + "\n")
    md = table(runs, targets)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "time_claims.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
