"""Golden runs: tiny real training runs of every algorithm, recorded bit for bit.

What the goldens guard
----------------------
Each case composes a config with Hydra (as ``lsgd train`` does), runs the real
:class:`lsgd.trainer.Trainer` ``.fit()`` on every rank of a real gloo process group and records

* ``losses``: the per-step training loss averaged over workers, exactly the ``train_loss`` the
  trainer writes to ``metrics.jsonl`` (``log_every=1``, one value per step), and
* per rank, a sha256 of the final model state (every parameter and buffer: name, dtype, shape and
  raw bytes, in ``state_dict`` order) plus a human-readable float64 sum of the parameters.

The stored files (``tests/golden/<case>.json``) were produced by the code at the time they were
written; ``tests/distributed/test_golden.py`` reruns every case and requires identical numbers (exact
float equality, identical hashes). A refactor of the communicator, the trainer or an algorithm that
is meant to be numerically neutral must leave them untouched. A change that moves them must say
why in its commit message and regenerate them:

    python scripts/make_golden.py                 # all cases; prints what changed
    python scripts/make_golden.py --only ddp slowmo
    python scripts/make_golden.py --check         # compare only, write nothing

Conditions of bit-for-bit equality: CPU, one OpenMP / torch thread on every thread of a rank
(:data:`THREAD_ENV`, as ``lsgd train`` runs two workers on two cores), the same torch build and CPU
kernel family (``environment`` in each file). The files for the first environment they were recorded
in are ``tests/golden/<case>.json``; other environments (e.g. AVX512 kernels beside AVX2) keep theirs
in ``tests/golden/envs/<torch>_<cpu capability>_<machine>/<case>.json``, recorded there at an
unchanged commit. A case with no file for this environment skips rather than report a false
regression; regenerating a case that moved deletes its files of the other environments (they are
stale), so those skip until someone records them there.

All cases of one world size run one after another in a single gloo group (a fresh Trainer each;
the ranks are forked from a forkserver that has imported torch and lsgd once); a case's numbers do
not depend on which other cases ran before it in that group (``make_golden.py --only CASE`` runs a
group for that case alone and reproduces them). A run of the real ``lsgd train`` with a case's
overrides writes the same ``train_loss`` values to its ``metrics.jsonl``.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

GOLDEN_DIR = Path(__file__).resolve().parent
REPO = GOLDEN_DIR.parents[1]
FORMAT_VERSION = 1

# make the repository's lsgd and the gloo helper importable (script and test alike)
for _p in (REPO, REPO / "tests" / "distributed"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

STEPS = 30

#: shared by every case: debug-sized CPU run, 30 steps, a loss record every step, evaluation only
#: after the last step, no checkpoints. 640 samples give 20 / 13 / 10 steps per epoch on 2 / 3 / 4
#: workers, so 30 steps cross at least one epoch boundary (new shuffle). The schedule,
#: :data:`COSINE` (or a case's own schedule) follows.
COMMON = [
    "debug=default",
    "device=cpu",
    "dataset.num_train=640",
    "dataset.num_test=128",
    "epochs=3",
    f"max_steps={STEPS}",
    "batch_size=16",
    "eval_unit=step",
    "eval_every=1000",
    "checkpoint_every=0",
    "log_every=1",
    "launcher.timeout_s=60",
]

#: the default model of a case: cnn at a quarter of its default width (54k parameters; every
#: weight matrix still passes PowerSGD's compression-rate test at rank 2)
SMALL_CNN = ("model.channels=[8,16]", "model.hidden=64")

#: the default schedule of a case: cosine with a linear warm-up over a quarter epoch, then decay to
#: 0.1 x lr at step 30, so the learning rate moves every step
COSINE = ("schedule=cosine", "schedule.warmup_epochs=0.25", "schedule.min_factor=0.1")

#: Accordion reacts to every lr decrease (forces low compression), so under a cosine decay it would
#: stay low all run: its cases use a step schedule with one decay at 0.9 epoch (step 18 on two
#: workers, inside a switch period), and 5-step switch periods (0.25 epoch).
STEP = ("schedule=step", "schedule.milestones=[0.9]")
ACCORDION = ("algo.switch_period=0.25",)


@dataclass(frozen=True)
class Case:
    """One golden run: ``name``, Hydra ``overrides`` (after :data:`COMMON`, ``model`` and
    ``schedule``), ``world_size``."""

    name: str
    overrides: tuple[str, ...]
    world_size: int = 2
    model: tuple[str, ...] = SMALL_CNN
    schedule: tuple[str, ...] = COSINE
    note: str = field(default="", compare=False)

    def all_overrides(self) -> list[str]:
        return COMMON + [f"launcher.nproc_per_node={self.world_size}", *self.model, *self.schedule, *self.overrides]


def _case(name: str, *overrides: str, world_size: int = 2, model: tuple[str, ...] = SMALL_CNN,
          schedule: tuple[str, ...] = COSINE, note: str = "") -> Case:
    return Case(name, tuple(overrides), world_size, model, schedule, note)


CASES: list[Case] = [
    _case("ddp", "algo=ddp"),
    *[
        _case(f"local_sgd_{policy}", "algo=local_sgd", "algo.local_steps=4", f"algo.buffer_policy={policy}")
        for policy in ("maintain", "reset", "average")
    ],
    _case("post_local_sgd", "algo=post_local_sgd", "algo.warmup_steps=8", "algo.local_steps=4"),
    _case("slowmo", "algo=slowmo", "algo.local_steps=4"),
    _case("diloco", "algo=diloco", "algo.local_steps=5", "optim=adamw"),
    _case("compressed_none", "algo=compressed", "algo.compressor=none"),
    _case("compressed_fp16", "algo=compressed", "algo.compressor=fp16"),
    _case("compressed_topk", "algo=compressed", "algo.compressor=topk", "algo.cf=10"),
    _case("compressed_randomk", "algo=compressed", "algo.compressor=randomk", "algo.cf=10"),
    _case("compressed_dgc", "algo=compressed", "algo.compressor=dgc", "algo.cf=10", "algo.warmup_epochs=1",
          note="density warm-up: cf 10 ** (1/2) in the first epoch (20 steps), then 10"),
    _case("compressed_redsync", "algo=compressed", "algo.compressor=redsync", "algo.cf=10"),
    _case("compressed_qsgd", "algo=compressed", "algo.compressor=qsgd", "algo.levels=127"),
    _case("compressed_powersgd", "algo=compressed", "algo.compressor=powersgd", "algo.rank=2", "algo.start_iter=4",
          note="vanilla all-reduce for 4 steps, then rank-2 PowerSGD"),
    # GraVAC (DGC selection, 5-step windows: the candidate CF grows 20, 40, 160, 1000). omega=0: the
    # settling rule compares throughputs T = samples / t_iter * gain whose t_iter holds each rank's
    # measured compute time (wall clock, not all-reduced), so with omega > 0 a run depends on timing;
    # omega=0 keeps every decision on the all-reduced gains.
    _case("gravac_dense", "algo=gravac", "algo.compressor=dgc", "algo.window=5", "algo.omega=0", "algo.epsilon=0.62",
          note="dense fallback (residuals reset) for 7 steps, then theta_min"),
    _case("gravac_candidate", "algo=gravac", "algo.compressor=dgc", "algo.window=5", "algo.omega=0", "algo.epsilon=0.385",
          note="candidate CF (multi-level compression) for 3 steps, then theta_min"),
    _case("accordion_topk", "algo=accordion", "algo.compressor=topk", *ACCORDION, "algo.eta=0.3", schedule=STEP,
          note="layers switch between 99% and 10% kept; all low after the lr decay"),
    # the default-width cnn with 0.1 MB buckets makes two DDP buckets (fc layers | conv layers), and
    # eta=0.8 lets each switch between rank 2 and rank 1 (moving its error-feedback residual along)
    _case("accordion_powersgd", "algo=accordion", "algo.compressor=powersgd", "algo.start_iter=4",
          "algo.bucket_cap_mb=0.1", *ACCORDION, "algo.eta=0.8", model=(), schedule=STEP,
          note="two DDP buckets, each switching between rank 2 and rank 1"),
    _case("adasum_gradient", "algo=adasum", "algo.target=gradient"),
    _case("adasum_delta", "algo=adasum", "algo.target=delta"),
    _case("adasum_delta_w3", "algo=adasum", "algo.target=delta", world_size=3,
          note="non-power-of-two: rank 2 folds into rank 0"),
    _case("adasum_hierarchical_w4", "algo=adasum", "algo.target=delta", "algo.hierarchical=true", "algo.local_size=2",
          world_size=4, note="average inside 2 nodes of 2, Adasum across them"),
    _case("ddp_w4", "algo=ddp", world_size=4),
    _case("local_sgd_w4", "algo=local_sgd", "algo.local_steps=4", "algo.buffer_policy=maintain", world_size=4),
    _case("param_server_w3", "algo=param_server", world_size=3,
          note="rank 0 serves, 2 workers: the process roles (added with the measurement core)"),
    _case("swarm_sgd_w4", "algo=swarm_sgd", "algo.topology=ring", "algo.local_steps=2", "algo.quantizer=lattice",
          "algo.side=1e-3", world_size=4, note="blocking pairwise averaging, 8-bit lattice (issue 12)"),
    _case("swarm_sgd_nonblocking_w4", "algo=swarm_sgd", "algo.local_steps=3", "algo.blocking=false", world_size=4,
          note="snapshots exchanged during the next round, local progress re-added (issue 12)"),
    _case("dpsgd_w4", "algo=dpsgd", "algo.topology=ring", "algo.variant=awc", world_size=4,
          note="adapt-with-combine on the ring, exchange overlapped with the gradient (issue 12)"),
    _case("decentlam_w4", "algo=decentlam", "optim.momentum=0", "algo.momentum=0.9", world_size=4),
    _case("sgp_w4", "algo=sgp", world_size=4, note="push-sum on the one-peer exponential graph (issue 12)"),
    _case("osgp_w4", "algo=sgp", "algo.overlap=true", world_size=4,
          note="Overlap SGP: push-sum shares added one step after they are sent, the exchange in flight meanwhile"),
    _case("ad_psgd_w4", "algo=ad_psgd", world_size=4, note="active/passive pairwise averaging on the ring (issue 12)"),
    _case("lead_w4", "algo=lead", "optim.momentum=0", world_size=4, note="compressed primal-dual, 2-bit quantizer (issue 12)"),
    _case("overlap_local_sgd_w4", "algo=overlap_local_sgd", world_size=4,
          note="anchor pull every 2 steps, the anchor's all-reduce in flight meanwhile (issue 12)"),
]
CASES_BY_NAME = {c.name: c for c in CASES}


# --------------------------------------------------------------------------------------------
# composing and running
# --------------------------------------------------------------------------------------------
def compose(case: Case) -> dict:
    """The resolved, validated run config of ``case`` (as ``lsgd train`` builds it before workers start)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from omegaconf import OmegaConf

    from lsgd.cli import _register_resolvers
    from lsgd.config import validate

    _register_resolvers()
    with initialize_config_module(config_module="lsgd.conf", version_base="1.3"):
        node = hydra_compose("config", overrides=case.all_overrides())
    cfg = OmegaConf.to_container(node, resolve=True, throw_on_missing=True)
    validate(cfg)
    cfg["run_id"] = f"golden-{case.name}"  # lsgd.launch.run sets the run folder name here
    return cfg


