"""The clock-validation study (issue 23): the cluster clock (``modeled_time_s``) held against
measured time on the emulated cluster. ``scripts/validate_clock.py`` runs the study's arms
(:data:`ARMS`, one ``lsgd train`` per arm and bandwidth, as root) and tabulates them here.

Each arm (an algorithm with its settings) trains the small CNN on Fashion-MNIST with 4 workers (or 8)
(``experiment=clock_validation``: ``launcher=emulated``, every worker in its own network namespace
behind a tbf-capped veth each way, ``cluster.compute=measured``) at each bandwidth (default 50, 200
and 1000 Mbit/s). For each run:

* **window**: from the record at step ``--warmup-step`` (default 8, the first record: the first
  steps open gloo's connections, DDP rebuilds its buckets, TCP's windows open) to the last record
  (``max_steps``); records are rank 0's (the server's, where a server rank keeps the books) and
  are taken at a step boundary before any evaluation; this study evaluates only after the last
  record and writes no checkpoints, so the window holds training steps and the records' own
  small uncounted collectives (a loss all-reduce and a figures all-gather per 8 steps);
* **measured** = ``wall_time_s`` at the last record minus at the first record of the window
  (rank 0's ``time.perf_counter``; the records' collectives make every lock-step rank reach the
  record before rank 0 reads its clock);
* **modeled** = ``modeled_time_s`` at the same two records (the maximum of the workers' virtual
  clocks, gathered at each record; in a server-kept run, the server's clock);
* **error** = modeled / measured - 1 (negative: the clock is too fast).

Outputs under ``--out`` (:func:`write`; a results folder, not in git): ``validation.csv`` (one row
per run), ``validation.md`` (the table, the median |error|, the worst run's and each arm's, and how
many runs are above and below, against the goals: median |error| <= 5%, every run within 15%) and
``validation_modeled_vs_measured.{png,pdf}`` (log-log, y = x, one marker per algorithm, one colour
per bandwidth); the run folders are under ``runs/``. :func:`from_runs` re-analyses the run folders
of an earlier study. With ``--workers 4,8`` every arm runs at each worker count (a server rank on
top where the method has one: :func:`arm_overrides`).

Written here, not taken from a library: it is a table of differences.
"""

from __future__ import annotations

import csv
import json
import math
import re
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

#: goals (issue 41, with the per-message overhead o priced): median |error| over all runs, and the
#: |error| of every run; the signs of the errors should no longer all be the same
MEDIAN_GOAL, RUN_GOAL = 0.05, 0.15


@dataclass(frozen=True)
class Arm:
    """One arm of the study: ``lsgd train`` overrides on top of ``experiment=clock_validation``."""

    name: str
    label: str
    overrides: tuple[str, ...]
    steps: int = 48
    marker: str = "o"


#: heterogeneous speeds of the real-timing async arm's workers, repeated to the number of workers
#: (a server rank, speed 1, comes first)
ASYNC_WORKER_SPEEDS = (1.0, 0.8, 0.6, 0.4)
ASYNC_SPEEDS = "[" + ",".join(str(v) for v in (1.0, *ASYNC_WORKER_SPEEDS)) + "]"

#: workers per run by default (the study's first table); ``--workers 4,8`` runs every arm at each
DEFAULT_WORKERS = 4

ARMS: dict[str, Arm] = {a.name: a for a in (
    Arm("ddp", "DDP", ("algo=ddp",), 48, "o"),
    Arm("local_sgd", "local SGD, H=8", ("algo=local_sgd", "algo.local_steps=8"), 96, "s"),
    Arm("slowmo", "SlowMo, H=8", ("algo=slowmo", "algo.local_steps=8"), 96, "D"),
    Arm("topk_10x", "compressed, top-k, CF=10", ("algo=compressed", "algo.compressor=topk", "algo.cf=10"), 48, "v"),
    Arm("dpsgd_ring", "D-PSGD, ring", ("algo=dpsgd", "algo.topology=ring"), 48, "^"),
    Arm("dpsgd_complete", "D-PSGD, complete", ("algo=dpsgd", "algo.topology=complete"), 40, "<"),
    Arm("swarm_blocking", "SwarmSGD, blocking", ("algo=swarm_sgd", "algo.blocking=true"), 48, "P"),
    Arm("swarm_nonblocking", "SwarmSGD, non-blocking", ("algo=swarm_sgd", "algo.blocking=false"), 48, "X"),
    Arm("param_server", "parameter server", ("algo=param_server", "launcher.nproc_per_node=5"), 24, "h"),
    # real timing needs cluster.compute=profile: each worker's step is stretched in wall time to its
    # modeled seconds (step_time_s / speed), so the clock's compute is what the worker really spends
    # as long as the real compute fits in the stretch (lsgd/algorithms/asynchronous/real_timing.py)
    Arm("async_real", "async local SGD (DN), H=8, real timing",
        ("algo=async_local_sgd", "algo.timing=real", "algo.local_steps=8", "cluster.compute=profile",
         "cluster.step_time_s=0.05", f"cluster.speeds={ASYNC_SPEEDS}", "launcher.nproc_per_node=5"), 48, "*"),
)}  # fmt: skip

