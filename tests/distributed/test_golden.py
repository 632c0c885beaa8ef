"""Golden runs: every algorithm's tiny real training run must reproduce its stored numbers bit for bit.

The cases, what they guard and the conditions of equality are in ``tests/golden/cases.py``; the
stored files are ``tests/golden/<case>.json`` (``tests/golden/envs/<environment>/`` for other CPU kernel
families). Every case runs the real Trainer on a real gloo group
(one spawned group per world size, all of its cases in turn) and is compared exactly: per-step
training losses as floats, and each rank's sha256 of its final parameters and buffers.

A failure names the case, the first differing step and both values. If the change is meant to move
the numerics, regenerate with ``python scripts/make_golden.py [--only CASE ...]`` and say why in the
commit message; otherwise it is a regression.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "golden"))

import cases  # noqa: E402

NAMES = [c.name for c in cases.CASES]


def comparable(name: str) -> bool:
    stored = cases.load_golden(name)
    return stored is not None and cases.environment_mismatch(stored) is None


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Run every case that has numbers for this environment once for the whole module (about a
    minute on two cores)."""
    names = [n for n in NAMES if comparable(n)]
    if not names:
        return {}
    return cases.run_cases(names, tmp_path_factory.mktemp("golden"))


def test_every_case_has_one_golden_file():
    assert cases.stored_names() == sorted(NAMES), "run scripts/make_golden.py (new case) or delete the stale file"


@pytest.mark.parametrize("name", NAMES)
def test_golden(name, results):
    expected = cases.load_golden(name)
    assert expected is not None, f"no golden file for {name}: run python scripts/make_golden.py --only {name}"
    if (reason := cases.environment_mismatch(expected)) is not None:
        pytest.skip(f"{name} was recorded elsewhere ({reason}) and has no numbers for this environment; "
                    "record them here at an unchanged commit with scripts/make_golden.py")
    diffs = cases.differences(expected, results[name])
    assert not diffs, "\n".join(diffs) + (
        "\nThe numerics moved. Intended? Regenerate with "
        f"`python scripts/make_golden.py --only {name}` and say why in the commit message."
    )
