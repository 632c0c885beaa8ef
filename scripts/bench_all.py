"""Run every benchmark that measures a speed goal and print one summary table (``make bench``).

    python scripts/bench_all.py [--only overhead adasum compression gossip data] [--timeout 600]

Each script runs in its own process, one after another (never two at once: they time this machine),
with the arguments of :data:`SCRIPTS`; its output is shown as it comes. Every script ends with one
line per figure, ``BENCH <figure> <now> <op> <goal>`` (``<op>`` is ``<=`` or ``>=``); this script
collects those lines and prints

    figure | goal | now | met | script

plus the load average before and after and the total time (budget: 10 minutes on the 2-core
machine). Each figure is a ratio or a per-element time measured side by side with its comparator
in the same run, as a median over at least 5 repeats (see each script's docstring). A script that
fails or prints no BENCH line is reported as such and makes the exit status 1; a goal not met does
not (the table says so).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))

#: (short name, script, arguments): what ``make bench`` runs, in this order
SCRIPTS = [
    ("overhead", "bench_overhead.py", []),
    ("adasum", "bench_adasum.py", []),
    ("compression", "bench_compression.py", ["--figures"]),
    ("gossip", "bench_gossip.py", ["--lattice"]),
    ("data", "bench_data.py", []),
]
OPS = ("<=", ">=")


@dataclass
class Figure:
    name: str
    now: float
    op: str
    goal: float
    script: str

    @property
    def met(self) -> bool:
        return self.now <= self.goal if self.op == "<=" else self.now >= self.goal


def parse_bench_line(line: str, script: str) -> Figure | None:
    """The figure of a ``BENCH <name> <now> <op> <goal>`` line, or None for any other line.

    Raises:
        ValueError: a line starting with ``BENCH`` that does not follow the convention.
    """
    parts = line.split()
    if not parts or parts[0] != "BENCH":
        return None
    if len(parts) != 5 or parts[3] not in OPS:
        raise ValueError(f"{script}: malformed BENCH line {line.strip()!r} (want 'BENCH <name> <now> <= or >= <goal>')")
    return Figure(parts[1], float(parts[2]), parts[3], float(parts[4]), script)


def run_script(script: str, args: list[str], timeout: float) -> tuple[list[Figure], str | None]:
    """Run ``scripts/<script> args`` with this interpreter, echoing its output; its figures and an
    error message (None when it exited 0 and printed at least one BENCH line)."""
    cmd = [sys.executable, os.path.join(HERE, script), *args]
    print(f"\n=== {' '.join([os.path.join('scripts', script), *args])}", flush=True)
    figures: list[Figure] = []
    error = None
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    timer = threading.Timer(timeout, proc.kill)  # a silent hang ends too
    timer.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            print(line, end="", flush=True)
            try:
                fig = parse_bench_line(line, script)
            except ValueError as exc:
                error = str(exc)
                continue
            if fig is not None:
                figures.append(fig)
        proc.wait()
    finally:
        timed_out = not timer.is_alive() and proc.returncode not in (0, None) and proc.returncode < 0
        timer.cancel()
    if timed_out:
        return figures, f"killed after {timeout:.0f} s"
    if proc.returncode != 0:
        return figures, f"exited with status {proc.returncode}"
    if not figures and error is None:
        error = "printed no BENCH line"
    return figures, error


def summary(figures: list[Figure], errors: dict[str, str]) -> str:
    rows = [["figure", "goal", "now", "met", "script"]]
    rows += [[f.name, f"{f.op} {f.goal:g}", f"{f.now:.3g}", "yes" if f.met else "NO", f.script] for f in figures]
    rows += [[f"({script})", "", "", "FAILED: " + why, script] for script, why in errors.items()]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [" | ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "-|-".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="+", choices=[s[0] for s in SCRIPTS], help="run only these scripts")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per script before it is killed")
    args = ap.parse_args(argv)
    chosen = [s for s in SCRIPTS if not args.only or s[0] in args.only]
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    figures: list[Figure] = []
    errors: dict[str, str] = {}
    for _, script, script_args in chosen:
        got, error = run_script(script, script_args, args.timeout)
        figures += got
        if error:
            errors[script] = error
    total = time.perf_counter() - t0
    print(f"\n=== summary ({len(figures)} figures, {total:.0f} s; load average {load0:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after, {os.cpu_count()} cores)")
    print(summary(figures, errors))
    met = sum(f.met for f in figures)
    print(f"{met} of {len(figures)} goals met" + (f"; {len(errors)} script(s) failed" if errors else ""))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
