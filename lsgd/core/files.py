"""Atomic file writes, shared by the launcher, the trainer's services and the report (:mod:`lsgd.analysis.report`)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path


def write_atomic(path: Path | str, text: str) -> None:
    """Write ``text`` (UTF-8, whatever the locale) to ``path`` atomically (temporary file in the
    same folder + os.replace), so a reader (or a run killed mid-write) sees the old file or the new
    one, never a torn one. A write that fails removes its temporary file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
