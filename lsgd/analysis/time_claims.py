"""The time-claims study (issue 23): the papers' time claims in measured wall-clock time on the
emulated 100 Mbit/s link. ``scripts/time_claims.py`` runs the arms (as root); this module holds
the study's arms and tabulates their run folders (:func:`table`).

The arms of three comparisons (:data:`STUDIES`) run one at a time with ``launcher=emulated
network.bandwidth_gbps=0.1`` (every worker in its own network namespace behind a tbf-capped veth
each way; needs root) and ``launcher.interrupts=false`` (no per-step stop agreement: its 4-byte
all-reduce per step would tie the workers together at every step, which a method that syncs every
H steps does not do; the clock-validation study does the same; :data:`COMMON`), the load average
recorded before and after each run:

* ``demo``: ddp vs local SGD (H = 8) vs SlowMo (H = 12) on ``experiment=fmnist_demo`` (4 workers,
  3 epochs), time to the demo's ``target_acc`` 0.85;
* ``swarm`` (n = 4) and ``swarm8`` (n = 8): SwarmSGD (H = 1 and H = 4, blocking, 8-bit lattice)
  vs all-reduce SGD (ddp) on ``experiment=swarm_fmnist`` (1 epoch), time to a common accuracy;
* ``async``: async DN + DyLU (``algo.timing=real``, which needs ``grace_period_s=0`` and
  ``shard_policy=worker``) vs synchronous DiLoCo on ``experiment=async_text`` at heterogeneity
  ``very``, time to a common test perplexity (14). Both run the workers' speeds in wall time:
  the async arm by its real timing, sync DiLoCo by ``cluster.stretch=true`` (each local step
  stretched to 0.1 s / speed, the same rule; arm ``async_sync_diloco_stretch``). The arm
  ``async_sync_diloco`` is sync DiLoCo at the host's equal speeds (before the stretch existed, its
  time at ``very`` was derived from it: its time outside compute + steps x the slowest step).

Every arm evaluates at the same steps (``eval_unit=step``, ``eval_every`` = 48 steps for the
Fashion-MNIST studies, a multiple of H = 8 and 12 so local SGD / SlowMo replicas are in sync there)
and records every ``eval_every / 2`` steps, so evaluation time can be taken out of the wall time:

* a record's ``wall_time_s`` (rank 0's, or the server's in a server-kept run) is read before its
  own evaluation, so it holds the training time plus every *earlier* evaluation;
* **eval_s** (one evaluation's wall cost) = median wall seconds of the record intervals that start
  at an evaluated record minus the median of those that do not (same number of steps each);
* **time to target (measured)** = ``wall_time_s`` of the first evaluated record whose test metric
  reaches the target, minus (evaluations before it) x eval_s; **raw** = without the subtraction;
* **modeled** = ``modeled_time_s`` of the same record (the clock charges no evaluation).

Written here, not taken from a library: a table of differences (the same shape as
:mod:`lsgd.analysis.clock_validation`).
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

#: overrides of every arm: the emulated 100 Mbit/s link, no per-step stop agreement, no checkpoints
COMMON = ("launcher=emulated", "network.bandwidth_gbps=0.1", "launcher.interrupts=false", "checkpoint_every=0")
FMNIST_EVAL = ("eval_unit=step", "eval_every=48", "log_every=24")

#: study -> arm -> overrides
STUDIES: dict[str, dict[str, tuple[str, ...]]] = {
    "demo": {
        "demo_ddp": ("experiment=fmnist_demo", "algo=ddp", *FMNIST_EVAL),
        "demo_local_sgd": ("experiment=fmnist_demo", "algo=local_sgd", "algo.local_steps=8", *FMNIST_EVAL),
        "demo_slowmo": ("experiment=fmnist_demo", "algo=slowmo", "algo.local_steps=12", *FMNIST_EVAL),
    },
    "swarm": {
        f"swarm{n}_{v}": ("experiment=swarm_fmnist", f"variant={v}", f"launcher.nproc_per_node={n}", *FMNIST_EVAL,
                          "eval_workers=false", "consensus_every_record=false")
        for n in (4,) for v in ("dense", "swarm_h1", "swarm_h4")
    },
    "swarm8": {
        f"swarm8_{v}": ("experiment=swarm_fmnist", f"variant={v}", "launcher.nproc_per_node=8", *FMNIST_EVAL,
                        "eval_workers=false", "consensus_every_record=false")
        for v in ("dense", "swarm_h4", "swarm_h1")
    },
    # n = 8 with evaluations every 16 steps (the 48-step ones did not resolve DDP's time to target)
    "swarm8_fine": {
        f"swarm8fine_{v}": ("experiment=swarm_fmnist", f"variant={v}", "launcher.nproc_per_node=8", "eval_unit=step",
                            "eval_every=16", "log_every=8", "eval_workers=false", "consensus_every_record=false")
        for v in ("dense", "swarm_h4", "swarm_h1")
    },
    "async": {
        "async_sync_diloco": ("experiment=async_text", "study.heterogeneity=very", "variant=async_sync_diloco"),
        # the speeds in wall time: every local step stretched to 0.1 s / speed (cluster.stretch)
        "async_sync_diloco_stretch": ("experiment=async_text", "study.heterogeneity=very", "variant=async_sync_diloco",
                                      "cluster.stretch=true"),
        "async_dn_dylu": ("experiment=async_text", "study.heterogeneity=very", "variant=async_dn_dylu",
                          "algo.timing=real", "study.grace_period_s=0", "study.shard_policy=worker"),  # real timing: no grace period, own shards
    },
}

#: the target of each study (``--target`` overrides): test accuracy; ``async``: test perplexity
DEFAULT_TARGETS = {"demo": 0.85, "swarm": 0.85, "swarm8": 0.85, "swarm8_fine": 0.85, "async": 14.0}


def records(run: Path) -> list[dict]:
    """Rank 0's (the server's) records in order; per-step / per-arrival rows left out."""
    out = []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            if "kind" not in rec and "wall_time_s" in rec:
                out.append(rec)
    return out


def metric_of(recs: list[dict]) -> str:
    return "test_acc" if any("test_acc" in r for r in recs) else "test_ppl"


def eval_cost(recs: list[dict]) -> float:
    """One evaluation's wall seconds: median interval starting at an evaluated record minus the
    median interval starting at a plain one, over intervals of the most common step count."""
    pairs = [(a, b) for a, b in zip(recs, recs[1:])]
    if not pairs:
        return math.nan
    gap = statistics.mode(b["step"] - a["step"] for a, b in pairs)
    key = metric_of(recs)
    with_eval = [b["wall_time_s"] - a["wall_time_s"] for a, b in pairs if b["step"] - a["step"] == gap and key in a]
    without = [b["wall_time_s"] - a["wall_time_s"] for a, b in pairs if b["step"] - a["step"] == gap and key not in a]
    if not with_eval or not without:
        return math.nan
    return max(0.0, statistics.median(with_eval) - statistics.median(without))


def _evals_s(n: int, ev: float) -> float:
    """Wall seconds of ``n`` evaluations at ``ev`` each (none: 0, even where ``ev`` is unknown)."""
    return n * ev if n else 0.0


def reached(value: float, target: float, key: str) -> bool:
    return value >= target if key == "test_acc" else value <= target


def time_to(recs: list[dict], target: float, ev: float) -> dict:
    """The first evaluated record reaching ``target``: step, raw and eval-excluded wall seconds,
    the eval-excluded wall seconds of the evaluation before it (``prev_s``: the target was reached
    in between), modeled seconds (NaN when never reached)."""
    key = metric_of(recs)
    evals, prev = 0, 0.0
    for r in recs:
        if key in r:
            if reached(r[key], target, key):
                return {"step": r["step"], "raw_s": r["wall_time_s"], "wall_s": r["wall_time_s"] - _evals_s(evals, ev),
                        "prev_s": prev, "modeled_s": r["modeled_time_s"], "evals_before": evals}
            prev = r["wall_time_s"] - _evals_s(evals, ev)
            evals += 1
    return {"step": None, "raw_s": math.nan, "wall_s": math.nan, "prev_s": math.nan, "modeled_s": math.nan,
            "evals_before": evals}


def summarize(run: Path) -> dict:
    recs = records(run)
    key = metric_of(recs)
    vals = [r[key] for r in recs if key in r]
    best = (max if key == "test_acc" else min)(vals)
    last = recs[-1]
    ev = eval_cost(recs)
    n_evals = len(vals)
    return {"run": str(run), "metric": key, "best": best, "final": vals[-1], "steps": last["step"],
            "evals": n_evals, "eval_s": ev, "end_raw_s": last["wall_time_s"],
            "end_wall_s": last["wall_time_s"] - _evals_s(n_evals - 1, ev), "end_modeled_s": last["modeled_time_s"],
            "recs": recs}


def table(runs: Path, targets: dict[str, float]) -> str:
    """One markdown row per run folder under ``runs`` (``<arm>/<timestamp>``)."""
    lines = ["| arm | target | step | measured to target (s) | previous eval (s) | raw (s) | modeled to target (s) | evals before | "
             "eval (s) | best | steps | measured, all steps (s) | modeled, all steps (s) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for arm_dir in sorted(p for p in runs.iterdir() if p.is_dir()):
        for run in sorted(p for p in arm_dir.iterdir() if (p / "metrics.jsonl").exists()):
            s = summarize(run)
            study = next((k for k, v in STUDIES.items() if arm_dir.name in v), "")
            target = targets.get(study, targets.get(arm_dir.name, math.nan))
            t = time_to(s["recs"], target, s["eval_s"]) if math.isfinite(target) else {}
            seed = next((ln.split(":", 1)[1].strip() for ln in (run / "config.yaml").read_text().splitlines()
                         if ln.startswith("seed:")), "?")
            lines.append(
                f"| {arm_dir.name} (seed {seed}) | {target:g} | {t.get('step')} | {t.get('wall_s', math.nan):.1f} | {t.get('prev_s', math.nan):.1f} | "
                f"{t.get('raw_s', math.nan):.1f} | {t.get('modeled_s', math.nan):.1f} | {t.get('evals_before')} | "
                f"{s['eval_s']:.2f} | {s['best']:.4g} | {s['steps']} | {s['end_wall_s']:.1f} | {s['end_modeled_s']:.1f} |")
    return "\n".join(lines) + "\n"
