"""Run every benchmark that measures a speed goal and print one summary table (``make bench``).

    python scripts/bench_all.py [--only overhead adasum compression gossip data inprocess] [--timeout 600]

Each script runs in its own process, one after another (never two at once: they time this machine),
with the arguments of :data:`SCRIPTS`; its output is shown as it comes. Every script ends with one
line per figure, ``BENCH <figure> <now> <op> <goal>`` (``<op>`` is ``<=`` or ``>=``); this script
collects those lines and prints (:mod:`lsgd.analysis.bench`)

    figure | goal | now | met | script

plus the load average before and after and the total time (budget: 10 minutes on the 2-core
machine). A whole run (no ``--only``, no ``--no-docs``) also writes the table, with this machine and
the date, into docs/benchmarks.md between its two marker lines (:data:`BEGIN`, :data:`END`),
atomically, leaving the page's prose around it as it is: the benchmarks page always shows the
latest run. Each figure is a ratio or a per-element time measured side by side with its comparator
in the same run, as a median over at least 5 repeats (see each script's docstring). A script that
fails or prints no BENCH line is reported as such and makes the exit status 1; a goal not met does
not (the table says so).
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone

from lsgd.analysis.bench import Figure, parse_bench_line, summary
from lsgd.core.files import write_atomic

HERE = os.path.dirname(os.path.abspath(__file__))
#: the page whose table a whole run rewrites, and the marker lines around that table
DOCS_PAGE = os.path.join(HERE, "..", "docs", "benchmarks.md")
BEGIN = "<!-- make bench: begin (scripts/bench_all.py writes the table between these markers) -->"
END = "<!-- make bench: end -->"

#: (short name, script, arguments): what ``make bench`` runs, in this order
SCRIPTS = [
    ("overhead", "bench_overhead.py", []),
    ("adasum", "bench_adasum.py", []),
    ("compression", "bench_compression.py", ["--figures"]),
    ("gossip", "bench_gossip.py", ["--lattice"]),
    ("data", "bench_data.py", []),
    ("inprocess", "bench_inprocess.py", []),
]


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


def machine() -> str:
    """This machine in words for the benchmarks page: the CPU model (/proc/cpuinfo's ``model name``,
    else :func:`platform.processor`) and its logical cores, e.g. ``AMD EPYC, 2 cores``."""
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    return f"{model or platform.processor() or platform.machine()}, {os.cpu_count()} cores"


def docs_table(figures: list[Figure], errors: dict[str, str], machine: str, date: str) -> str:
    """The Markdown table of docs/benchmarks.md: figure | goal | value | met | machine | date, one row
    per figure (values to 4 significant digits), a row per failed script, then the count of goals met."""
    rows = ["| figure | goal | value | met | machine | date |", "|---|---|---|---|---|---|"]
    rows += [f"| `{f.name}` | {f.op} {f.goal:g} | {f.now:.4g} | {'yes' if f.met else '**no**'} | {machine} | {date} |"
             for f in figures]
    rows += [f"| ({script}) | | | FAILED: {why} | {machine} | {date} |" for script, why in errors.items()]
    met = sum(f.met for f in figures)
    return "\n".join(rows) + f"\n\n{met} of {len(figures)} goals met.\n"


def replace_between_markers(text: str, table: str) -> str:
    """``text`` with everything between the :data:`BEGIN` and :data:`END` lines replaced by ``table``.

    Raises:
        ValueError: the markers are missing, or END comes before BEGIN.
    """
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"the page has no {BEGIN!r} ... {END!r} block for the table")
    return text[: start + len(BEGIN)] + "\n\n" + table + "\n" + text[end:]


def write_docs_table(table: str, path: str = DOCS_PAGE) -> None:
    """Put ``table`` between the markers of ``path`` (docs/benchmarks.md), written atomically."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    write_atomic(path, replace_between_markers(text, table))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="+", choices=[s[0] for s in SCRIPTS], help="run only these scripts")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per script before it is killed")
    ap.add_argument("--no-docs", action="store_true", help="do not write the table into docs/benchmarks.md")
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
    if not args.only and not args.no_docs:  # a partial run would replace the whole table with part of it
        date = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        try:
            write_docs_table(docs_table(figures, errors, machine(), date))
            print(f"table written to {os.path.relpath(DOCS_PAGE)}")
        except (OSError, ValueError) as exc:
            print(f"docs/benchmarks.md not written: {exc}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
