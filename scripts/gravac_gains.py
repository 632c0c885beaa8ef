"""The compression gains GraVAC's controller saw, per arm and per compression factor: what its
epsilon rule and its theta_min raise (Algorithm 1 of Tyagi and Swany 2023) decided on.

    python scripts/gravac_gains.py results/gravac_lstm_text [results/gravac_fmnist ...] [--skip 0]

Prints the two markdown tables of :mod:`lsgd.analysis.gravac_gains` (its docstring defines
them) for every ``gravac`` run under the folders; ``--skip N`` leaves out each run's first N
steps (the EWMA's start-up).
"""

from __future__ import annotations

import argparse

from lsgd.analysis.gravac_gains import markdown, summarize
from lsgd.analysis.load import read_runs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", help="run, sweep or experiment folders")
    parser.add_argument("--skip", type=int, default=0, help="leave out each run's first N steps")
    args = parser.parse_args(argv)
    gains, decisions = summarize(read_runs(args.paths), args.skip)
    if not gains:
        raise SystemExit(f"no gravac run with compression rows under {', '.join(args.paths)}")
    print(markdown(gains, decisions))


if __name__ == "__main__":
    main()