def state_digest(model) -> tuple[str, float]:
    """(sha256 of every parameter and buffer: name, dtype, shape, raw bytes; float64 sum of the parameters)."""
    import torch

    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        t = t.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    with torch.no_grad():
        total = sum(p.detach().double().sum().item() for p in model.parameters())
    return h.hexdigest(), total


def _worker(rank: int, world_size: int, jobs: list[tuple[str, dict]], work: str) -> None:
    """One rank: run every ``(name, cfg)`` of ``jobs`` in order with a fresh Trainer, write
    ``work/<name>.rank<r>.json`` (checksums); rank 0 writes the run folder ``work/<name>/``."""
    import torch.distributed as dist

    from lsgd.trainer import Trainer

    for key, value in THREAD_ENV.items():
        if os.environ.get(key) != value:  # a forkserver started earlier without it
            raise RuntimeError(f"golden ranks need {key}={value} from process start, got {os.environ.get(key)!r}")

    for name, cfg in jobs:
        run_dir = Path(work) / name
        if rank == 0:
            run_dir.mkdir(parents=True, exist_ok=True)
        dist.barrier()
        t0 = time.perf_counter()
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # no progress bar when run from a terminal
                trainer = Trainer(cfg, run_dir, "cpu")
                summary = trainer.fit()
        except Exception as exc:
            raise RuntimeError(f"golden case {name!r} failed on rank {rank}: {exc!r}") from exc
        sha, total = state_digest(trainer.model)
        out = {"sha256": sha, "param_sum": total, "status": summary["status"], "steps": summary["steps"],
               "seconds": time.perf_counter() - t0}
        (Path(work) / f"{name}.rank{rank}.json").write_text(json.dumps(out))


