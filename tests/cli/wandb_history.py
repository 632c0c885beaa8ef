"""Read the history a W&B offline run wrote (``run-<id>.wandb``), for tests.

wandb 0.31 writes the file from its Go core and ships no Python reader any more, so this is a
small reader of its documented container: a 7-byte header (``:W&B``, magic 0xBEE1, version 0),
then LevelDB log records (32 KiB blocks; each chunk: crc32c, length, type FULL/FIRST/MIDDLE/LAST)
whose payloads are ``wandb_internal_pb2.Record`` messages. Only ``history`` records are decoded.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

BLOCK = 32768
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path):
    """The protobuf payloads of a .wandb file, in order (checksums not verified)."""
    data = Path(path).read_bytes()
    ident, magic, version = struct.unpack("<4sHB", data[:7])
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0), (ident, magic, version)
    pos, parts = 7, []
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:  # a block's tail too short for a chunk header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:
            pos += left  # zero padding to the end of the block
            continue
        payload = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == FULL:
            yield payload
        elif kind == FIRST:
            parts = [payload]
        elif kind == MIDDLE:
            parts.append(payload)
        elif kind == LAST:
            parts.append(payload)
            yield b"".join(parts)


def history(path: Path) -> dict[int, dict]:
    """step -> {key: value} of every history row of the run (values JSON-decoded)."""
    from wandb.proto import wandb_internal_pb2

    out: dict[int, dict] = {}
    for payload in records(path):
        rec = wandb_internal_pb2.Record()
        rec.ParseFromString(payload)
        if rec.WhichOneof("record_type") != "history":
            continue
        row = {(item.key or "/".join(item.nested_key)): json.loads(item.value_json) for item in rec.history.item}
        out.setdefault(int(row.get("_step", rec.history.step.num)), {}).update(row)
    return out


def run_records(path: Path) -> list:
    """The run records (``wandb_internal_pb2.RunRecord``: name, group, tags...) of the file, in order."""
    from wandb.proto import wandb_internal_pb2

    runs = []
    for payload in records(path):
        rec = wandb_internal_pb2.Record()
        rec.ParseFromString(payload)
        if rec.WhichOneof("record_type") == "run":
            runs.append(rec.run)
    return runs
