"""The documentation site (mkdocs.yml, docs/) builds with ``--strict``, and the repository's references
into it resolve.

The strict build fails on a broken link between pages, a link to a missing anchor, a page left out
of the nav, a reference to a symbol mkdocstrings cannot find and a docstring griffe cannot parse.
Beyond the build: README.md stays a front door (at most 260 lines) whose relative links exist; every
``docs/<page>.md#<anchor>`` cited in code, configs, tests and scripts names a page and an anchor of
the built site (docstrings cite ``docs/papers.md#swarmsgd``); the benchmarks page keeps the markers
``make bench`` writes its table between; the study figures stay small SVG files.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README_MAX_LINES = 260
FIGURE_MAX_BYTES = 60 * 1024
#: where the repository cites docs pages: docstrings, comments, config headers, tests, scripts
CITING = ["lsgd", "conf", "tests", "scripts"]
CITING_FILES = ["README.md", "pyproject.toml", "Makefile", "mkdocs.yml"]
DOC_REF = re.compile(r"docs/((?:[\w-]+/)*[\w-]+)\.md(?:#([\w-]+))?")
MD_LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site built from mkdocs.yml with --strict into a temporary folder (once for this module)."""
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                           "-d", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    seconds = time.perf_counter() - t0
    problems = [line for line in (proc.stdout + proc.stderr).splitlines() if "WARNING" in line or "ERROR" in line]
    assert proc.returncode == 0, f"mkdocs build --strict failed ({seconds:.0f} s):\n" + "\n".join(
        problems or (proc.stdout + proc.stderr).splitlines()[-30:])
    return out


def page_ids(site: Path, page: str) -> set[str]:
    """The element ids (anchors) of the built page of ``docs/<page>.md``."""
    html = (site / f"{page}.html").read_text(encoding="utf-8")
    return set(re.findall(r'\bid="([^"]+)"', html))


def test_site_builds_strict(site):
    assert (site / "index.html").exists()
    assert (site / "papers.html").exists() and (site / "reference" / "algorithms.html").exists()


def test_readme_is_a_front_door():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move the detail into docs/"


def test_readme_links_exist(site):
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    for target in MD_LINK.findall(text):
        if re.match(r"[a-z]+://|mailto:", target):
            continue
        path, _, anchor = target.partition("#")
        assert (ROOT / path).exists(), f"README.md links to {path}, which does not exist"
        if anchor and path.startswith("docs/") and path.endswith(".md"):
            assert anchor in page_ids(site, path[len("docs/"):-len(".md")]), f"README.md: no anchor #{anchor} in {path}"


def cited_doc_refs() -> list[tuple[str, str, str | None]]:
    """(file, page, anchor) of every ``docs/<page>.md[#anchor]`` in the citing files."""
    files = [ROOT / f for f in CITING_FILES]
    for folder in CITING:
        files += [p for p in (ROOT / folder).rglob("*") if p.suffix in {".py", ".yaml", ".yml", ".md", ".toml", ".sh"}
                  or p.name.endswith(".sbatch")]
    refs = []
    for path in files:
        if not path.is_file() or "__pycache__" in path.parts:
            continue
        for page, anchor in DOC_REF.findall(path.read_text(encoding="utf-8", errors="replace")):
            refs.append((str(path.relative_to(ROOT)), page, anchor or None))
    return refs


def test_cited_docs_pages_and_anchors_exist(site):
    missing = []
    for where, page, anchor in cited_doc_refs():
        if not (ROOT / "docs" / f"{page}.md").exists():
            missing.append(f"{where}: docs/{page}.md does not exist")
        elif anchor and anchor not in page_ids(site, page):
            missing.append(f"{where}: docs/{page}.md has no anchor #{anchor}")
    assert not missing, "\n".join(sorted(set(missing)))


def test_benchmarks_page_keeps_the_markers_of_make_bench():
    text = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    begin, end = text.find("<!-- make bench: begin"), text.find("<!-- make bench: end -->")
    assert 0 <= begin < end, "docs/benchmarks.md lost the markers scripts/bench_all.py writes its table between"
    assert "| figure | goal | value | met | machine | date |" in text[begin:end]


def test_study_figures_are_small_svgs():
    figures = sorted((ROOT / "docs" / "studies" / "figures").glob("*"))
    assert figures, "no study figures (python scripts/docs_figures.py draws them)"
    for path in figures:
        assert path.suffix == ".svg", f"{path.name}: the study figures are SVG files"
        assert path.stat().st_size < FIGURE_MAX_BYTES, f"{path.name} is {path.stat().st_size} bytes"


