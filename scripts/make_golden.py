"""Regenerate the golden files ``tests/golden/<case>.json`` and print what changed.

    python scripts/make_golden.py                  # every case; writes the files
    python scripts/make_golden.py --only ddp gravac_dense
    python scripts/make_golden.py --check          # compare with the stored files, write nothing
    python scripts/make_golden.py --list           # the cases, their world sizes and overrides
    python scripts/make_golden.py --check --inprocess   # the ranks as in-process workers
    ATEN_CPU_CAPABILITY=avx2 python scripts/make_golden.py --check   # another kernel family

The goldens record per-step training losses, the final record's counters and a fingerprint of the
final parameters (per-tensor sums and norms) of tiny real float64 runs of every algorithm
(``tests/golden/cases.py`` defines the cases and says what they guard);
``tests/distributed/test_golden.py`` requires them within a relative tolerance of 1e-9 on any
machine (byte counts and the modeled time exactly). Regenerate them only for a change
that is meant to move the numerics, and say why in the commit message. Run from any directory:
the script imports ``lsgd`` from the repository it belongs to and refuses to record numbers from
another checkout.

Exit status: 0, or 1 with ``--check`` when a case differs from (or lacks) its stored file.
"""

from __future__ import annotations

import argparse
import json
import importlib.resources
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "golden"))

import cases  # noqa: E402  (tests/golden/cases.py; it puts the repository first on sys.path)


def _check_sources() -> None:
    """Refuse to record numbers computed by an lsgd (or its configs) outside this repository."""
    import lsgd

    where = {
        "lsgd": Path(lsgd.__file__).resolve().parent,
        "lsgd.conf": Path(str(importlib.resources.files("lsgd.conf"))).resolve(),
    }
    for name, path in where.items():
        if not path.is_relative_to(cases.REPO.resolve()):
            sys.exit(f"make_golden: {name} resolves to {path}, outside {cases.REPO}; the goldens must come from this checkout")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make_golden.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", metavar="CASE", choices=sorted(cases.CASES_BY_NAME),
                        help="run only these cases (default: all)")
    parser.add_argument("--check", action="store_true", help="compare with the stored files; write nothing")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    parser.add_argument("--inprocess", action="store_true",
                        help="run the ranks as an in-process cluster's workers (lsgd.comm.inprocess), not gloo processes")
    parser.add_argument("--json", metavar="PATH", help="also write this run's records ({case: record}) to PATH")
    parser.add_argument("--rtol", type=float, default=cases.RTOL,
                        help=f"relative tolerance of the comparison (default {cases.RTOL:g}; 0: exact)")
    args = parser.parse_args(argv)

    if args.list:
        for c in cases.CASES:
            print(f"{c.name:24s} world {c.world_size}  {' '.join(c.overrides)}" + (f"  ({c.note})" if c.note else ""))
        return 0
    _check_sources()
    names = args.only or [c.name for c in cases.CASES]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="lsgd-golden-") as work:
        results = cases.run_cases(names, Path(work), log=print, inprocess=args.inprocess)
    print(f"ran {len(results)} case(s) in {time.perf_counter() - t0:.1f} s\n")
    if args.json:
        Path(args.json).write_text(json.dumps(results))

    counts = {"unchanged": 0, "changed": 0, "new": 0}
    for name in names:
        record = results[name]
        stored = cases.load_golden(name)
        if stored is None:
            counts["new"] += 1
            print(f"NEW        {name}")
        elif stored.get("format") != cases.FORMAT_VERSION:
            counts["changed"] += 1
            print(f"CHANGED    {name}: stored in format {stored.get('format')}, now {cases.FORMAT_VERSION}")
        else:
            diffs = cases.differences(stored, record, args.rtol)
            if diffs:
                counts["changed"] += 1
                print(f"CHANGED    {name}")
                for line in diffs:
                    print(f"    {line}")
            else:
                counts["unchanged"] += 1
                print(f"unchanged  {name}")
        if not args.check:
            cases.save_golden(record)
    stale = [name for name in cases.stored_names() if name not in cases.CASES_BY_NAME]
    for name in stale:
        print(f"STALE      {name}: {cases.golden_path(name)} has no case in cases.py; delete it")
    summary = ", ".join(f"{n} {k}" for k, n in counts.items())
    where = cases.golden_path(names[0]) if names else cases.GOLDEN_DIR
    print(f"\n{summary}" + ("" if args.check else f"; files written beside {where.relative_to(cases.GOLDEN_DIR.parents[1])}"))
    if args.check and (counts["changed"] or counts["new"] or stale):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
