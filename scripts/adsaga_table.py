"""Suboptimality table (and figure) of an ``adsaga`` study: the metric ``lsgd report`` does not show.

    python scripts/adsaga_table.py results/adsaga_logreg [--figure]

Prints the table of :mod:`lsgd.analysis.suboptimality` (its docstring defines the columns): one
markdown row per run folder under the folder. ``--figure`` writes
``<folder>/adsaga_suboptimality.png``: suboptimality vs server iterations and vs gradients (log y).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lsgd.analysis.suboptimality import FIGURE_FILE, load, suboptimality_figure, suboptimality_table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--figure", action="store_true")
    args = parser.parse_args()
    runs = load(args.folder)
    if not runs:
        raise SystemExit(f"no run with suboptimality records under {args.folder}")
    print(suboptimality_table(runs))
    if args.figure:
        out = suboptimality_figure(runs, args.folder / FIGURE_FILE)
        print(f"figure: {out}")


if __name__ == "__main__":
    main()
