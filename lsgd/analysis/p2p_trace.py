"""Reading the point-to-point trace that ``LSGD_TRACE_P2P`` makes workers write
(:mod:`lsgd.comm.p2p_trace` writes it, one JSON line per counted exchange and rank) into a table.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd


def load_p2p_trace(folder: str | os.PathLike):
    """The point-to-point trace (:mod:`lsgd.comm.p2p_trace`) under ``folder`` as a pandas DataFrame: one row per exchange and rank, with the
    columns of :mod:`lsgd.comm.p2p_trace`'s docstring and, per work kind, its end (``recv``, ``send``, ... seconds;
    the latest over peers) relative to the run's first post."""
    rows = []
    for path in sorted(Path(folder).glob("p2p_rank*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                for kind, _peer, t in row.pop("works"):
                    row[kind] = max(row.get(kind) or t, t)
                rows.append(row)
    df = pd.DataFrame(rows)
    if len(df):
        t0 = df["post"].min()
        for col in ("post", "posted", "wait", "waited", "recv", "send", "recv_stamp", "send_stamp"):
            if col in df:
                df[col] = df[col] - t0
    return df
