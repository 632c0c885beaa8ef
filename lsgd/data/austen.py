"""Jane Austen's six novels as plain text, from Debian's ``r-cran-janeaustenr`` package (no network
beyond the Debian package mirror).

The corpus: "Sense and Sensibility" (1811), "Pride and Prejudice" (1813), "Mansfield Park" (1814),
"Emma" (1815), "Northanger Abbey" and "Persuasion" (1817), as prepared from Project Gutenberg's
texts by Julia Silge's R package janeaustenr 1.0.0 (CRAN; Debian package ``r-cran-janeaustenr``
1.0.0-1, bookworm). 4,025,029 bytes of UTF-8 text in all (one non-ASCII character, a pound sign), 73,422
lines, 10,298 blank-line separated paragraphs.

Licence: the novels are in the public domain (published 1811-1817; their author died in 1817). The
package that carries them, its code and its compilation of the texts, is under the MIT licence
("Copyright: 2016-2017 Julia Silge", Debian packaging "2021 Andreas Tille"; Debian's copyright
file ``/usr/share/doc/r-cran-janeaustenr/copyright``, which :func:`fetch` copies next to the text
as ``COPYRIGHT.r-cran-janeaustenr``).

How it is read: the package stores its data as an R lazy-load database, ``data/Rdata.rdx`` (the
index: a gzip-compressed R serialization of ``list(variables = list(<name> = c(offset, length)),
references = list(), compressed = TRUE)``) and ``data/Rdata.rdb`` (the objects: at each offset,
``length`` bytes = a 4-byte big-endian length of the uncompressed serialization + a zlib stream;
R's ``lazyLoadDBinsertValue``). Each novel is an R character vector, one element per line of the
book; PyPI's ``rdata`` parses R's serialization (:func:`read_lazyload`). The package is fetched
with ``apt-get download`` and unpacked with ``dpkg-deb -x`` into a temporary folder (R is not
installed), or read in place when it is installed. :data:`NOVELS` lists the SHA-256 of every text
file written; a different package version with different text fails the check.
"""

from __future__ import annotations

import bz2
import contextlib
import fcntl
import gzip
import hashlib
import lzma
import os
import shutil
import struct
import subprocess
import tempfile
import uuid
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path

from lsgd.core.errors import ConfigError

PACKAGE = "r-cran-janeaustenr"
PACKAGE_VERSION = "1.0.0-1"
#: the lazy-load database inside the package (without its .rdx / .rdb suffix)
DB_IN_PACKAGE = "usr/lib/R/site-library/janeaustenr/data/Rdata"
COPYRIGHT_IN_PACKAGE = "usr/share/doc/r-cran-janeaustenr/copyright"
#: where the corpus goes, relative to ``dataset.root``
SUBDIR = Path("text") / "austen"
COPYRIGHT_NAME = "COPYRIGHT.r-cran-janeaustenr"
#: where an installed package's files are (``apt-get install r-cran-janeaustenr``): read in place
INSTALLED_ROOT = Path("/")


@dataclass(frozen=True)
class Novel:
    """One novel: the R object name in the package, the text file written, its size in bytes
    and its SHA-256 (lines joined with "\\n", a final "\\n", UTF-8)."""

    r_name: str
    file: str
    size: int
    sha256: str


NOVELS = (
    Novel("sensesensibility", "sense_and_sensibility.txt", 673688,
          "105e1651fe93bed7130078578efd31e0c557d68667ba672ddc876f735b30fe09"),
    Novel("prideprejudice", "pride_and_prejudice.txt", 684768,
          "dfc684d4f857fa938268f9ab9c5567b64bd0691251eca959644adeabe6287a4d"),
    Novel("mansfieldpark", "mansfield_park.txt", 883280,
          "98bc90519cdf4ef663ad7de2734bb529435ef24f7abbde6bb1a50898871dafe9"),
    Novel("emma", "emma.txt", 883028,
          "7c67b5985c6d0de1efaeb5d342d52cb82c38083c40e2295129e30e87ee690ebe"),
    Novel("northangerabbey", "northanger_abbey.txt", 433411,
          "51f91bbe0517db8e65cff009b097ce0a1836124c4e0532ac19e6c0cad982abed"),
    Novel("persuasion", "persuasion.txt", 466854,
          "8061549557aebd2fd6e353d18d9197cb707029112bd52d4d8b174583a925848a"),
)


