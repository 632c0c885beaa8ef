"""Atomic file writes, shared by the launcher and the trainer's services."""

from __future__ import annotations

import os
import uuid
from pathlib import Path


def write_atomic(path: Path | str, text: str) -> None:
    """Write ``text`` to ``path`` atomically (temporary file in the same folder + os.replace), so a
    reader (or a run killed mid-write) sees the old file or the new one, never a torn one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
