"""What produced the runs, for the report: from their ``environment.json``
(:mod:`lsgd.training.provenance` writes it; :func:`lsgd.analysis.load.environment_fields` reads it)
the commit (``+dirty``: the tree had changes), lsgd, torch, torch's CPU capability, CPU, GPU and
python, one row per distinct combination with the runs that share it (:func:`environment_table`);
a run without the file shows ``-``. When the runs differ in torch version, commit or CPU
capability (their numerics may differ in the last bits), one line says so and names the groups
(:func:`environment_note`). The environment never splits an arm.
"""

from __future__ import annotations

import pandas as pd

from lsgd.analysis.load import ENV_COLUMNS
from lsgd.core.labels import is_missing as _is_missing

#: The report's environment columns (``env.*`` of :func:`lsgd.analysis.load_summaries`) and headers.
ENV_HEADERS = {
    "env.commit": "commit", "env.lsgd": "lsgd", "env.torch": "torch", "env.cpu_capability": "CPU capability",
    "env.cpu": "CPU", "env.gpu": "GPU", "env.python": "python",
}  # fmt: skip

#: Environment columns whose differences between runs :func:`environment_note` states (numerics
#: differ in the last bits between torch versions, code versions and CPU kernels): (singular, plural).
ENV_DIFFERENCES = {
    "env.torch": ("torch version", "torch versions"),
    "env.commit": ("commit", "commits"),
    "env.cpu_capability": ("CPU capability", "CPU capabilities"),
}  # fmt: skip

#: A cell of an environment column the run did not record (no environment.json, not a git checkout).
UNKNOWN = "-"


def _env_cell(value) -> str:
    return UNKNOWN if _is_missing(value) or value == "" else str(value)


def _runs(n: int) -> str:
    return f"{n} run{'s' if n != 1 else ''}"


def has_environment(summaries: pd.DataFrame) -> bool:
    """Whether any run of ``summaries`` has an ``environment.json`` (an ``env.*`` value)."""
    cols = [c for c in ENV_COLUMNS if c in summaries]
    return bool(cols) and bool(summaries[cols].notna().any().any())


def environment_table(summaries: pd.DataFrame) -> pd.DataFrame:
    """One row per distinct environment of the runs (cells strings, ``-`` where not recorded):
    ``runs`` (how many), the :data:`ENV_HEADERS` columns (commit, lsgd, torch, CPU capability, CPU,
    GPU, python) and ``run ids`` (``all`` when every run shares the one row); rows in order of
    their first run."""
    cells = pd.DataFrame({h: (summaries[c] if c in summaries else pd.Series(None, index=summaries.index))
                          .map(_env_cell) for c, h in ENV_HEADERS.items()})  # fmt: skip
    keys = [tuple(r) for r in cells.itertuples(index=False)]
    groups: dict[tuple, list[str]] = {}
    for key, run_id in zip(keys, summaries["run_id"].astype(str)):
        groups.setdefault(key, []).append(run_id)
    rows = []
    for key, ids in groups.items():
        rows.append({"runs": str(len(ids)), **dict(zip(ENV_HEADERS.values(), key)),
                     "run ids": "all" if len(groups) == 1 else ", ".join(ids)})  # fmt: skip
    return pd.DataFrame(rows, columns=["runs", *ENV_HEADERS.values(), "run ids"])


def environment_differences(summaries: pd.DataFrame) -> dict[str, dict[str, int]]:
    """``{env column: {value: runs}}`` for each :data:`ENV_DIFFERENCES` column in which the runs
    hold at least two recorded values (``-``: runs that recorded none), values in sorted order."""
    out = {}
    for col in ENV_DIFFERENCES:
        if col not in summaries:
            continue
        values = summaries[col].map(_env_cell)
        known = sorted(v for v in values.unique() if v != UNKNOWN)
        if len(known) > 1:
            counts = values.value_counts()
            out[col] = {v: int(counts[v]) for v in [*known, *([UNKNOWN] if UNKNOWN in counts else [])]}
    return out


def environment_note(summaries: pd.DataFrame) -> str:
    """One line on what produced the runs of ``summaries``. When they differ in torch version,
    commit or CPU capability it names the groups: ``**The runs differ in their environment:** 2
    torch versions: 2.4.1 (12 runs), 2.5.0 (3 runs).``; else the shared values (or that no run
    recorded its environment)."""
    n = len(summaries)
    if not has_environment(summaries):
        return f"Environment: not recorded (no environment.json in the {_runs(n)}: made before lsgd wrote it)."
    diffs = environment_differences(summaries)
    recorded = int(summaries[[c for c in ENV_COLUMNS if c in summaries]].notna().any(axis=1).sum())
    missing = f"; {_runs(n - recorded)} without environment.json" if recorded < n else ""
    if diffs:
        parts = []
        for col, counts in diffs.items():
            one, many = ENV_DIFFERENCES[col]
            k = len([v for v in counts if v != UNKNOWN])
            parts.append(f"{k} {many if k != 1 else one}: " + ", ".join(f"{v} ({_runs(c)})" for v, c in counts.items()))
        return f"**The runs differ in their environment:** {'; '.join(parts)}{missing}."
    shared = []
    for col in ENV_DIFFERENCES:
        values = [v for v in summaries[col].map(_env_cell).unique() if v != UNKNOWN] if col in summaries else []
        shared.append(f"{ENV_DIFFERENCES[col][0].replace(' version', '')} {values[0] if values else UNKNOWN}")
    who = ("the run" if n == 1 else f"all {n} runs") if not missing else f"{recorded} of {_runs(n)}{missing}"
    return f"Environment: {', '.join(shared)} ({who})."
