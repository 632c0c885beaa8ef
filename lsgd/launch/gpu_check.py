"""The GPU check: lsgd on the GPUs of this machine, checked and measured, as one table
(:func:`run_checks`, :func:`table`). ``scripts/gpu_check.py`` runs it.

Steps (each one row or more of the table):

1. **CUDA tests**: the suite's tests marked ``cuda`` (``pytest -m cuda tests``), in a subprocess.
2. **Training on one GPU**: a world of one (NCCL) runs ``ddp`` (bf16), ``local_sgd`` (fp16: the
   GradScaler and its agreed skips), ``diloco`` (bf16) and ``algo=compressed`` top-k (bf16) through
   lsgd's Trainer on the synthetic set; a run passes when its training loss goes down (the mean
   of its last two records below the mean of its first two).
3. **Step overhead**: lsgd's ``ddp`` (``Trainer.train_step`` + bookkeeping, records every 50 steps)
   against a plain torch loop of the same model (DistributedDataParallel, the same optimizer
   kernels, autocast and memory format), in alternating blocks of steps over the same batches:
   the median over rounds of the per-round ratio of mean step times. Goal: <= 1.05.
4. **Model speed**: GPT-20m (lsgd.models.gpt, 6 layers, 512 wide, byte vocabulary, sequence 1024)
   at bf16, eager and ``torch.compile``; ResNet-50 at bf16 + channels_last, 224 x 224: tokens/s or
   images/s and MFU = model FLOPs per step (``torch.utils.flop_counter``: 2 per multiply-add,
   forward + backward, matmuls / convolutions / attention) / step time / the device's dense
   bf16 peak (:data:`PEAKS`). Step times: CUDA events around blocks of steps, median of 5 blocks.

A dry run (``dry_run``, ``--dry-run``) runs every step on CPU at toy size (gloo for NCCL; GPT
``tiny`` at sequence 64, ResNet-18 in fp32 at 32 x 32 for ResNet-50, batch 2; ``torch.compile``
with the ``eager`` backend, which traces with Dynamo but generates no code): the suite checks with
it that every step runs end to end (tests/unit/test_gpu_check.py). Its figures say nothing about a
GPU.

A check that fails is a ``FAIL`` row (:attr:`Row.failed`); a speed goal not met is reported in the
table, as in scripts/bench_all.py, and is no failure (``Row.goal_only``).

It lives with the launch layer because it builds configs (:mod:`lsgd.config.validation`) and runs
lsgd's Trainer, models and data on a world of one.
"""

from __future__ import annotations

import contextlib
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

#: the checkout the suite's tests run from (step 1)
REPO = Path(__file__).resolve().parents[2]

#: dense BF16 tensor-core peaks (FLOP/s, no sparsity) by words in ``torch.cuda.get_device_name()``
#: (whole words, case-insensitive; the first match wins, so "H100 PCIe" before "H100"; an A10G,
#: AWS's variant, is not an A10 and has no entry). Sources: NVIDIA datasheets / whitepapers, the dense figure being half
#: the "with sparsity" one: H200 SXM "BF16 Tensor Core 1,979 TFLOPS*"; H100 SXM5 "989.4 / 1978.9"
#: (Hopper whitepaper); H100 PCIe "1,513 TFLOPS*"; H100 NVL "1,671 TFLOPS*"; A100 (SXM and PCIe)
#: "BF16 Tensor Core 312 TFLOPS | 624 TFLOPS*"; L40S "BF16 733 TFLOPS*" (362.05 dense); L4 "BF16
#: 242 TFLOPS*"; A10 "BF16 250 TFLOPS*"; V100 has no bf16: its FP16 tensor peak, 125 TFLOPS (SXM2).
PEAKS: list[tuple[str, float]] = [
    ("H200", 989.4e12),
    ("H100 PCIe", 756.5e12),
    ("H100 NVL", 835.5e12),
    ("H100", 989.4e12),
    ("A100", 312e12),
    ("L40S", 362.05e12),
    ("L4", 121e12),
    ("A10", 125e12),
    ("V100", 125e12),
]

#: step 2's runs: (row name, overrides)
TRAIN_RUNS = [
    ("ddp bf16", ["algo=ddp", "precision=bf16"]),
    ("local_sgd fp16", ["algo=local_sgd", "algo.local_steps=4", "precision=fp16"]),
    ("diloco bf16", ["algo=diloco", "algo.local_steps=4", "precision=bf16"]),
    ("compressed top-k bf16", ["algo=compressed", "algo.compressor=topk", "algo.cf=10", "precision=bf16"]),
]

GOAL_OVERHEAD = 1.05


def peak_flops(name: str) -> float | None:
    """The dense bf16 peak of the GPU called ``name`` (:data:`PEAKS`), or None when unknown."""
    for key, peak in PEAKS:
        if re.search(rf"\b{re.escape(key)}\b", name, re.IGNORECASE):  # whole words: A10 is not A10G
            return peak
    return None