def corpus_dir(root: str | os.PathLike) -> Path:
    """The folder of the novels under ``dataset.root``."""
    return Path(root) / SUBDIR


def corpus_files(root: str | os.PathLike) -> list[Path]:
    """The six text files, in :data:`NOVELS` order (they may not exist yet)."""
    return [corpus_dir(root) / n.file for n in NOVELS]


def is_present(root: str | os.PathLike) -> bool:
    """All six files exist with their expected sizes (the checksums are checked by :func:`verify`)."""
    return all(f.is_file() and f.stat().st_size == n.size for f, n in zip(corpus_files(root), NOVELS))


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def verify(root: str | os.PathLike) -> list[str]:
    """Names of the files that are missing or whose SHA-256 differs from :data:`NOVELS` ([] = all good)."""
    bad = []
    for f, n in zip(corpus_files(root), NOVELS):
        if not f.is_file() or sha256_file(f) != n.sha256:
            bad.append(n.file)
    return bad


# ------------------------------------------------------------------ R lazy-load databases
def _unserialize(raw: bytes):
    """An R serialization (``serialize()``'s bytes: "X\\n" XDR, "B\\n" native or "A\\n" ASCII) as a
    Python object (``rdata``'s conversion: a character vector -> numpy array of str, a named list ->
    dict)."""
    try:
        import rdata
    except ImportError as exc:  # pragma: no cover - a dependency in pyproject.toml
        raise ConfigError("reading R data needs the `rdata` package: pip install rdata") from exc
    with warnings.catch_warnings():
        # rdata cannot tell a bare serialization from an .rds file and says so ("assumed RDS")
        warnings.simplefilter("ignore", UserWarning)
        return rdata.conversion.convert(rdata.parser.parse_data(raw))


def _decompress_value(blob: bytes, compressed) -> bytes:
    """One object of an .rdb: 4-byte big-endian length of the serialization, then (``compressed``
    TRUE or 1) a zlib stream, or (2 / 3) a type byte ``'2'`` bzip2 / ``'X'`` xz / ``'Z'`` zlib /
    ``'0'`` stored, then the data (R's src/main/serialize.c, R_compress1..3)."""
    if len(blob) < 4:
        raise ValueError(f"lazy-load value of {len(blob)} bytes has no length header")
    (size,) = struct.unpack(">I", blob[:4])
    body = blob[4:]
    if int(compressed) in (2, 3):
        kind, body = body[:1], body[1:]
        raw = {b"2": bz2.decompress, b"X": lzma.decompress, b"Z": zlib.decompress, b"0": bytes}[kind](body)
    else:
        raw = zlib.decompress(body)
    if len(raw) != size:
        raise ValueError(f"lazy-load value: header says {size} bytes, decompressed {len(raw)}")
    return raw


def read_lazyload(rdx: bytes, rdb: bytes) -> dict[str, object]:
    """Every variable of an R lazy-load database (the bytes of its ``.rdx`` index and ``.rdb``
    data), converted by ``rdata`` (character vector -> numpy array of str).

    Raises:
        ValueError: a malformed index or value.
    """
    index = _unserialize(gzip.decompress(rdx) if rdx[:2] == b"\x1f\x8b" else rdx)
    if not isinstance(index, dict) or "variables" not in index:
        raise ValueError("not a lazy-load index: no 'variables' entry")
    compressed = index.get("compressed", True)
    compressed = compressed[0] if hasattr(compressed, "__len__") else compressed
    out = {}
    for name, pos in index["variables"].items():
        offset, length = (int(v) for v in pos)
        if offset < 0 or length < 4 or offset + length > len(rdb):
            raise ValueError(f"lazy-load variable {name!r}: [{offset}, {offset + length}) outside the {len(rdb)}-byte .rdb")
        out[str(name)] = _unserialize(_decompress_value(rdb[offset : offset + length], compressed))
    return out