# ------------------------------------------------------------------ the configuration pages mark every default
#: a key's row of the configuration page's tables: | `key` | `default` | meaning |
KEY_ROW = re.compile(r"^\| `([\w.]+)` \| `([^`]*)` \| (.*) \|$", re.M)
#: a value set in bold, backticks or not: **a100**, **`a100`**
BOLD = re.compile(r"\*\*`?([^*`]+?)`?\*\*")


def _written(value) -> str:
    """A config value as the pages write it (YAML's words: null, true, false)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _flat(config: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _section(text: str, heading: str) -> str:
    """The text under ``## heading`` up to the next ``## `` heading."""
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def _lists_values(meaning: str) -> bool:
    """Whether a row's meaning lists the key's values (``a \\| b``; an escaped bar inside an
    ``&lt;...>`` token such as ``&lt;\\|endoftext\\|>`` is no list)."""
    return "\\|" in re.sub(r"&lt;[^>]*>", "", meaning)


def _check_rows(rows: list[tuple[str, str, str]], where: str) -> list[str]:
    """Every row that lists its key's values bolds exactly one of them, the default shown beside it;
    no row bolds another value."""
    bad = []
    for key, shown, meaning in rows:
        bold = BOLD.findall(meaning)
        if _lists_values(meaning) and bold != [shown]:
            bad.append(f"{where}: `{key}` lists its values but bolds {bold or 'none'}, not its default {shown}")
        elif bold and bold != [shown]:
            bad.append(f"{where}: `{key}` bolds {bold}, not its default {shown}")
    return bad


def test_configuration_page_shows_the_configs_defaults_and_marks_them():
    """docs/configuration.md: the top-level and ``cluster.`` keys' table holds every key of
    conf/config.yaml with its value there, the network table every key of conf/network/10gbps.yaml (the
    default preset); on the whole page, a row that lists a key's values bolds the default among them
    (``cluster.device``: v100 | **a100** | h100 ...), as the groups' table bolds the default option."""
    import yaml

    text = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    for heading, conf in (("Top-level keys", "config.yaml"), ("Network", "network/10gbps.yaml")):
        config = yaml.safe_load((ROOT / "conf" / conf).read_text(encoding="utf-8"))
        expected = {k: v for k, v in _flat(config).items()
                    if k not in ("defaults", "name") and not k.startswith("hydra.")}
        rows = {key: (shown, meaning) for key, shown, meaning in KEY_ROW.findall(_section(text, heading))}
        assert set(rows) == set(expected), f"{heading}: keys {sorted(set(rows) ^ set(expected))} on one side only"
        for key, (shown, _) in rows.items():
            assert yaml.safe_load(shown) == expected[key], \
                f"{heading}: `{key}` shows {shown}, conf/{conf} has {expected[key]!r}"
    bad = _check_rows(KEY_ROW.findall(text), "docs/configuration.md")
    assert not bad, "\n".join(bad)


def test_generated_algorithm_tables_mark_their_defaults():
    """The algorithms' key tables (docs/hooks/algo_keys.py, generated from the typed configs) bold
    the default among a key's allowed values."""
    sys.path.insert(0, str(ROOT / "docs" / "hooks"))
    try:
        import algo_keys
    finally:
        sys.path.remove(str(ROOT / "docs" / "hooks"))
    from lsgd.algorithms import ALGORITHMS

    row = re.compile(r"^\| `(\w+)` \| `([^`]*)` \| (.*?) \| .* \|$", re.M)
    bad = []
    for name in ALGORITHMS.names():
        for key, shown, allowed in row.findall(algo_keys.table(name)):
            choices = [c.strip().strip("*") for c in allowed.split("\\|")]
            if _lists_values(allowed) and shown in choices and BOLD.findall(allowed) != [shown]:
                bad.append(f"algo={name}: `{key}` allows {allowed} without its default {shown} in bold")
    assert not bad, "\n".join(bad)
    assert "**complete**" in algo_keys.table("swarm_sgd") and "**ring**" in algo_keys.table("dpsgd")


def test_clock_page_marks_the_compute_defaults():
    """docs/clock.md's ``cluster.`` table: the rows that list the choices (compute mode, device preset)
    bold the default of conf/config.yaml, and no row bolds anything else."""
    import yaml

    defaults = yaml.safe_load((ROOT / "conf" / "config.yaml").read_text(encoding="utf-8"))["cluster"]
    text = (ROOT / "docs" / "clock.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| `cluster\.(\w+)` \| (.*) \|$", text, re.M))
    assert set(rows) == set(defaults), sorted(set(rows) ^ set(defaults))
    for key, meaning in rows.items():
        bold = BOLD.findall(meaning)
        assert bold in ([], [_written(defaults[key])]), f"docs/clock.md: `cluster.{key}` bolds {bold}"
    for key in ("compute", "device"):
        assert BOLD.findall(rows[key]) == [_written(defaults[key])], f"docs/clock.md: `cluster.{key}` hides its default"
