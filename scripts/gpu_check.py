"""Check lsgd on the GPUs of this machine and measure it; print one table.

    python scripts/gpu_check.py              # on a machine with a CUDA GPU (uses GPU 0)
    python scripts/gpu_check.py --dry-run    # on CPU: every step at toy size (gloo, tiny models)

The steps, their goals and the dry run: :mod:`lsgd.launch.gpu_check`. Exit status 0 when every
check passed (a goal not met is reported in the table and does not fail the run); 1 when a
check failed.
"""

from __future__ import annotations

import argparse
import os
import sys

from lsgd.launch import gpu_check


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, epilog=gpu_check.__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dry-run", action="store_true", help="on CPU at toy size: check that every step runs")
    ap.add_argument("--compile-backend", default=None, help="torch.compile backend (default: inductor; eager in a dry run)")
    ap.add_argument("--only", nargs="+", choices=["tests", "train", "overhead", "speed"],
                    default=["tests", "train", "overhead", "speed"])
    args = ap.parse_args(argv)
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    s, rows = gpu_check.run_checks(args.dry_run, args.compile_backend, only=tuple(args.only))
    print(gpu_check.table(s, rows))
    return 1 if any(r.failed for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
