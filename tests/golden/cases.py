"""Golden runs: tiny real training runs of every algorithm, in float64, recorded to a tolerance.

What the goldens guard
----------------------
Each case composes a config with Hydra (as ``lsgd train`` does), runs the real
:class:`lsgd.training.trainer.Trainer` ``.fit()`` on every rank of a real gloo process group, in float64
(``dtype=float64``: torch's default dtype in every rank, so the model, the data and every buffer an
algorithm allocates are float64), and records

* ``losses``: the per-step training loss averaged over workers, exactly the ``train_loss`` the
  trainer writes to ``metrics.jsonl`` (``log_every=1``, one value per step);
* ``final``: the last record's other numbers: the deterministic counters (bytes, rounds, modeled
  time: :data:`EXACT_KEYS`) and the test metrics;
* per rank, a fingerprint of the final model state: for every floating tensor of the state dict
  its float64 sum and L2 norm, for every integer tensor its sum.

Why float64 and a tolerance
---------------------------
The last bits of a float computation differ between CPUs (Intel / AMD), kernel families (AVX512 /
AVX2 / the scalar default; ``ATEN_CPU_CAPABILITY``) and torch versions: they sum in other orders.
In float32 those differences (~1e-7 relative) grow over 30 training steps to 1e-3 and more, so a
float32 golden can only be bit-exact, and bit-exact goldens failed on every machine but the one that
recorded them. In float64 the same reorderings perturb a step by ~1e-16 relative. Measured over all cases
between the AVX512, AVX2 and scalar (``default``) kernels of one machine (torch 2.14.1, AMD EPYC):
losses, final metrics and state sums / norms differ by at most 3e-14 relative, but for one small
difference of nearly equal numbers (osgp_w4's final ``consensus_distance``, 2e-12). A small real
change of the math moves them by far more: SlowMo's beta 0.6 -> 0.6000001 (1.7e-7 relative) moves
22 of 30 losses, by up to 3.5e-7 relative, and the final state by ~1e-7; skipping one averaging
round of local SGD moves the losses by up to 79% and the bytes. So every floating number is
compared with the relative tolerance :data:`RTOL` = 1e-9 (500x the worst spread measured, 350x
below the beta change's largest effect); counts of bytes, rounds and the modeled time are integers
or sums of deterministic terms and are compared exactly. Cases with random rounding or data-dependent
thresholds (QSGD, random-k, LEAD's and the lattice's random rounding, top-k / DGC / RedSync
thresholds) draw their random numbers from seeded generators (identical on every machine) and would
change only if a value fell within ~1e-12 of a rounding or selection boundary: they pass the same
tolerance on every machine measured, and their byte counts (DGC's vary with the threshold) match
exactly.

The stored files (``tests/golden/<case>.json``) were produced by the code at the time they were
written; ``tests/distributed/test_golden.py`` reruns every case and compares (:func:`differences`).
The stored ``environment`` says where a file was recorded; it is information, never a reason to
skip. A refactor of the communicator, the trainer or an algorithm that is meant to be numerically
neutral must leave the goldens passing; a change that moves them must say why in its commit
message and regenerate them:

    python scripts/make_golden.py                 # all cases; prints what changed
    python scripts/make_golden.py --only ddp slowmo
    python scripts/make_golden.py --check         # compare only, write nothing

Bit for bit, where it means something: two runs of one case on one machine give identical bits
(``test_golden.py`` runs every case a second time and compares the exact losses and counters and
each rank's sha256 of its final state; nothing is stored for that; ``run_cases(dtype="float32")``
does the same for the float32 runs users make). That needs one OpenMP
thread on every thread of a rank (:data:`THREAD_ENV`, as ``lsgd train`` runs two workers on two
cores).

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
FORMAT_VERSION = 2

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
    "dtype=float64",
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

    def all_overrides(self, dtype: str = "float64") -> list[str]:
        common = [o if not o.startswith("dtype=") else f"dtype={dtype}" for o in COMMON]
        return common + [f"launcher.nproc_per_node={self.world_size}", *self.model, *self.schedule, *self.overrides]


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
    _case("streaming_diloco", "algo=streaming_diloco", "algo.local_steps=6", "algo.fragments=3",
          "algo.fragment_sync_delay=1", "algo.fragment_update_alpha=0.5", "algo.quantization=fp4", "optim=adamw",
          note="3 strided fragments, one landing every 2 steps, each all-reduce overlapping 1 step, 4-bit outer "
               "gradients"),
    _case("streaming_diloco_eager", "algo=streaming_diloco", "algo.local_steps=6", "algo.fragments=2", "algo.eager=true",
          "algo.fragment_update_alpha=0.5", "algo.quantization=fp8", "optim=adamw",
          note="eager outer steps (Kale et al. 2025): 2 fragments, each all-reduce overlapping the next 6 steps, the "
               "own fresh outer gradient with the others' one-round-stale ones, fp8"),
    _case("sparseloco", "algo=sparseloco", "algo.local_steps=5", "optim=adamw",
          note="top-128 of each 64 x 64 tile (smaller tiles in proportion), 2-bit codes, error feedback 0.95"),
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
    _case("demo", "algo=demo", note="DeMo: 32 DCT coefficients per chunk all-gathered every step, sign steps at "
          "the authors' lr 4e-4; convolutions as matrix views, BatchNorm statistics broadcast"),
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
    # the lock-step variant, named since issue 41 made the asynchronous algorithm algo=ad_psgd's default
    # (the numbers recorded before it stand: only the overrides line of its JSON changed)
    _case("ad_psgd_w4", "algo=ad_psgd", "algo.pairing=lockstep", world_size=4,
          note="active/passive pairwise averaging on the ring (issue 12)"),
    _case("ad_psgd_async_w4", "algo=ad_psgd", "algo.pairing=virtual_time", "cluster.speeds=[1.0,1.0,1.0,0.25]",
          "cluster.step_time_s=0.01", world_size=4,
          note="asynchronous AD-PSGD in virtual time, one worker at speed 1/4 (issue 22)"),
    _case("lead_w4", "algo=lead", "optim.momentum=0", world_size=4, note="compressed primal-dual, 2-bit quantizer (issue 12)"),
    _case("overlap_local_sgd_w4", "algo=overlap_local_sgd", world_size=4,
          note="anchor pull every 2 steps, the anchor's all-reduce in flight meanwhile (issue 12)"),
]
CASES_BY_NAME = {c.name: c for c in CASES}


# --------------------------------------------------------------------------------------------
# composing and running
# --------------------------------------------------------------------------------------------
def compose(case: Case, dtype: str = "float64") -> dict:
    """The resolved, validated run config of ``case`` (as ``lsgd train`` builds it before workers
    start), in ``dtype``."""
    from lsgd.config.validation import compose_config

    cfg = compose_config(case.all_overrides(dtype), throw_on_missing=True)
    cfg["run_id"] = f"golden-{case.name}"  # lsgd.launch.launcher.run sets the run folder name here
    return cfg


def state_digest(model) -> str:
    """sha256 of every parameter and buffer (name, dtype, shape, raw bytes, in ``state_dict`` order)."""
    import torch

    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        t = t.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def state_fingerprint(model) -> dict[str, list]:
    """Per state-dict entry: ``[sum, L2 norm, numel]`` (float64) of a floating tensor, ``[sum]``
    (exact int) of an integer one (BatchNorm's ``num_batches_tracked``)."""
    import torch

    out = {}
    with torch.no_grad():
        for name, t in model.state_dict().items():
            t = t.detach().cpu()
            if t.is_floating_point():
                d = t.double()
                out[name] = [d.sum().item(), d.norm().item(), t.numel()]
            else:
                out[name] = [int(t.sum().item())]
    return out


def _worker(rank: int, world_size: int, jobs: list[tuple[str, dict]], work: str, inprocess: bool = False) -> None:
    """One rank: run every ``(name, cfg)`` of ``jobs`` in order with a fresh Trainer, write
    ``work/<name>.rank<r>.json`` (checksums); rank 0 writes the run folder ``work/<name>/``.
    ``inprocess``: a worker of an in-process cluster (a thread: the process's environment and
    stdout are its caller's, each case's config its own copy)."""
    import copy

    import torch
    import torch.distributed as dist

    from lsgd.training.trainer import Trainer

    if not inprocess:
        for key, value in THREAD_ENV.items():
            if os.environ.get(key) != value:  # a forkserver started earlier without it
                raise RuntimeError(f"golden ranks need {key}={value} from process start, got {os.environ.get(key)!r}")
    quiet = contextlib.nullcontext if inprocess else lambda: contextlib.redirect_stdout(io.StringIO())

    for name, cfg in jobs:
        run_dir = Path(work) / name
        if rank == 0:
            run_dir.mkdir(parents=True, exist_ok=True)
        dist.barrier()
        t0 = time.perf_counter()
        if inprocess:
            cfg = copy.deepcopy(cfg)
        try:
            with quiet():  # no progress bar when run from a terminal
                trainer = Trainer(cfg, run_dir, "cpu")
                summary = trainer.fit()
        except Exception as exc:
            raise RuntimeError(f"golden case {name!r} failed on rank {rank}: {exc!r}") from exc
        wrong = {n: p.dtype for n, p in trainer.model.state_dict().items()
                 if p.is_floating_point() and p.dtype != getattr(torch, cfg["dtype"])}
        if wrong:
            raise RuntimeError(f"golden case {name!r} ran in {cfg['dtype']} but its state holds {wrong}")
        out = {"sha256": state_digest(trainer.model), "state": state_fingerprint(trainer.model),
               "status": summary["status"], "steps": summary["steps"],
               "seconds": time.perf_counter() - t0}
        (Path(work) / f"{name}.rank{rank}.json").write_text(json.dumps(out))


#: keys of the last metrics record that are deterministic counts or sums of deterministic terms
#: (bytes, rounds, the modeled time: the profile's FLOP count and the alpha-beta costs of the
#: counted bytes): compared exactly
EXACT_KEYS = frozenset({"step", "samples", "comm_bytes", "comm_bytes_max", "wire_bytes", "wire_bytes_max",
                        "peak_step_bytes", "comm_rounds", "model_alpha_terms", "model_beta_bytes", "lattice_resent",
                        "cf", "server_updates", "dropped"})
EXACT_PREFIXES = ("modeled_", "updates_worker")
#: measured on this machine (wall clock): not recorded
MEASURED_KEYS = frozenset({"wall_time_s", "comm_time_s", "compute_time_s", "compute_time_s_max", "samples_per_s"})


def exact_key(key: str) -> bool:
    """A final-record key compared exactly (:data:`EXACT_KEYS`, :data:`EXACT_PREFIXES`)."""
    return key in EXACT_KEYS or key.startswith(EXACT_PREFIXES)


def read_records(run_dir: Path) -> tuple[list[float], dict]:
    """(per-step ``train_loss`` of rank 0's ``metrics.jsonl`` (records without a ``kind`` key), the
    last record's numbers but ``train_loss`` and the measured times)."""
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    recs = [r for r in recs if "kind" not in r]
    steps = [r["step"] for r in recs]
    if steps != list(range(1, len(steps) + 1)):
        raise AssertionError(f"{run_dir}: expected one record per step, got steps {steps}")
    final = {k: v for k, v in recs[-1].items()
             if k not in MEASURED_KEYS and k != "train_loss" and isinstance(v, (int, float)) and not isinstance(v, bool)}
    return [r.get("train_loss") for r in recs], dict(sorted(final.items()))


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
PRELOAD = ["torch", "torch._dynamo", "torch.distributed", "lsgd.training.trainer", "gloo", "cases"]

#: One OpenMP thread on *every* thread of a rank, as ``lsgd.launch.spawn.spawn_local`` arranges by
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


def _run_group_inprocess(world_size: int, jobs: list[tuple[str, dict]], work: Path) -> None:
    """The ranks as the workers of one in-process cluster (:mod:`lsgd.comm.inprocess`) in this
    process, one torch thread (as :data:`THREAD_ENV` gives each gloo rank)."""
    import torch

    from lsgd.comm.inprocess.cluster import run

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run(world_size, _worker, jobs, str(work), True)
    finally:
        torch.set_num_threads(threads)


def run_cases(names: list[str] | None, work: Path, log=None, dtype: str = "float64",
              inprocess: bool = False) -> dict[str, dict]:
    """Run the named cases (all if None) and return ``{name: record}`` in the golden file format.

    One gloo group per world size (:func:`_run_group`; ``inprocess``: one in-process cluster,
    :func:`_run_group_inprocess`); ``work`` holds the run folders and per-rank
    outputs; ``log`` (e.g. ``print``) receives one progress line per group. ``dtype``: the cases'
    ``dtype`` (``float32``: as users run them, for the bit-for-bit repeat; the stored goldens are
    float64). Every record also carries each rank's ``sha256`` of its final state.
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
        jobs = [(c.name, compose(c, dtype)) for c in group]
        t1 = time.perf_counter()
        (_run_group_inprocess if inprocess else _run_group)(world_size, jobs, work)
        if log is not None:
            log(f"world size {world_size}: {len(group)} case(s), composed in {t1 - t0:.1f} s, "
                f"ran in {time.perf_counter() - t1:.1f} s")
        for c in group:
            ranks = [json.loads((work / f"{c.name}.rank{r}.json").read_text()) for r in range(world_size)]
            for r, out in enumerate(ranks):
                if out["status"] != "completed" or out["steps"] != STEPS:
                    raise AssertionError(f"golden case {c.name!r} rank {r}: status {out['status']}, {out['steps']} steps")
            losses, final = read_records(work / c.name)
            results[c.name] = {
                "format": FORMAT_VERSION,
                "case": c.name,
                "world_size": world_size,
                "overrides": c.all_overrides(dtype),
                "note": c.note,
                "environment": env,
                "losses": losses,
                "final": final,
                "ranks": [{"rank": r, "sha256": o["sha256"], "state": o["state"]} for r, o in enumerate(ranks)],
            }
    return results


# --------------------------------------------------------------------------------------------
# stored files and comparison
# --------------------------------------------------------------------------------------------
#: Relative tolerance of every floating number of a golden case (losses, test metrics, state sums
#: and norms). Measured spread across kernel families and CPUs, and the size of the smallest change
#: it must catch: see the module docstring.
RTOL = 1e-9


def golden_path(name: str) -> Path:
    """The stored file of case ``name``."""
    return GOLDEN_DIR / f"{name}.json"


def load_golden(name: str) -> dict | None:
    """The stored record of ``name``, or None."""
    path = golden_path(name)
    return json.loads(path.read_text()) if path.exists() else None


def save_golden(record: dict) -> Path:
    """Write ``record`` as its case's stored file; returns the path."""
    path = golden_path(record["case"])
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path


def stored_names() -> list[str]:
    """Cases with a stored file."""
    return sorted(p.stem for p in GOLDEN_DIR.glob("*.json"))


def _close(a: float | None, b: float | None, scale: float, rtol: float) -> bool:
    """``|a - b| <= rtol * scale`` (exact equality when ``rtol`` is 0); None (a record with no
    train_loss: no worker finished a step in its window) equals None only; NaN equals NaN."""
    if a is None or b is None:
        return a is b
    if a != a and b != b:
        return True
    if rtol == 0:
        return a == b
    return abs(a - b) <= rtol * scale


def differences(expected: dict, actual: dict, rtol: float = RTOL) -> list[str]:
    """Human-readable differences of two records of one case (empty: equal).

    ``rtol`` > 0 (the stored goldens, :data:`RTOL`): losses and final metrics within ``rtol`` of
    the stored value's magnitude; a tensor's sum within ``rtol * sqrt(numel) * norm`` (the bound
    of ``|sum|`` by Cauchy-Schwarz, so a sum that cancels to ~0 is not held to a relative
    tolerance of itself) and its norm within ``rtol * norm``; integer sums, byte and round counts
    and the modeled time (:func:`exact_key`) exactly. ``rtol`` = 0: every number exactly and each
    rank's sha256 of its final state (two runs on one machine).
    """
    name = expected["case"]
    out = []
    for key in ("world_size", "overrides"):
        if expected[key] != actual[key]:
            out.append(f"{name}: {key} changed: stored {expected[key]!r}, now {actual[key]!r}")
    el, al = expected["losses"], actual["losses"]
    if len(el) != len(al):
        out.append(f"{name}: {len(al)} loss values, stored {len(el)}")
    bad = [i for i, (a, b) in enumerate(zip(el, al)) if not _close(a, b, abs(a or 0.0), rtol)]
    if bad:
        i = bad[0]
        worst = max((abs(el[j] - al[j]) / max(abs(el[j]), 1e-300) if None not in (el[j], al[j]) else float("inf"))
                    for j in bad)
        out.append(f"{name}: train_loss differs first at step {i + 1}: stored {el[i]!r}, now {al[i]!r} "
                   f"({len(bad)} of {len(el)} steps differ, max relative diff {worst:.3g}, tolerance {rtol:g})")
    ef, af = expected["final"], actual["final"]
    for key in sorted(set(ef) | set(af)):
        if key not in ef or key not in af:
            out.append(f"{name}: final record key {key!r} {'added' if key in af else 'missing'}")
            continue
        exact = exact_key(key)
        if not _close(ef[key], af[key], abs(ef[key]), 0 if exact else rtol):
            out.append(f"{name}: final {key}: stored {ef[key]!r}, now {af[key]!r}"
                       + (" (compared exactly)" if exact else f" (tolerance {rtol:g} relative)"))
    for e, a in zip(expected["ranks"], actual["ranks"]):
        r = e["rank"]
        if rtol == 0 and e.get("sha256") != a.get("sha256"):
            out.append(f"{name}: rank {r} final state sha256 differs: {e.get('sha256', '')[:16]}... vs "
                       f"{a.get('sha256', '')[:16]}...")
        es, as_ = e["state"], a["state"]
        if list(es) != list(as_):
            out.append(f"{name}: rank {r} state entries differ: stored {list(es)}, now {list(as_)}")
            continue
        for key, ev in es.items():
            av = as_[key]
            if len(ev) == 1:  # integer tensor: exact
                ok = ev == av
            else:
                ok = (ev[2] == av[2] and _close(ev[0], av[0], (ev[2] ** 0.5) * ev[1], rtol)
                      and _close(ev[1], av[1], ev[1], rtol))
            if not ok:
                out.append(f"{name}: rank {r} final {key} [sum, norm, numel]: stored {ev}, now {av}")
    return out
