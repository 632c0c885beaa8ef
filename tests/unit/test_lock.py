"""requirements.lock, the pinned environment that `make install` builds (README: "Pinned environment").

- Every pin that applies to this interpreter and platform is installed at exactly the pinned version.
- The lock is not stale against pyproject.toml: each dependency (and the dev extra) is pinned at a
  version inside pyproject's range, nothing is pinned as a direct dependency that pyproject no longer
  asks for, lock-constraints.txt's versions are the lock's, and every pin carries hashes.
"""

from __future__ import annotations

import importlib.metadata
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "requirements.lock"
PYPROJECT = ROOT / "pyproject.toml"
CONSTRAINTS = ROOT / "lock-constraints.txt"
DIRECT = "lsgd (pyproject.toml)"  # uv's "# via" annotation of a dependency pyproject asks for itself


@dataclass
class Pin:
    name: str  # PEP 503-normalised
    version: str
    marker: Marker | None
    hashes: list[str] = field(default_factory=list)
    via: list[str] = field(default_factory=list)

    def applies(self) -> bool:
        return self.marker is None or self.marker.evaluate()


def parse_lock(text: str) -> list[Pin]:
    """The pins of a `uv pip compile --generate-hashes` file: `name==version [; marker]` with `--hash`
    continuation lines, each followed by its `# via` annotation."""
    pins: list[Pin] = []
    logical = ""
    for raw in text.splitlines():
        line = raw.strip()
        if logical:  # inside a pin's backslash-continued hash lines
            logical += " " + line.rstrip("\\").strip()
            if not line.endswith("\\"):
                pins.append(_pin(logical))
                logical = ""
            continue
        if not line:
            continue
        if line.startswith("#"):
            if pins and raw.startswith((" ", "\t")):  # an indented annotation belongs to the pin above
                note = line.lstrip("#").strip()
                note = note[len("via"):].strip() if note.startswith("via") else note
                if note:
                    pins[-1].via.append(note)
            continue
        if line.endswith("\\"):
            logical = line.rstrip("\\").strip()
        else:
            pins.append(_pin(line))
    assert not logical, f"requirements.lock ends inside a continued line: {logical[:80]}"
    return pins


def _pin(logical: str) -> Pin:
    spec, *hashes = logical.split("--hash=")
    req = Requirement(spec.strip())
    specs = list(req.specifier)
    assert len(specs) == 1 and specs[0].operator == "==", f"requirements.lock: {spec.strip()!r} is not an exact pin"
    return Pin(canonicalize_name(req.name), specs[0].version, req.marker, [h.strip() for h in hashes])


def lock_pins() -> list[Pin]:
    return parse_lock(LOCK.read_text())


def pyproject_requirements() -> list[Requirement]:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    return [Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["dev"]]


def test_parse_lock_reads_pins_markers_hashes_and_annotations():
    text = (
        "# header\n"
        "Foo_Bar==1.0 \\\n"
        "    --hash=sha256:aa \\\n"
        "    --hash=sha256:bb\n"
        "    # via lsgd (pyproject.toml)\n"
        "baz==2.0 ; sys_platform == 'nonexistent' \\\n"
        "    --hash=sha256:cc\n"
        "    # via\n"
        "    #   foo-bar\n"
        "    #   lsgd (pyproject.toml)\n"
    )
    foo, baz = parse_lock(text)
    assert (foo.name, foo.version, foo.hashes, foo.via, foo.applies()) == (
        "foo-bar", "1.0", ["sha256:aa", "sha256:bb"], [DIRECT], True)
    assert (baz.name, baz.version, baz.hashes, baz.via, baz.applies()) == (
        "baz", "2.0", ["sha256:cc"], ["foo-bar", DIRECT], False)


def test_installed_versions_are_the_locked_ones():
    installed: dict[str, str] = {}
    for dist in importlib.metadata.distributions():  # sys.path order: the first one is the one imported
        installed.setdefault(canonicalize_name(dist.metadata["Name"]), dist.version)
    here = [pin for pin in lock_pins() if pin.applies()]
    assert {"torch", "torchvision", "pytest", "packaging"} <= {pin.name for pin in here}, "lock parsed wrong"
    wrong = []
    for pin in here:
        have = installed.get(pin.name)
        if have is None:
            wrong.append(f"{pin.name}: not installed (the lock pins {pin.version})")
        elif Version(have) != Version(pin.version):
            wrong.append(f"{pin.name}: {have} installed, the lock pins {pin.version}")
    assert not wrong, (
        f"{len(wrong)} of the {len(here)} packages that requirements.lock pins for this platform differ from "
        "what is installed; run `make install` (it installs from the lock):\n  " + "\n  ".join(wrong))


def test_lock_satisfies_pyproject():
    pins = lock_pins()
    by_name: dict[str, list[Pin]] = {}
    for pin in pins:
        by_name.setdefault(pin.name, []).append(pin)
    problems = []
    wanted = set()
    for req in pyproject_requirements():
        name = canonicalize_name(req.name)
        wanted.add(name)
        if name not in by_name:
            problems.append(f"{req}: in pyproject.toml, not in requirements.lock")
        for pin in by_name.get(name, []):
            if not req.specifier.contains(pin.version, prereleases=True):
                problems.append(f"{req}: requirements.lock pins {pin.version}, outside pyproject's range")
    direct = {pin.name for pin in pins if DIRECT in pin.via}
    problems += [f"{name}: pinned as a dependency of lsgd that pyproject.toml no longer has" for name in sorted(direct - wanted)]
    problems += [f"{name}: pinned, but not marked as a dependency of lsgd" for name in sorted(wanted & set(by_name) - direct)]
    for line in CONSTRAINTS.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            held = Requirement(line)
            for pin in by_name.get(canonicalize_name(held.name), []):
                if not held.specifier.contains(pin.version, prereleases=True):
                    problems.append(f"{held}: lock-constraints.txt holds it, requirements.lock pins {pin.version}")
    problems += [f"{pin.name}=={pin.version}: no hash (pip install --require-hashes refuses it)" for pin in pins if not pin.hashes]
    assert not problems, "requirements.lock is stale; run `make lock` (then `make install`):\n  " + "\n  ".join(problems)
