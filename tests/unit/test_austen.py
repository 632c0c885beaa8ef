"""lsgd.data.austen: the R lazy-load database reader on small databases built here with rdata's
writer in R's format (no R needed), and fetching the corpus from a package tree built the same
way (the real `apt-get download r-cran-janeaustenr` path is run by `make data`)."""

from __future__ import annotations

import bz2
import dataclasses
import gzip
import hashlib
import lzma
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest

from lsgd.data import austen
from lsgd.core.errors import ConfigError

import rdata  # noqa: E402


def _serialize(obj, tmp: Path) -> bytes:
    """R's XDR serialization of ``obj`` (rdata's writer, uncompressed)."""
    p = tmp / "obj.rds"
    rdata.write_rds(p, obj, compression=None)
    return p.read_bytes()


def lazyload_db(objects: dict, tmp: Path, compress: int = 1) -> tuple[bytes, bytes]:
    """(.rdx, .rdb) bytes as R's makeLazyLoadDB writes them: each value = 4-byte big-endian length
    + zlib stream (``compress`` 1) or + type byte + bzip2 / xz (2 / 3); the index gzip-compressed."""
    rdb, variables = b"", {}
    for name, obj in objects.items():
        raw = _serialize(obj, tmp)
        body = {1: zlib.compress, 2: lambda b: b"2" + bz2.compress(b), 3: lambda b: b"X" + lzma.compress(b)}[compress](raw)
        value = struct.pack(">I", len(raw)) + body
        variables[name] = np.array([len(rdb), len(value)], dtype=np.int32)
        rdb += value
    index = {"variables": variables, "references": {}, "compressed": compress if compress > 1 else True}
    return gzip.compress(_serialize(index, tmp)), rdb


def fake_package(tmp: Path, texts: dict[str, list[str]]) -> tuple[Path, tuple[austen.Novel, ...]]:
    """A package tree like the unpacked .deb (data/Rdata.rd[xb], the copyright file) holding
    ``texts`` (R name -> lines), and the :class:`lsgd.data.austen.Novel` entries that describe them."""
    tree = tmp / "pkg"
    db = tree / austen.DB_IN_PACKAGE
    db.parent.mkdir(parents=True)
    rdx, rdb = lazyload_db({k: np.array(v, dtype=object) for k, v in texts.items()}, tmp)
    db.with_suffix(".rdx").write_bytes(rdx)
    db.with_suffix(".rdb").write_bytes(rdb)
    (tree / austen.COPYRIGHT_IN_PACKAGE).parent.mkdir(parents=True)
    (tree / austen.COPYRIGHT_IN_PACKAGE).write_text("License: MIT\n")
    novels = tuple(
        austen.Novel(k, f"{k}.txt", len(t), hashlib.sha256(t).hexdigest())
        for k, t in ((k, ("\n".join(v) + "\n").encode()) for k, v in texts.items())
    )
    return tree, novels


TEXTS = {"emma": ["EMMA", "", "Emma Woodhouse, handsome."], "persuasion": ["PERSUASION", "", "Sir Walter."]}


@pytest.mark.parametrize("compress", [1, 2, 3])
def test_read_lazyload_on_a_database_built_with_rdatas_writer(tmp_path, compress):
    lines = {"emma": np.array(["EMMA", "", "Emma Woodhouse, handsome, clever, and rich,", "£5"], dtype=object),
             "persuasion": np.array(["Sir Walter Elliot"], dtype=object)}
    rdx, rdb = lazyload_db(lines, tmp_path, compress)
    got = austen.read_lazyload(rdx, rdb)
    assert set(got) == {"emma", "persuasion"}
    assert [str(s) for s in got["emma"]] == list(lines["emma"])
    assert austen.novel_text(got["emma"]) == "EMMA\n\nEmma Woodhouse, handsome, clever, and rich,\n£5\n"
    with pytest.raises(ValueError, match="outside"):
        austen.read_lazyload(rdx, rdb[:10])


def test_fetch_writes_checked_texts_once(tmp_path, monkeypatch):
    tree, novels = fake_package(tmp_path, TEXTS)
    monkeypatch.setattr(austen, "NOVELS", novels)
    unpacked = []
    monkeypatch.setattr(austen, "_unpack_package", lambda tmp: unpacked.append(tmp) or tree)

    root = tmp_path / "data"
    assert not austen.is_present(root) and austen.verify(root) == ["emma.txt", "persuasion.txt"]
    dest = austen.fetch(root)
    assert dest == root / "text" / "austen"
    assert (dest / "emma.txt").read_text() == "EMMA\n\nEmma Woodhouse, handsome.\n"
    assert (dest / austen.COPYRIGHT_NAME).read_text() == "License: MIT\n"
    assert austen.is_present(root) and austen.verify(root) == [] and len(unpacked) == 1
    austen.fetch(root)
    assert len(unpacked) == 1  # present and verified: not fetched again
    assert sorted(p.name for p in dest.iterdir()) == [austen.COPYRIGHT_NAME, "emma.txt", "persuasion.txt"]

    (dest / "emma.txt").write_text("EMMA\n\nEmma Woodhouse, handsome!\n")  # same size, other bytes
    assert austen.verify(root) == ["emma.txt"]
    austen.fetch(root)
    assert len(unpacked) == 2 and austen.verify(root) == []

    monkeypatch.setattr(austen, "NOVELS", (dataclasses.replace(novels[0], sha256="0" * 64),))
    with pytest.raises(ConfigError, match=r"emma\.txt extracted with SHA-256 .* the package's text changed"):
        austen.fetch(tmp_path / "other")
    assert not (tmp_path / "other" / "text" / "austen" / "emma.txt").exists()


def test_an_installed_package_is_read_in_place(tmp_path, monkeypatch):
    tree, novels = fake_package(tmp_path, TEXTS)
    monkeypatch.setattr(austen, "NOVELS", novels)
    monkeypatch.setattr(austen, "INSTALLED_ROOT", tree)
    monkeypatch.setattr(austen.subprocess, "run", lambda *a, **k: pytest.fail("ran apt-get / dpkg-deb"))
    austen.fetch(tmp_path / "data")
    assert austen.verify(tmp_path / "data") == []


def test_fetch_without_apt_says_where_the_corpus_comes_from(tmp_path, monkeypatch):
    monkeypatch.setattr(austen, "INSTALLED_ROOT", tmp_path / "no_r_here")
    monkeypatch.setattr(austen.shutil, "which", lambda tool: None)
    with pytest.raises(ConfigError, match=r"apt-get not found\. .* Debian package r-cran-janeaustenr"):
        austen.fetch(tmp_path / "data")
