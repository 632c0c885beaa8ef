"""Regenerate the golden files ``tests/golden/<case>.json`` and print what changed.

    python scripts/make_golden.py                  # every case; writes the files
    python scripts/make_golden.py --only ddp gravac_dense
    python scripts/make_golden.py --check          # compare with the stored files, write nothing
    python scripts/make_golden.py --list           # the cases, their world sizes and overrides

The goldens record per-step training losses and final-parameter checksums of tiny real runs of
every algorithm (``tests/golden/cases.py`` defines the cases and says what they guard);
``tests/distributed/test_golden.py`` requires them bit for bit. Regenerate them only for a change
that is meant to move the numerics, and say why in the commit message. Run from any directory:
the script imports ``lsgd`` from the repository it belongs to and refuses to record numbers from
another checkout.

Exit status: 0, or 1 with ``--check`` when a case differs from (or lacks) its stored file.
"""

from __future__ import annotations

import argparse
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
    args = parser.parse_args(argv)

    if args.list:
        for c in cases.CASES:
            print(f"{c.name:24s} world {c.world_size}  {' '.join(c.overrides)}" + (f"  ({c.note})" if c.note else ""))
        return 0
    _check_sources()
    names = args.only or [c.name for c in cases.CASES]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="lsgd-golden-") as work:
        results = cases.run_cases(names, Path(work), log=print)
    print(f"ran {len(results)} case(s) in {time.perf_counter() - t0:.1f} s\n")

    counts = {"unchanged": 0, "changed": 0, "new": 0}
    for name in names:
        record = results[name]
        stored = cases.load_golden(name)
        if stored is None:
            counts["new"] += 1
            print(f"NEW        {name}")
        else:
            diffs = cases.differences(stored, record)
            if diffs:
                counts["changed"] += 1
                print(f"CHANGED    {name}")
                for line in diffs:
                    print(f"    {line}")
                env = cases.environment_mismatch(stored)
                if env:
                    print(f"    (the stored file comes from another environment: {env})")
            else:
                counts["unchanged"] += 1
                print(f"unchanged  {name}")
        if not args.check:
            for path in cases.save_golden(record):
                print(f"    deleted {path.relative_to(cases.GOLDEN_DIR)}: another environment's numbers, now stale")
    stale = sorted(set(cases.stored_names()) | set(cases.stored_env_names()))
    stale = [name for name in stale if name not in cases.CASES_BY_NAME]
    for name in stale:
        print(f"STALE      {name}: {cases.golden_path(name)} (or its envs/ copies) has no case in cases.py; delete it")
    summary = ", ".join(f"{n} {k}" for k, n in counts.items())
    where = cases.golden_path(names[0]) if names else cases.GOLDEN_DIR
    print(f"\n{summary}" + ("" if args.check else f"; files written beside {where.relative_to(cases.GOLDEN_DIR.parents[1])}"))
    if args.check and (counts["changed"] or counts["new"] or stale):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
