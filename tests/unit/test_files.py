"""lsgd.core.files.write_atomic: the text as UTF-8 whatever the locale (the report's ``±`` and
``Δ``), the new file replacing the old one, and a failed write leaving the old file and no
temporary file behind."""

from __future__ import annotations

import pytest

from lsgd.core.files import write_atomic


def test_write_atomic_writes_utf8_over_the_old_file(tmp_path):
    path = tmp_path / "report.md"
    path.write_text("old\n")
    write_atomic(path, "0.91 ± 0.01, Δ final test acc\n")
    assert path.read_bytes() == "0.91 ± 0.01, Δ final test acc\n".encode("utf-8")
    assert [p.name for p in tmp_path.iterdir()] == ["report.md"]  # no temporary file left


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    path = tmp_path / "summary.json"
    path.write_text("old\n")

    def replace(src, dst):
        raise OSError("no space left on device")

    monkeypatch.setattr("lsgd.core.files.os.replace", replace)
    with pytest.raises(OSError, match="no space"):
        write_atomic(path, "new\n")
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]