def read_losses(run_dir: Path) -> list[float]:
    """Per-step ``train_loss`` of rank 0's ``metrics.jsonl`` (records without a ``kind`` key)."""
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    recs = [r for r in recs if "kind" not in r and "train_loss" in r]
    steps = [r["step"] for r in recs]
    if steps != list(range(1, len(steps) + 1)):
        raise AssertionError(f"{run_dir}: expected one train_loss record per step, got steps {steps}")
    return [r["train_loss"] for r in recs]


def environment() -> dict:
    """What bit-for-bit equality depends on besides the code."""
    import torch

    return {
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "machine": platform.machine(),
        "python": platform.python_version(),
    }


#: imported once by the forkserver that forks every rank (a freshly spawned rank spends about six
#: CPU seconds importing torch and, at its first optimizer, torch._dynamo)
PRELOAD = ["torch", "torch._dynamo", "torch.distributed", "lsgd.trainer", "gloo", "cases"]

#: One OpenMP thread on *every* thread of a rank, as ``lsgd.launch.spawn_local`` arranges by
#: exporting OMP_NUM_THREADS (= threads per worker, 1 on this machine) before its workers start.
#: ``torch.set_num_threads(1)`` alone (what tests/distributed/gloo.py does) covers only the calling
#: thread: a future callback runs on gloo's thread when the collective is still in flight when
#: ``.then`` is attached, and inline on the main thread when it has already completed (a race), and
#: gloo's thread uses the default OpenMP team (all cores). torch's PowerSGD hook computes its P / Q
#: products in such callbacks, so with the default-width cnn (accordion_powersgd) the run changed
#: from run to run and the two ranks' replicas drifted apart at rounding level.
THREAD_ENV = {"OMP_NUM_THREADS": "1"}  # the same as tests/distributed/gloo.py's, which starts the forkserver


