"""The layers of pyproject.toml's ``[tool.importlinter]`` contracts hold, and they can fail.

import-linter (a maintained architecture linter, grimp's import graph: every ``import`` statement
of the package, function-local ones included) checks three contracts: the layers (cli > launch >
config > training > algorithms > compression > models > comm | compute | data > clock > core: a
module never imports a layer above its own), the analysis never importing the training side, and no
training-side module importing the analysis stack (pandas, matplotlib, scipy, lsgd.analysis).
The second test plants an import that runs up a layer (and one of pandas into the training side) in
a copy of the package and requires the linter to reject each, so a contract that cannot fail (a
misspelled module, a switched-off check) fails here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).with_name("lint-imports")


def lint(cwd: Path, package_parent: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(package_parent)}
    return subprocess.run([str(LINT), "--no-cache", "--no-logo"], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def test_import_contracts_are_kept():
    out = lint(REPO, REPO)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "3 kept, 0 broken" in out.stdout, out.stdout


def _copy(tmp_path: Path) -> Path:
    shutil.copytree(REPO / "lsgd", tmp_path / "lsgd", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


@pytest.mark.parametrize(
    "module, planted, broken",
    [
        ("lsgd/comm/topology.py", "from lsgd.training import trainer", "Layers"),  # comm importing the trainer
        ("lsgd/core/files.py", "import lsgd.clock", "Layers"),  # the leaf layer importing one above it
        ("lsgd/analysis/stats.py", "from lsgd.training import optim", "The analysis reads run folders"),
        ("lsgd/training/optim.py", "import pandas", "Training never loads the analysis stack"),
    ],
)
def test_an_import_up_a_layer_breaks_a_contract(tmp_path, module, planted, broken):
    root = _copy(tmp_path)
    path = root / module
    path.write_text(path.read_text() + f"\n\ndef _planted():\n    {planted}\n")  # function-local: still an import
    out = lint(root, root)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "2 kept, 1 broken" in out.stdout, out.stdout
    broken_part = out.stdout.split("Broken contracts", 1)[1]
    assert " ".join(broken.split()) in " ".join(broken_part.split()), out.stdout