DEFAULT_BANDWIDTHS_MBIT = (50, 200, 1000)


def ranks_of(arm: Arm, workers: int) -> int:
    """Ranks of ``arm``'s run with ``workers`` workers: one more where a server rank comes on top."""
    return workers + (1 if server_arm(arm) else 0)


def server_arm(arm: Arm) -> bool:
    """Whether ``arm``'s method has a server rank (the parameter server, asynchronous local SGD)."""
    return any(o in ("algo=param_server", "algo=async_local_sgd") for o in arm.overrides)


def arm_overrides(arm: Arm, workers: int = DEFAULT_WORKERS) -> list[str]:
    """``arm``'s overrides for a run of ``workers`` workers: ``launcher.nproc_per_node`` (the
    workers, plus the server rank where there is one) and, for the real-timing async arm,
    ``cluster.speeds`` with :data:`ASYNC_WORKER_SPEEDS` repeated to ``workers``."""
    out = [o for o in arm.overrides if not o.startswith(("launcher.nproc_per_node=", "cluster.speeds="))]
    out.append(f"launcher.nproc_per_node={ranks_of(arm, workers)}")
    if any(o.startswith("cluster.speeds=") for o in arm.overrides):
        speeds = [1.0] + [ASYNC_WORKER_SPEEDS[i % len(ASYNC_WORKER_SPEEDS)] for i in range(workers)]
        out.append("cluster.speeds=[" + ",".join(f"{v:g}" for v in speeds) + "]")
    return out


def run_name(arm: str, mbit: float, workers: int) -> str:
    """A run's experiment name: ``<arm>_<bw>mbit`` with 4 workers (the first study's), else
    ``<arm>_<bw>mbit_w<workers>`` (:func:`from_runs` reads both)."""
    return f"{arm}_{mbit:g}mbit" + ("" if workers == DEFAULT_WORKERS else f"_w{workers}")


@dataclass
class Result:
    """One run's row of the table."""

    arm: str
    label: str
    bandwidth_mbit: float
    run_dir: str
    status: str
    workers: int = DEFAULT_WORKERS
    overhead_us: float = math.nan    # network.overhead_us the run's clock priced each message end with
    steps: int = 0                   # training steps in the window (per worker)
    measured_s: float = math.nan
    modeled_s: float = math.nan
    modeled_compute_s: float = math.nan  # the clock's compute in the window (mean over ranks)
    error: float = math.nan          # modeled / measured - 1
    load_before: float = math.nan    # 1-minute load average when the run started / ended
    load_after: float = math.nan
    extra: dict = field(default_factory=dict)


def read_records(run_dir: Path) -> list[dict]:
    """The run's metrics records (rank 0's / the server's), in order; per-step rows (with a
    ``kind``) are left out."""
    out = []
    path = Path(run_dir) / "metrics.jsonl"
    for line in path.read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            if "kind" not in rec and "wall_time_s" in rec and "modeled_time_s" in rec:
                out.append(rec)
    return out


def window(records: list[dict], warmup_step: int) -> dict:
    """Measured and modeled seconds between the first record at a step >= ``warmup_step`` and the
    last record: ``{"steps", "measured_s", "modeled_s", "modeled_compute_s", "error"}``.

    Raises:
        ValueError: fewer than two records from ``warmup_step`` on, or a window of no time.
    """
    recs = [r for r in records if r["step"] >= warmup_step]
    if len(recs) < 2:
        raise ValueError(f"need two records at steps >= {warmup_step}, got steps {[r['step'] for r in records]}")
    first, last = recs[0], recs[-1]
    measured = float(last["wall_time_s"]) - float(first["wall_time_s"])
    modeled = float(last["modeled_time_s"]) - float(first["modeled_time_s"])
    if not measured > 0:
        raise ValueError(f"measured window of {measured} s between steps {first['step']} and {last['step']}")
    compute = (float(last.get("modeled_compute_s", math.nan)) - float(first.get("modeled_compute_s", math.nan)))
    return {"steps": int(last["step"]) - int(first["step"]), "measured_s": measured, "modeled_s": modeled,
            "modeled_compute_s": compute, "error": modeled / measured - 1.0}