def _run_group(world_size: int, jobs: list[tuple[str, dict]], work: Path) -> None:
    """:func:`gloo.run_gloo` (same rank setup: one torch thread, gloo over TCP), except that the
    ranks are forked from a forkserver holding the imports rather than spawned from scratch, and
    that the forkserver starts with :data:`THREAD_ENV` (the caller's environment is left as it was)."""
    import gloo
    import torch.multiprocessing as mp

    gloo.start_forkserver(PRELOAD)  # no-op when already running (then _worker checks its env)
    mp.start_processes(
        gloo._entry, args=(_worker, world_size, gloo._free_port(), (jobs, str(work))),
        nprocs=world_size, join=True, start_method="forkserver",
    )


def run_cases(names: list[str] | None, work: Path, log=None) -> dict[str, dict]:
    """Run the named cases (all if None) and return ``{name: record}`` in the golden file format.

    One gloo group per world size (:func:`_run_group`); ``work`` holds the
    run folders and per-rank outputs; ``log`` (e.g. ``print``) receives one progress line per group.
    """
    cases = [CASES_BY_NAME[n] for n in names] if names else list(CASES)
    work = Path(work)
    env = environment()
    by_world: dict[int, list[Case]] = {}
    for c in cases:
        by_world.setdefault(c.world_size, []).append(c)
    results = {}
    for world_size, group in sorted(by_world.items()):
        t0 = time.perf_counter()
        jobs = [(c.name, compose(c)) for c in group]
        t1 = time.perf_counter()
        _run_group(world_size, jobs, work)
        if log is not None:
            log(f"world size {world_size}: {len(group)} case(s), composed in {t1 - t0:.1f} s, "
                f"ran in {time.perf_counter() - t1:.1f} s")
        for c in group:
            ranks = [json.loads((work / f"{c.name}.rank{r}.json").read_text()) for r in range(world_size)]
            for r, out in enumerate(ranks):
                if out["status"] != "completed" or out["steps"] != STEPS:
                    raise AssertionError(f"golden case {c.name!r} rank {r}: status {out['status']}, {out['steps']} steps")
            results[c.name] = {
                "format": FORMAT_VERSION,
                "case": c.name,
                "world_size": world_size,
                "overrides": c.all_overrides(),
                "note": c.note,
                "environment": env,
                "losses": read_losses(work / c.name),
                "ranks": [{"rank": r, "sha256": o["sha256"], "param_sum": o["param_sum"]} for r, o in enumerate(ranks)],
            }
    return results


