"""The benchmarks' convention: every bench script (``scripts/bench_*.py``) ends with one line per
figure, ``BENCH <figure> <now> <op> <goal>`` (``<op>`` is ``<=`` or ``>=``); ``make bench``
(``scripts/bench_all.py``) collects those lines (:func:`parse_bench_line`) and prints one table,
figure | goal | now | met | script (:func:`summary`), with the scripts that failed.
"""

from __future__ import annotations

from dataclasses import dataclass

#: the comparisons a BENCH line may state
OPS = ("<=", ">=")


@dataclass
class Figure:
    """One BENCH line: figure ``name``, its value ``now``, the comparison ``op`` with ``goal``, and the
    ``script`` that printed it."""

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


def summary(figures: list[Figure], errors: dict[str, str]) -> str:
    """The table of ``figures`` (one row each) and of the scripts in ``errors`` (``{script: why it
    failed}``, one ``FAILED`` row each), columns aligned."""
    rows = [["figure", "goal", "now", "met", "script"]]
    rows += [[f.name, f"{f.op} {f.goal:g}", f"{f.now:.3g}", "yes" if f.met else "NO", f.script] for f in figures]
    rows += [[f"({script})", "", "", "FAILED: " + why, script] for script, why in errors.items()]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [" | ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "-|-".join("-" * w for w in widths))
    return "\n".join(lines)
