"""The compressors' seed follows the run's ``seed`` unless ``algo.seed`` is given."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))

from trainer_runs import TINY, compose_cfg

from lsgd.algorithms.base import RunContext
from lsgd.algorithms.gradient_compression.compressed import Compressed
from lsgd.comm.communicator import Communicator


@pytest.mark.parametrize("algo", ["compressed", "gravac", "accordion"])
def test_compressor_seed_defaults_to_run_seed(algo):
    assert compose_cfg([*TINY, f"algo={algo}", "seed=5"])["algo"]["seed"] == 5
    assert compose_cfg([*TINY, f"algo={algo}", "seed=5", "algo.seed=3"])["algo"]["seed"] == 3


def test_null_seed_resolves_to_the_run_seed():
    algo = Compressed({"name": "compressed", "compressor": "randomk", "cf": 10, "seed": None}, Communicator())
    algo.ctx = RunContext(seed=7)
    assert algo.compressor_seed() == 7
    algo.config.seed = 2
    assert algo.compressor_seed() == 2