@dataclass
class Row:
    """One line of the table. ``ok``: the check passed (None: a figure with no pass / fail);
    ``goal_only``: ``ok`` says whether a speed goal was met, which does not fail the run."""

    check: str
    value: str
    goal: str = ""
    ok: bool | None = True
    goal_only: bool = False

    @property
    def status(self) -> str:
        if self.ok is None:
            return "-"
        if self.goal_only:
            return "met" if self.ok else "NOT met"
        return "ok" if self.ok else "FAIL"

    @property
    def failed(self) -> bool:
        return self.ok is False and not self.goal_only


@dataclass
class Setup:
    dry_run: bool
    device: torch.device
    backend: str
    name: str
    peak: float | None
    tmp: Path


# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------
def compose(overrides: list[str]) -> dict:
    """The validated lsgd config of ``overrides`` (Hydra compose, as ``lsgd train`` would)."""
    from lsgd.config.validation import compose_config

    return compose_config(overrides)


@contextlib.contextmanager
def world_of_one(backend: str, device: torch.device):
    """A default process group of one rank (``backend``), destroyed on exit."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1,
                            device_id=device if device.type == "cuda" else None)
    try:
        yield
    finally:
        dist.destroy_process_group()


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, steps: int, device: torch.device) -> float:
    """Seconds per step of ``steps`` calls of ``fn`` (CUDA events on a GPU, perf_counter on CPU)."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(steps):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / steps
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    return (time.perf_counter() - t0) / steps


def base_overrides(s: Setup) -> list[str]:
    return ["debug=default", f"device={s.device.type}", "launcher.nproc_per_node=1", f"results_dir={s.tmp}",
            "eval_unit=step", "eval_every=1000000", "checkpoint_every=0", "dataset.num_test=64"]


# ----------------------------------------------------------------------------------------------
# 1. the suite's CUDA tests
# ----------------------------------------------------------------------------------------------
def cuda_tests(s: Setup, cmd: list[str] | None = None) -> list[Row]:
    """``pytest -m cuda`` (dry run: only collects them from one file, they skip on CPU)."""
    if cmd is None:
        where = ["tests/unit/test_cluster.py"] if s.dry_run else ["tests"]
        cmd = [sys.executable, "-m", "pytest", "-m", "cuda", "-q", "-p", "no:cacheprovider", *where]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    tail = (proc.stdout + proc.stderr).strip().splitlines()
    summary = next((line for line in reversed(tail) if re.search(r"\b(passed|failed|skipped|error|deselected)\b", line)), "")
    ok = proc.returncode in (0, 5) and "failed" not in summary and "error" not in summary
    if not ok:
        print("\n".join(tail[-40:]), file=sys.stderr)
    return [Row("1. CUDA tests (pytest -m cuda)", summary.strip("= ") or f"exit status {proc.returncode}", "all pass", ok)]


# ----------------------------------------------------------------------------------------------
# 2. training runs on a world of one
# ----------------------------------------------------------------------------------------------
def train_runs(s: Setup) -> list[Row]:
    from lsgd.core.devices import resolve_backend
    from lsgd.training.trainer import Trainer

    steps, every = (12, 3) if s.dry_run else (80, 10)
    rows = []
    for name, overrides in TRAIN_RUNS:
        try:
            cfg = compose([*base_overrides(s), f"max_steps={steps}", f"log_every={every}", "dataset.num_train=2048",
                           "batch_size=32", *overrides])
            run_id = re.sub(r"\W+", "_", name)
            cfg["run_id"] = run_id
            run_dir = s.tmp / run_id
            run_dir.mkdir()
            with world_of_one(resolve_backend(cfg), s.device):
                Trainer(cfg, run_dir, s.device.type).fit()
            losses = [r["train_loss"] for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
                      if "train_loss" in r and "kind" not in r]
            first, last = statistics.mean(losses[:2]), statistics.mean(losses[-2:])
            rows.append(Row(f"2. trains: {name} ({resolve_backend(cfg)})", f"loss {first:.3f} -> {last:.3f}",
                            "goes down", last < first))
        except Exception as exc:
            traceback.print_exc()
            rows.append(Row(f"2. trains: {name}", f"raised {type(exc).__name__}: {exc}"[:80], "goes down", False))
    return rows