def novel_text(lines) -> str:
    """An R character vector of lines as text: lines joined with "\\n" plus a final "\\n" (an NA
    line, None, becomes an empty line)."""
    return "".join(("" if s is None else str(s)) + "\n" for s in lines)


# ------------------------------------------------------------------ fetching
@contextlib.contextmanager
def file_lock(path: Path):
    """An exclusive ``flock`` on ``path`` (created if missing) for the block: processes that share
    the file system (ranks of one node, or of several on a shared file system that supports flock)
    take turns."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _unpack_package(tmp: Path) -> Path:
    """The root of the package's files: the installed package, or ``apt-get download`` +
    ``dpkg-deb -x`` into ``tmp``.

    Raises:
        ConfigError: apt-get / dpkg-deb missing or the package not available from the mirror.
    """
    if (INSTALLED_ROOT / (DB_IN_PACKAGE + ".rdb")).is_file():
        return INSTALLED_ROOT
    hint = (f"The Jane Austen corpus (dataset=text with dataset.files=null) comes from the Debian package "
            f"{PACKAGE}: run `apt-get update` (as root) on a Debian/Ubuntu machine that reaches its package "
            f"mirror and retry `lsgd data text`, or `apt-get install {PACKAGE}`, or set dataset.files to your "
            "own plain-text files")
    for tool in ("apt-get", "dpkg-deb"):
        if shutil.which(tool) is None:
            raise ConfigError(f"{tool} not found. {hint}")
    res = subprocess.run(["apt-get", "download", PACKAGE], check=False, cwd=tmp, capture_output=True, text=True)
    debs = sorted(tmp.glob(f"{PACKAGE}_*.deb"))
    if res.returncode != 0 or not debs:
        msg = (res.stderr or res.stdout).strip().splitlines()
        raise ConfigError(f"`apt-get download {PACKAGE}` failed ({msg[-1] if msg else res.returncode}). {hint}")
    tree = tmp / "pkg"
    subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(tree)], check=True, capture_output=True)
    return tree


def fetch(root: str | os.PathLike) -> Path:
    """Write the six novels (and the package's copyright file) under ``<root>/text/austen`` unless
    they are there with the right checksums; returns that folder. Safe to call from several
    processes at once (a lock file, and each file written to a temporary name and renamed).

    Raises:
        ConfigError: the package cannot be fetched, or a text differs from its listed SHA-256
            (another package version).
    """
    dest = corpus_dir(root)
    with file_lock(dest.parent / ".austen.lock"):
        if is_present(root) and not verify(root):
            return dest
        dest.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="lsgd-austen-") as tmp:
            tree = _unpack_package(Path(tmp))
            db = tree / DB_IN_PACKAGE
            objects = read_lazyload(db.with_suffix(".rdx").read_bytes(), db.with_suffix(".rdb").read_bytes())
            staged = []
            for n in NOVELS:
                if n.r_name not in objects:
                    raise ConfigError(f"{PACKAGE}: no object {n.r_name!r} in {db}.rdb (found {', '.join(objects)})")
                data = novel_text(objects[n.r_name]).encode("utf-8")
                digest = hashlib.sha256(data).hexdigest()
                if digest != n.sha256:
                    raise ConfigError(
                        f"{PACKAGE}: {n.file} extracted with SHA-256 {digest} ({len(data)} bytes), expected "
                        f"{n.sha256} ({n.size} bytes) from version {PACKAGE_VERSION}; the package's text changed. "
                        "Check the new text and update lsgd.data.austen.NOVELS"
                    )
                staged.append((n.file, data))
            copyright_file = tree / COPYRIGHT_IN_PACKAGE
            if copyright_file.is_file():
                staged.append((COPYRIGHT_NAME, copyright_file.read_bytes()))
            for name, data in staged:
                part = dest / f".{name}.{uuid.uuid4().hex}.tmp"
                part.write_bytes(data)
                os.replace(part, dest / name)
    return dest
