"""The compression gains GraVAC's controller saw, per arm and per compression factor: what its
epsilon rule and its theta_min raise (Algorithm 1 of Tyagi and Swany 2023) decided on.
``scripts/gravac_gains.py`` prints them for run folders.

:func:`summarize` reads every ``gravac`` run's per-step compression rows (``"kind": "compression"``
in metrics.jsonl, docs/results.md, through :func:`lsgd.analysis.load.read_runs`) into two
tables, :func:`markdown` writes them, the seeds of an arm pooled (an arm: experiment, ``algo.compressor``,
``algo.epsilon``, ``algo.omega``, ``algo.window``, ``algo.gain``: a run without the key, from before
it existed, used the paper's rule):

* gains per CF: for each CF the controller evaluated, as theta_min (``gain_min`` of the rows with
  that ``cf_min``) and as the candidate (``gain_candidate`` of the rows with that
  ``cf_candidate``): steps observed (all seeds), median, 10th and 90th percentile, min and max.
  These are the controller's EWMA-smoothed gains ``||C(g_ef)||^2 / ||g_ef||^2`` (``algo.gain=paper``;
  ``authors_code``: the authors' code's ratio of unsquared per-layer norms, docs/papers.md#gravac;
  the smoothing restarts when a CF changes), the values the epsilon rule compares with eps and the omega rule
  compares with each other;
* decisions: per arm, the share of steps that sent the candidate, theta_min or dense, the
  relative gap ``|gain_min - gain_candidate| / gain_min`` at the window ends (the omega rule's
  input: theta_min rises when it is <= omega), each seed's theta_min path (CF from its first
  step) and whether it settled (theta_min == candidate at its last step).

``skip`` (``--skip N`` of the script) leaves out each run's first N steps (the EWMA's start-up).
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np


def _fmt_cf(cf: float) -> str:
    return f"{cf:g}x"


def arm_of(run) -> tuple:
    """(experiment, compressor, epsilon, omega, window, gain rule) of a run: the seeds of an arm share it."""
    c = run.config
    return (run.experiment_name, c.get("algo.compressor"), c.get("algo.epsilon"), c.get("algo.omega"), c.get("algo.window"),
            c.get("algo.gain") or "paper")


def arm_label(arm: tuple) -> str:
    """The arm's name; the gain rule is named when it is not the paper's (the default)."""
    exp, comp, eps, omega, window, gain = arm
    rule = "" if gain == "paper" else f" gain={gain}"
    return f"{exp}: GraVAC/{comp} eps={eps:g} omega={omega:g} window={window}{rule}"


def _stats(values: list[float]) -> dict:
    a = np.asarray(values, dtype=float)
    q10, med, q90 = np.percentile(a, [10, 50, 90])
    return {"steps": len(a), "median": float(med), "p10": float(q10), "p90": float(q90),
            "min": float(a.min()), "max": float(a.max())}


def summarize(runs: list, skip: int = 0) -> tuple[list[dict], list[dict]]:
    """(gains per arm, CF and role; decisions per arm) of the ``gravac`` runs among ``runs``
    (:class:`lsgd.analysis.load.RunData`), as the module docstring describes; ``skip`` leaves out
    each run's first ``skip`` steps. Arms and CFs in ascending order."""
    as_min: dict[tuple, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    as_cand: dict[tuple, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    sent: dict[tuple, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    gaps: dict[tuple, list[float]] = defaultdict(list)
    paths: dict[tuple, list[str]] = defaultdict(list)
    runs = [r for r in runs if r.config.get("algo.name") == "gravac" and r.compression]
    for run in sorted(runs, key=lambda r: (tuple(map(str, arm_of(r))), r.config.get("seed", 0))):
        arm = arm_of(run)
        window = int(run.config.get("algo.window") or 1)
        rows = [r for r in run.compression if r["step"] > skip]
        path: list[str] = []
        for r in rows:
            as_min[arm][float(r["cf_min"])].append(float(r["gain_min"]))
            if r["cf_candidate"] != r["cf_min"]:
                as_cand[arm][float(r["cf_candidate"])].append(float(r["gain_candidate"]))
            sent[arm][r["sent"]] += 1
            if r["step"] % window == 0 and r["gain_min"] > 0:  # a window end: the omega rule's input
                gaps[arm].append(abs(r["gain_min"] - r["gain_candidate"]) / r["gain_min"])
            label = _fmt_cf(float(r["cf_min"]))
            if not path or not path[-1].startswith(label + "@"):
                path.append(f"{label}@{r['step']}")
        settled = bool(rows) and rows[-1]["cf_min"] == rows[-1]["cf_candidate"]
        paths[arm].append(f"seed {run.config.get('seed')}: {' -> '.join(path)}{' (settled)' if settled else ''}")
    gains, decisions = [], []
    for arm in sorted(as_min, key=lambda a: tuple(map(str, a))):
        for cf in sorted(set(as_min[arm]) | set(as_cand[arm])):
            for role, table in (("theta_min", as_min[arm]), ("candidate", as_cand[arm])):
                if table.get(cf):
                    gains.append({"arm": arm_label(arm), "cf": cf, "as": role, **_stats(table[cf])})
        total = sum(sent[arm].values())
        decisions.append({
            "arm": arm_label(arm),
            **{f"sent_{k}": sent[arm].get(k, 0) / total for k in ("candidate", "min", "dense")},
            "gap_median": float(np.median(gaps[arm])) if gaps[arm] else math.nan,
            "gap_min": min(gaps[arm]) if gaps[arm] else math.nan,
            "paths": paths[arm],
        })
    return gains, decisions


def markdown(gains: list[dict], decisions: list[dict]) -> str:
    """The two tables of :func:`summarize`'s ``(gains, decisions)`` as markdown, a blank line between."""
    lines = ["| arm | CF | as | steps | median | p10 | p90 | min | max |",
             "|---|---|---|---|---|---|---|---|---|"]
    for g in gains:
        lines.append(f"| {g['arm']} | {_fmt_cf(g['cf'])} | {g['as']} | {g['steps']} | {g['median']:.3f} | {g['p10']:.3f} | "
                     f"{g['p90']:.3f} | {g['min']:.3f} | {g['max']:.3f} |")
    lines += ["",
              "| arm | sent candidate / theta_min / dense | omega gap at window ends: median (min) | theta_min path per seed |",
              "|---|---|---|---|"]
    for d in decisions:
        shares = " / ".join(f"{d[f'sent_{k}']:.1%}" for k in ("candidate", "min", "dense"))
        lines.append(f"| {d['arm']} | {shares} | {d['gap_median']:.3f} ({d['gap_min']:.3f}) | {'; '.join(d['paths'])} |")
    return "\n".join(lines)