# ----------------------------------------------------------------------------------------------
# 3. lsgd ddp vs a plain torch loop
# ----------------------------------------------------------------------------------------------
def overhead(s: Setup, rounds: int = 7) -> list[Row]:
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    from lsgd.training.accel import batch_to_channels_last, to_channels_last
    from lsgd.core.devices import resolve_backend
    from lsgd.models import build_model
    from lsgd.training.optim import build_optimizer
    from lsgd.training.trainer import Trainer

    if s.dry_run:
        model_over, block, rounds = ["model=cnn", "batch_size=16"], 2, 5
    else:
        model_over = ["model=resnet18", "model.channels_last=true", "precision=bf16", "batch_size=128",
                      "dataset.input_shape=[3,64,64]"]
        block = 20
    cfg = compose([*base_overrides(s), "algo=ddp", "log_every=50", "max_steps=100000", "epochs=1000",
                   "dataset.num_train=4096", *model_over])
    cfg["run_id"] = "overhead"
    run_dir = s.tmp / "overhead"
    run_dir.mkdir()
    with world_of_one(resolve_backend(cfg), s.device):
        trainer = Trainer(cfg, run_dir, s.device.type)
        trainer.start_time = time.perf_counter()
        trainer.recorder.start(trainer.samples)
        trainer.net.train()
        it = trainer.loader.batches(0)
        batches = [next(it) for _ in range(block)]
        torch.manual_seed(int(cfg["seed"]))
        model = build_model(cfg["model"], trainer.info).to(s.device)
        channels_last = bool(cfg["model"].get("channels_last"))
        if channels_last:
            to_channels_last(model)
        opt = build_optimizer(model.parameters(), cfg["optim"], s.device)
        ddp = DistributedDataParallel(model, device_ids=[s.device.index] if s.device.type == "cuda" else None)
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg["precision"])

        def plain_block():
            for x, y in batches:
                x, y = x.to(s.device, non_blocking=True), y.to(s.device, non_blocking=True)
                if channels_last:
                    x = batch_to_channels_last(x)
                with torch.autocast(s.device.type, dtype=dtype, enabled=dtype is not None):
                    loss = F.cross_entropy(ddp(x), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()

        def lsgd_block():
            for x, y in batches:
                trainer.train_step(x, y)
                trainer.bookkeeping()

        for fn in (lsgd_block, plain_block):  # warm-up (cuDNN autotuning, allocator)
            fn()
        synchronize(s.device)
        ratios, times = [], {"lsgd": [], "plain": []}
        for r in range(rounds):
            got = {}
            for name in (("lsgd", "plain") if r % 2 == 0 else ("plain", "lsgd")):
                got[name] = timed(lsgd_block if name == "lsgd" else plain_block, 1, s.device) / block
                times[name].append(got[name])
            ratios.append(got["lsgd"] / got["plain"])
        trainer.recorder.close()
        trainer.pipeline.close()
    ratio = statistics.median(ratios)
    what = f"{cfg['model']['name']}, batch {cfg['batch_size']}, {cfg['precision']}"
    return [Row(f"3. lsgd ddp / plain torch loop ({what})",
                f"{ratio:.3f} ({statistics.median(times['lsgd']) * 1e3:.2f} vs "
                f"{statistics.median(times['plain']) * 1e3:.2f} ms/step)", f"<= {GOAL_OVERHEAD}", ratio <= GOAL_OVERHEAD,
                goal_only=True)]


# ----------------------------------------------------------------------------------------------
# 4. MFU and images/s
# ----------------------------------------------------------------------------------------------
def model_speed(s: Setup, compile_backend: str) -> list[Row]:
    from torch.utils.flop_counter import FlopCounterMode

    from lsgd.training.accel import optimizer_kernels, to_channels_last
    from lsgd.data import DatasetInfo
    from lsgd.models import build_model
    from lsgd.training.evaluator import loss_fn

    dev = s.device
    if s.dry_run:  # CPU: ResNet-18 for ResNet-50 and fp32 (bf16 convolutions crawl on a CPU without AMX)
        gpt_size, seq, gpt_batch, img, img_batch, warm, block, blocks = "tiny", 32, 2, 32, 2, 1, 1, 3
        resnet, img_dtype = "resnet18", torch.float32
    else:
        gpt_size, seq, gpt_batch, img, img_batch, warm, block, blocks = "20m", 1024, 16, 224, 128, 3, 10, 5
        resnet, img_dtype = "resnet50", torch.bfloat16
    img_prec = "bf16" if img_dtype == torch.bfloat16 else "fp32"
    cases = [
        (f"GPT-{gpt_size} bf16 eager", "gpt", False, torch.bfloat16),
        (f"GPT-{gpt_size} bf16 compile ({compile_backend})", "gpt", True, torch.bfloat16),
        (f"ResNet-{resnet[6:]} {img_prec} channels_last {img}x{img}, batch {img_batch}", resnet, False, img_dtype),
    ]
    rows = []
    for label, kind, compiled, dtype in cases:
        try:
            torch.manual_seed(0)
            if kind == "gpt":
                info = DatasetInfo("c4", "lm", (seq,), 257, None)
                model = build_model({"name": "gpt", "size": gpt_size}, info).to(dev)
                x = torch.randint(0, 257, (gpt_batch, seq), device=dev)
                y = torch.randint(0, 257, (gpt_batch, seq), device=dev)
                per_step, unit = gpt_batch * seq, "tokens/s"
            else:
                info = DatasetInfo("imagenet", "classification", (3, img, img), 1000, None)
                model = to_channels_last(build_model({"name": kind}, info).to(dev))
                x = torch.randn(img_batch, 3, img, img, device=dev).contiguous(memory_format=torch.channels_last)
                y = torch.randint(0, 1000, (img_batch,), device=dev)
                per_step, unit = img_batch, "images/s"
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, **optimizer_kernels("adamw", dev))
            net = torch.compile(model, backend=compile_backend) if compiled else model

            def step():
                with torch.autocast(dev.type, dtype=dtype, enabled=dtype != torch.float32):
                    loss = loss_fn(net(x), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()

            with FlopCounterMode(display=False) as counter:  # the eager model's FLOPs (the same graph)
                with torch.autocast(dev.type, dtype=dtype, enabled=dtype != torch.float32):
                    loss = loss_fn(model(x), y)
                loss.backward()
            flops = counter.get_total_flops()
            opt.zero_grad(set_to_none=True)
            for _ in range(warm):  # compilation, autotuning
                step()
            synchronize(dev)
            per = statistics.median(timed(step, block, dev) for _ in range(blocks))
            rate = per_step / per
            mfu = flops / per / s.peak if s.peak else None
            value = f"{rate:,.1f} {unit}, {flops / per / 1e12:.3g} TFLOP/s"
            rows.append(Row(f"4. {label}", value + (f", MFU {mfu:.1%}" if mfu is not None else ", MFU n/a (no peak)"),
                            "", None))
        except Exception as exc:
            traceback.print_exc()
            rows.append(Row(f"4. {label}", f"raised {type(exc).__name__}: {exc}"[:80], "", False))
    return rows


# ----------------------------------------------------------------------------------------------
def run_checks(dry_run: bool, compile_backend: str | None = None, tests_cmd: list[str] | None = None,
               only: tuple[str, ...] = ("tests", "train", "overhead", "speed")) -> tuple[Setup, list[Row]]:
    """Run the checks (``only``: a subset of tests, train, overhead, speed); returns the setup and
    the table's rows.

    Raises:
        RuntimeError: no CUDA device without ``dry_run``.
    """
    if not dry_run and not torch.cuda.is_available():
        raise RuntimeError("no CUDA device is visible: run with --dry-run to check the script on CPU")
    device = torch.device("cpu") if dry_run else torch.device("cuda", 0)
    name = "cpu (dry run)" if dry_run else torch.cuda.get_device_name(device)
    threads = torch.get_num_threads()
    if dry_run:
        torch.set_num_threads(1)  # toy sizes: one thread is fastest (and cheapest on a shared machine)
    with contextlib.ExitStack() as stack:
        stack.callback(torch.set_num_threads, threads)
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="lsgd-gpu-check-"))
        s = Setup(dry_run, device, "gloo" if dry_run else "nccl", name, None if dry_run else peak_flops(name), Path(tmp))
        rows: list[Row] = []
        t0, c0 = time.perf_counter(), time.process_time()

        def took(what: str) -> None:
            nonlocal t0, c0
            print(f"[gpu_check] {what}: {time.perf_counter() - t0:.1f} s ({time.process_time() - c0:.1f} s CPU)",
                  file=sys.stderr, flush=True)
            t0, c0 = time.perf_counter(), time.process_time()

        if "tests" in only:
            rows += cuda_tests(s, tests_cmd)
            took("CUDA tests")
        if "train" in only:
            rows += train_runs(s)
            took("training runs")
        if "overhead" in only:
            try:
                rows += overhead(s)
            except Exception as exc:
                traceback.print_exc()
                rows.append(Row("3. lsgd ddp / plain torch loop", f"raised {type(exc).__name__}: {exc}"[:80],
                                f"<= {GOAL_OVERHEAD}", False))
            took("overhead")
        if "speed" in only:
            rows += model_speed(s, compile_backend or ("eager" if dry_run else "inductor"))
            took("model speed")
    return s, rows


def table(s: Setup, rows: list[Row]) -> str:
    head = (f"lsgd gpu_check on {s.name}: torch {torch.__version__}, CUDA {torch.version.cuda}, "
            f"bf16 dense peak {s.peak / 1e12:.1f} TFLOP/s" if s.peak else
            f"lsgd gpu_check on {s.name}: torch {torch.__version__} (no published peak: MFU n/a)")
    cells = [["check", "result", "goal", "status"]] + [[r.check, r.value, r.goal, r.status] for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(4)]
    lines = [" | ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "-|-".join("-" * w for w in widths))
    return head + "\n" + "\n".join(lines)
