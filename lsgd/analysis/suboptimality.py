"""Suboptimality of an ``adsaga`` study (``experiment=adsaga_logreg``): the metric ``lsgd report``
does not show. ``scripts/adsaga_table.py`` prints the table and writes the figure for a folder.

Reads every run folder's ``config.yaml`` and ``metrics.jsonl`` (docs/results.md; :func:`load`)
and writes one markdown row per run (:func:`suboptimality_table`): the arm (``study.arm``, else
``algo.mode`` / ``algo.variance_reduction``), step size, final ``suboptimality`` f - f*, the
suboptimality at the smallest final iteration count among the runs (log-linear interpolation
between records: equal server iterations, :func:`at_iterations`), final iterations and component
gradients, MB sent (``comm_bytes``: mean over ranks, server included; ``comm_bytes_max``: the
server), modeled time (s) and final test accuracy. :func:`suboptimality_figure`: suboptimality vs
server iterations and vs gradients (log y).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import yaml

#: the figure's file in the study folder
FIGURE_FILE = "adsaga_suboptimality.png"


def load(folder: Path) -> list[dict]:
    """The runs under ``folder`` (``<folder>/<run>/``) that have suboptimality records: ``arm``, ``lr``,
    ``records`` (the metrics records with ``suboptimality``, per-step rows left out), ``seed``."""
    runs = []
    for run in sorted(p.parent for p in folder.glob("*/metrics.jsonl")):
        cfg = yaml.safe_load((run / "config.yaml").read_text())
        cfg = cfg.get("config", cfg)
        recs = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
                if "kind" not in r and "suboptimality" in r]
        if not recs:
            continue
        algo = cfg.get("algo", {})
        arm = (cfg.get("study") or {}).get("arm") or f"{algo.get('mode')}, vr={algo.get('variance_reduction')}"
        runs.append({"arm": arm, "lr": cfg.get("optim", {}).get("lr"), "records": recs, "seed": cfg.get("seed")})
    return runs


def at_iterations(recs: list[dict], it: float) -> float:
    """Suboptimality at ``it`` server iterations, log-linear between the records around it."""
    xs = np.array([r["iterations"] for r in recs], dtype=float)
    ys = np.log(np.array([max(r["suboptimality"], 1e-300) for r in recs]))
    return float(math.exp(np.interp(it, xs, ys)))


def suboptimality_table(runs: list[dict]) -> str:
    """The markdown table of ``runs`` (:func:`load`), one row per run, as the module docstring
    describes; the common iteration count is the smallest final one among the runs."""
    common = min(r["records"][-1]["iterations"] for r in runs)
    lines = [f"| arm | seed | optim.lr | final f - f* | f - f* at {common} iterations | iterations | gradients | "
             f"MB sent (mean over ranks / server) | modeled time (s) | final test acc |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        last = r["records"][-1]
        acc = [x["test_acc"] for x in r["records"] if "test_acc" in x]
        lines.append(f"| {r['arm']} | {r['seed']} | {r['lr']} | {last['suboptimality']:.3e} | "
                     f"{at_iterations(r['records'], common):.3e} | {last['iterations']} | {last['gradients']} | "
                     f"{last['comm_bytes'] / 1e6:.1f} / {last.get('comm_bytes_max', last['comm_bytes']) / 1e6:.1f} | "
                     f"{last['modeled_time_s']:.3f} | {acc[-1] if acc else float('nan'):.4f} |")
    return "\n".join(lines)


def suboptimality_figure(runs: list[dict], out: Path) -> Path:
    """Suboptimality of ``runs`` (:func:`load`) vs server iterations and vs component gradients
    (log y, one line per run labelled with its arm), written to ``out`` (PNG, 120 dpi); returns ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for r in runs:
        its = [x["iterations"] for x in r["records"]]
        grads = [x["gradients"] for x in r["records"]]
        gaps = [x["suboptimality"] for x in r["records"]]
        axes[0].semilogy(its, gaps, label=r["arm"])
        axes[1].semilogy(grads, gaps, label=r["arm"])
    axes[0].set_xlabel("server iterations")
    axes[1].set_xlabel("component gradients")
    axes[0].set_ylabel("f(x) - f*")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    return out