# --------------------------------------------------------------------------------------------
# stored files and comparison
# --------------------------------------------------------------------------------------------
ENVS_DIR = GOLDEN_DIR / "envs"


def environment_key(env: dict) -> str:
    """Folder name of an environment's files: ``<torch>_<cpu capability>_<machine>``."""
    return "_".join(str(env.get(k)) for k in ("torch", "cpu_capability", "machine"))


def golden_path(name: str, env: dict | None = None) -> Path:
    """The primary file of ``name`` (``env`` None), or its file for environment ``env``."""
    if env is None:
        return GOLDEN_DIR / f"{name}.json"
    return ENVS_DIR / environment_key(env) / f"{name}.json"


def _read(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


def load_golden(name: str) -> dict | None:
    """The stored record of ``name`` for this environment: the primary file if it was recorded in
    an environment like this one, else this environment's file; if neither, the primary file
    (whose :func:`environment_mismatch` says why it cannot be compared), or None."""
    primary = _read(golden_path(name))
    if primary is not None and environment_mismatch(primary) is None:
        return primary
    return _read(golden_path(name, environment())) or primary


def save_golden(record: dict) -> list[Path]:
    """Write ``record`` where :func:`load_golden` finds it in this environment. A case whose numbers
    moved (or a new case) becomes the primary file, recorded here, and its files of other
    environments are deleted (they are stale); a case recorded elsewhere whose numbers are only
    new to this environment gets this environment's file. Returns the deleted files."""
    name = record["case"]
    primary, stored = _read(golden_path(name)), load_golden(name)
    comparable = stored is not None and environment_mismatch(stored) is None
    moved = comparable and bool(differences(stored, record))
    if primary is None or moved or environment_mismatch(primary) is None:
        path = golden_path(name)
        stale = [p for p in ENVS_DIR.glob(f"*/{name}.json")] if moved or primary is None else []
    else:
        path, stale = golden_path(name, record["environment"]), []
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    for p in stale:
        p.unlink()
    return stale


def stored_names() -> list[str]:
    """Cases with a primary file."""
    return sorted(p.stem for p in GOLDEN_DIR.glob("*.json"))


def stored_env_names() -> list[str]:
    """Cases with a file for some other environment."""
    return sorted({p.stem for p in ENVS_DIR.glob("*/*.json")})


def environment_mismatch(expected: dict) -> str | None:
    """Why ``expected`` cannot be compared bit for bit here (torch / CPU kernels differ), else None."""
    here, there = environment(), expected.get("environment", {})
    diffs = [f"{k}: stored {there.get(k)!r}, here {here[k]!r}" for k in ("torch", "cpu_capability", "machine")
             if there.get(k) != here[k]]
    return "; ".join(diffs) or None


def differences(expected: dict, actual: dict) -> list[str]:
    """Human-readable differences of two records of one case (empty: bit-for-bit identical)."""
    name = expected["case"]
    out = []
    for key in ("world_size", "overrides"):
        if expected[key] != actual[key]:
            out.append(f"{name}: {key} changed: stored {expected[key]!r}, now {actual[key]!r}")
    el, al = expected["losses"], actual["losses"]
    if len(el) != len(al):
        out.append(f"{name}: {len(al)} loss values, stored {len(el)}")
    bad = [i for i, (a, b) in enumerate(zip(el, al)) if a != b]  # exact float comparison
    if bad:
        i = bad[0]
        worst = max(abs(el[j] - al[j]) for j in bad)
        out.append(
            f"{name}: train_loss differs first at step {i + 1}: stored {el[i]!r}, now {al[i]!r} "
            f"({len(bad)} of {len(el)} steps differ, max |diff| {worst:.3g})"
        )
    for e, a in zip(expected["ranks"], actual["ranks"]):
        if e["sha256"] != a["sha256"] or e["param_sum"] != a["param_sum"]:
            out.append(
                f"{name}: rank {e['rank']} final state differs: sha256 stored {e['sha256'][:16]}..., "
                f"now {a['sha256'][:16]}...; param_sum stored {e['param_sum']!r}, now {a['param_sum']!r}"
            )
    return out