def summarize(results: list[Result]) -> dict:
    """The study's verdict over completed runs: ``median_abs_error`` (and ``median_ok``), ``worst``
    (the largest |error| of any run, and ``worst_ok``), ``arms`` (arm -> worst |error| over its
    bandwidths and worker counts), ``over`` (the runs past :data:`RUN_GOAL`), ``above`` / ``below``
    (runs whose modeled time is above / below the measured), ``runs``, ``failed``."""
    ok = [r for r in results if math.isfinite(r.error)]
    worst: dict[str, float] = {}
    for r in ok:
        worst[r.arm] = max(worst.get(r.arm, 0.0), abs(r.error))
    med = statistics.median(abs(r.error) for r in ok) if ok else math.nan
    top = max((abs(r.error) for r in ok), default=math.nan)
    return {"median_abs_error": med, "median_ok": bool(med <= MEDIAN_GOAL), "worst": top,
            "worst_ok": bool(top <= RUN_GOAL), "arms": worst,
            "over": [f"{r.arm}@{r.bandwidth_mbit:g}/w{r.workers}" for r in ok if abs(r.error) > RUN_GOAL],
            "above": sum(r.error > 0 for r in ok), "below": sum(r.error < 0 for r in ok), "runs": len(ok),
            "failed": sorted(f"{r.arm}@{r.bandwidth_mbit:g}/w{r.workers}" for r in results if not math.isfinite(r.error))}


