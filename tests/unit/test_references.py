"""No file of the repository refers to a file that is not in it.

Module docstrings, YAML headers, tests and the docs name files of the project by their path
(``lsgd/comm/communicator.py``, ``docs/papers.md``, ``conf/algo/local_sgd.yaml``); after a move or a
rename such a reference silently points nowhere, and a reader outside the team cannot follow one to
a file that was never committed (the papers' notes once lived outside the repository). This test
finds every such path in the tracked text files and requires it to exist, and requires the papers'
and the glossary's pages to be named as the docs pages they are (``docs/papers.md``).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TEXT = (".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".cfg", ".sh")
#: a repository path: a top-level folder of the project, then folders, then a file with an extension
PATH = re.compile(r"(?<![\w./-])((?:lsgd|tests|scripts|docs|conf)/[\w./-]*\w\.(?:py|md|yaml|yml|json|svg|png|txt|toml))\b")
#: the papers' and glossary pages named without their folder ("papers.md section 3")
BARE = re.compile(r"(?<![\w/.-])(papers|glossary)\.md\b")


def tracked() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout.split("\n")
    return [REPO / f for f in out if f and (f.endswith(TEXT) or f in ("Makefile", ".ci/run")) and (REPO / f).is_file()]


def test_every_path_a_file_names_exists():
    missing = []
    for path in tracked():
        text = path.read_text(errors="replace")
        for m in PATH.finditer(text):
            ref = m.group(1).rstrip(".")
            if "*" in ref or "<" in ref or "XXXX" in ref:
                continue
            if not (REPO / ref).exists() and not (path.parent / ref).exists():
                line = text.count("\n", 0, m.start()) + 1
                missing.append(f"{path.relative_to(REPO)}:{line}: {ref}")
    assert not missing, "references to files that are not in the repository:\n" + "\n".join(missing)


def test_the_papers_and_glossary_pages_are_named_by_their_path():
    bare = []
    for path in tracked():
        rel = path.relative_to(REPO)
        if rel.parts[0] == "docs" or path.name in ("test_references.py", "mkdocs.yml"):
            continue  # the site's pages and navigation name pages relative to docs/
        text = path.read_text(errors="replace")
        for m in BARE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            bare.append(f"{rel}:{line}: {text.splitlines()[line - 1].strip()[:100]}")
    assert not bare, "name docs/papers.md or docs/glossary.md by its path:\n" + "\n".join(bare)
