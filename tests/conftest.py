"""Suite-wide rules: only tests that need CUDA may skip on a machine without it, and the end of
every run says how many tests were skipped and why.

* ``@pytest.mark.cuda`` marks a test that needs a CUDA device; on a machine without one it is
  skipped here (with that reason), never by an ad hoc ``skipif``.
* On a machine without CUDA, any other test that skips (``pytest.skip``, ``skipif``,
  ``importorskip``) is reported as a failure naming its reason: a skipped golden case, a missing
  data set or a missing system tool would otherwise pass CI silently (issue 21: when the registry
  served a new torch, every golden case skipped and CI stayed green).
* The terminal summary ends with one line: the number of skipped tests and their reasons.
* ``@pytest.mark.serial`` marks a test that times this machine closely (a transfer against its
  bandwidth cap, a wait against its deadline): `make test` runs the rest on two pytest-xdist
  workers (``-m "not serial"``), then these alone (``-m serial``), so the other worker's load
  cannot move their measurements.
* The heavy directories are collected first (tests/slurm, then tests/cli, then the rest): with
  ``--dist loadfile`` a worker takes the next file in collection order, so the files of minutes
  start at once instead of leaving one worker a tail of them while the other is idle.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

CUDA = torch.cuda.is_available()
_skipped: Counter[str] = Counter()


#: collection order by directory (smaller first); a directory not named here goes last
FIRST = {"slurm": 0, "cli": 1, "distributed": 2}


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a CUDA device (skipped on a machine without one)")
    config.addinivalue_line("markers", "serial: times this machine closely; make test runs it alone, after the rest")


def _directory_rank(item) -> int:
    return FIRST.get(item.path.parent.name, len(FIRST))


def pytest_collection_modifyitems(config, items):
    items.sort(key=_directory_rank)  # stable: each file's tests keep their order
    if CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (marked cuda); this machine has none")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not report.skipped or getattr(report, "wasxfail", None) is not None:
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    reason = reason.removeprefix("Skipped: ")
    if CUDA or item.get_closest_marker("cuda") is not None:
        return
    report.outcome = "failed"
    report.longrepr = (f"{item.nodeid} skipped without needing CUDA ({reason}). Only tests marked "
                       "`cuda` may skip on this machine: install what the test needs (make test does) "
                       "or mark it cuda if it needs a GPU.")


def pytest_runtest_logreport(report):
    """Counts the skips where the summary is written (with pytest-xdist: in the controller, which
    gets every worker's reports; a skip that reaches it needed CUDA, the others became failures)."""
    if report.skipped and getattr(report, "wasxfail", None) is None:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _skipped[reason.removeprefix("Skipped: ")] += 1


def pytest_terminal_summary(terminalreporter):
    total = sum(_skipped.values())
    reasons = "; ".join(f"{n} x {r}" for r, n in _skipped.most_common())
    terminalreporter.write_line(f"skipped: {total}" + (f" ({reasons})" if reasons else " (none)"))