def markdown(results: list[Result], verdict: dict) -> str:
    """The table (one row per run) and the verdict, as markdown."""
    lines = ["| arm | workers | Mbit/s | steps | o (us) | measured (s) | modeled (s) | modeled compute (s) | error |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        o = "" if not math.isfinite(r.overhead_us) else f"{r.overhead_us:.0f}"
        if math.isfinite(r.error):
            lines.append(f"| {r.label} | {r.workers} | {r.bandwidth_mbit:g} | {r.steps} | {o} | {r.measured_s:.3f} | "
                         f"{r.modeled_s:.3f} | {r.modeled_compute_s:.3f} | {100 * r.error:+.1f}% |")
        else:
            lines.append("| " + " | ".join([r.label, str(r.workers), f"{r.bandwidth_mbit:g}", "", o, "", "", "", r.status])
                         .replace("  ", " ") + " |")
    lines += ["", f"Median |error| over {verdict['runs']} runs: {100 * verdict['median_abs_error']:.1f}% "
              f"(goal <= {100 * MEDIAN_GOAL:.0f}%: {'met' if verdict['median_ok'] else 'missed'}); "
              f"worst {100 * verdict['worst']:.1f}% (goal: every run within {100 * RUN_GOAL:.0f}%: "
              + ("met" if verdict["worst_ok"] else f"missed by {', '.join(verdict['over'])}") + "); "
              f"modeled above measured in {verdict['above']} runs, below in {verdict['below']}.",
              "Worst |error| per arm: " + ", ".join(f"{a} {100 * e:.1f}%" for a, e in verdict["arms"].items()) + "."]
    if verdict["failed"]:
        lines.append("Runs without a result: " + ", ".join(verdict["failed"]) + ".")
    return "\n".join(lines) + "\n"


def figure(results: list[Result], path: Path) -> None:
    """Modeled vs measured seconds, log-log, the y = x line with the ±:data:`RUN_GOAL` band, one
    marker per arm, one colour per bandwidth (hollow markers: more than 4 workers); written as
    ``path``.png and .pdf."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    ok = [r for r in results if math.isfinite(r.error) and r.modeled_s > 0]
    if not ok:
        return
    bws = sorted({r.bandwidth_mbit for r in ok})
    colors = dict(zip(bws, plt.get_cmap("viridis")([0.1 + 0.8 * i / max(1, len(bws) - 1) for i in range(len(bws))])))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in ok:
        many = r.workers > DEFAULT_WORKERS
        ax.scatter(r.measured_s, r.modeled_s, marker=ARMS[r.arm].marker if r.arm in ARMS else "o",
                   color="none" if many else colors[r.bandwidth_mbit], s=45,
                   edgecolors=colors[r.bandwidth_mbit] if many else "black", linewidths=1.0 if many else 0.4, zorder=3)
    lo = min(min(r.measured_s, r.modeled_s) for r in ok) / 1.5
    hi = max(max(r.measured_s, r.modeled_s) for r in ok) * 1.5
    ax.plot([lo, hi], [lo, hi], color="gray", lw=1, zorder=1)
    band = 1.0 + RUN_GOAL
    ax.fill_between([lo, hi], [lo / band, hi / band], [lo * band, hi * band], color="gray", alpha=0.12, lw=0, zorder=0)
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="measured wall time of the window (s)",
           ylabel="modeled time of the window (s)")
    ax.set_aspect("equal")
    arms = [a for a in ARMS if any(r.arm == a for r in ok)]
    handles = [Line2D([], [], ls="", marker=ARMS[a].marker, color="gray", markeredgecolor="black", label=ARMS[a].label)
               for a in arms]
    handles += [Line2D([], [], ls="", marker="o", color=colors[b], label=f"{b:g} Mbit/s") for b in bws]
    handles += [Line2D([], [], color="gray", label=f"y = x (band: ±{100 * RUN_GOAL:.0f}%)")]
    ax.legend(handles=handles, loc="center left", bbox_to_anchor=(1.02, 0.5), fontsize=8, frameon=False)
    for ext in ("png", "pdf"):
        fig.savefig(path.with_suffix(f".{ext}"), bbox_inches="tight", dpi=150)
    plt.close(fig)


def summary_workers(cfg: dict) -> int:
    """The workers of a run from its ``config.yaml``: its ranks less a server rank where its method
    has one."""
    ranks = int(cfg.get("world_size") or (cfg.get("launcher") or {}).get("nproc_per_node") or DEFAULT_WORKERS)
    name = (cfg.get("algo") or {}).get("name")
    return ranks - (1 if name in ("param_server", "async_local_sgd") else 0)


def analyse(run: Path, res: Result, warmup_step: int = 8) -> Result:
    """Fill ``res`` from run folder ``run`` (its records and summary)."""
    res.run_dir = str(run)
    try:
        cfg = yaml.safe_load((run / "config.yaml").read_text()) or {}
        res.workers = int(summary_workers(cfg))
        res.overhead_us = float((cfg.get("network") or {}).get("overhead_us") or 0.0)
        summary = json.loads((run / "summary.json").read_text())
        res.status = summary.get("status", "?")
        w = window(read_records(run), warmup_step)
    except (OSError, ValueError, KeyError) as exc:
        res.status = f"unreadable ({exc})"
        return res
    res.steps, res.measured_s, res.modeled_s = w["steps"], w["measured_s"], w["modeled_s"]
    res.modeled_compute_s, res.error = w["modeled_compute_s"], w["error"]
    return res


def from_runs(root: Path, warmup_step: int) -> list[Result]:
    """Rows of every run folder under ``root`` (experiment names ``<arm>_<bw>mbit``), in the order of
    :data:`ARMS` then bandwidth."""
    out = []
    for config in sorted(Path(root).rglob("config.yaml")):
        run = config.parent
        m = re.match(r"(.+)_([\d.]+)mbit(?:_w(\d+))?$", run.parent.name)
        if run.name == ".hydra" or not m:
            continue
        arm = ARMS.get(m.group(1))
        out.append(analyse(run, Result(m.group(1), arm.label if arm else m.group(1), float(m.group(2)), "", "?"),
                           warmup_step))
    order = list(ARMS)
    return sorted(out, key=lambda r: (r.workers, order.index(r.arm) if r.arm in order else len(order),
                                      r.bandwidth_mbit))


def write(results: list[Result], out: Path) -> dict:
    """validation.csv, validation.md and the figure under ``out``; returns the verdict."""
    out.mkdir(parents=True, exist_ok=True)
    verdict = summarize(results)
    with open(out / "validation.csv", "w", newline="") as fh:
        rows = [{**{k: v for k, v in asdict(r).items() if k != "extra"}, **r.extra} for r in results]
        keys = list(dict.fromkeys(k for row in rows for k in row))
        writer = csv.DictWriter(fh, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)
    (out / "validation.md").write_text(markdown(results, verdict))
    figure(results, out / "validation_modeled_vs_measured")
    return verdict
