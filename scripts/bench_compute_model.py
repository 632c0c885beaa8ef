"""Hold the ``cpu`` compute profile against measured time on this machine (issue 22).

For each model (the demo CNN and logistic regression on Fashion-MNIST shapes, GPT-tiny on the
byte-level text set, ResNet-20 on CIFAR-10 shapes; batch 32, the default, on random inputs of
the dataset's shapes) it prints, side by side from one run:

* ``profile``: the modeled compute of one step with ``cluster.device=cpu`` (this machine's
  calibration, :func:`lsgd.compute.calibration.calibrate_cpu`, measured at the start of this run with the same
  thread count): forward + backward + optimizer step, each a roofline sum over the step's operators
  plus the per-op overhead;
* ``measured``: a real forward + backward + optimizer step (SGD with momentum 0.9 and weight decay
  5e-4, the default optimizer), the median of ``--repeats`` timed steps after ``--warmup`` ones,
  each timed as the CPU time of this thread (``time.thread_time``, as the calibration times its
  kernels: with one torch thread the whole step runs on it, backward included, and another
  process's time slices on a shared machine are not counted); the wall-clock median beside it;
* their ratio profile / measured (the goal: within 25%, i.e. 0.75 .. 1.25): the least profile
  over the rounds / the least of the rounds' median steps (min-of-rounds: noise only adds
  time, to either), the median of the per-round ratios and their range, the ratio to the least
  single step of all rounds (timed as the calibration times its kernels), and the ratio without
  the convolution curve and the element rates (convolutions at the square matmul rate,
  batch-norm and max-pool on the plain roofline: the model before them), same rounds.

With ``--threads`` above 1 the other threads' work is not the calling thread's CPU time: the
steps (as the calibration) are then timed on the wall clock.

The calibration and the measurements interleave (``--rounds`` rounds, each recalibrating and
re-measuring every model); the spread of the per-round ratios says how noisy the machine was.

``--by-op`` adds, per model (one thread), where the error is: every op of a live step timed alone (the least
CPU time of each op over ``--repeats`` steps, under a ``TorchDispatchMode``), grouped by aten op,
beside its modeled price without the per-op overhead (the roofline term, the element rate, the
first touch); the step's remainder (measured step - the ops' sum: Python, autograd, the per-op
dispatch) beside the modeled per-op overhead.

    python scripts/bench_compute_model.py --threads 1 --rounds 3
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time

import torch

from lsgd.compute.calibration import calibrate_cpu, cpu_spec_from_record
from lsgd.compute.opcount import OpCounter, _launches_nothing, count_step
from lsgd.compute.roofline import Roofline
from lsgd.data.catalog import dataset_info
from lsgd.models import build_model
from lsgd.training.evaluator import loss_fn

CASES = {
    "cnn": ({"name": "cnn", "channels": [16, 32], "hidden": 128}, {"name": "fashion_mnist"}),
    "logreg": ({"name": "logreg"}, {"name": "fashion_mnist"}),
    "gpt-tiny": ({"name": "gpt", "size": "tiny", "dropout": 0.0, "bias": True, "n_layer": None, "n_head": None,
                  "n_embd": None}, {"name": "text", "seq_len": 256}),
    "resnet20": ({"name": "resnet20", "shortcut": "A"}, {"name": "cifar10"}),
}


def _dataset_cfg(name: str, extra: dict) -> dict:
    """The dataset group's config (conf/dataset/<name>.yaml) with ``extra`` on top."""
    import importlib.resources

    import yaml

    text = (importlib.resources.files("lsgd.conf") / "dataset" / f"{name}.yaml").read_text()
    cfg = yaml.safe_load(text)
    cfg.update(extra)
    return cfg


def build(case: str, batch: int, seed: int = 0):
    model_cfg, data_extra = CASES[case]
    info = dataset_info(_dataset_cfg(data_extra["name"], data_extra))
    torch.manual_seed(seed)
    model = build_model(model_cfg, info).train()
    if info.task == "classification":
        x = torch.randn(batch, *info.input_shape)
        y = torch.randint(0, info.num_classes, (batch,))
    else:
        x = torch.randint(0, info.num_classes, (batch, *info.input_shape))
        y = torch.randint(0, info.num_classes, (batch, *info.input_shape))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    return model, opt, x, y


def measure(model, opt, x, y, warmup: int, repeats: int) -> tuple[float, float, float]:
    """(median thread CPU seconds, median wall seconds, least thread CPU seconds) of ``repeats``
    training steps."""
    def step():
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()

    for _ in range(warmup):
        step()
    cpu, wall = [], []
    clock = time.thread_time if torch.get_num_threads() == 1 else time.perf_counter
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), clock()
        step()
        cpu.append(clock() - c0)
        wall.append(time.perf_counter() - w0)
    return statistics.median(cpu), statistics.median(wall), min(cpu)


class TimedOps(OpCounter):
    """:class:`OpCounter` that also times each recorded op (thread CPU seconds, its kernel and its
    aten dispatch; the counting itself outside the timed region)."""

    def __init__(self):
        super().__init__(decompose=False, gpu=False)
        self.times: list[float] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _launches_nothing(func):
            return func(*args, **kwargs)
        t0 = time.thread_time()
        out = func(*args, **kwargs)
        self.times.append(time.thread_time() - t0)
        self.ops.append(self._record(func, args, kwargs, out))
        return out


def by_op(case: str, model, opt, x, y, roof: Roofline, repeats: int, step_s: float) -> None:
    """Print the per-op table of ``--by-op`` (see the module docstring)."""
    runs = []
    for _ in range(repeats + 1):
        opt.zero_grad(set_to_none=True)
        with TimedOps() as timed:
            loss_fn(model(x), y).backward()
            opt.step()
        runs.append(timed)
    runs = runs[1:]  # the first: warm-up
    n = min(len(r.ops) for r in runs)
    least = [min(r.times[i] for r in runs) for i in range(n)]
    groups: dict[str, list[float]] = {}
    for op, t in zip(runs[0].ops[:n], least):
        g = groups.setdefault(op.name, [0, 0.0, 0.0])
        g[0] += 1
        g[1] += t
        g[2] += roof.price_op(op) - op.launches * roof.spec.launch_s
    ops_s = sum(least)
    launch_s = sum(op.launches for op in runs[0].ops[:n]) * roof.spec.launch_s
    print(f"\n## {case}: {n} ops; measured step {step_s * 1e3:.2f} ms = ops {ops_s * 1e3:.2f} ms (each op timed in "
          f"a live step) + rest {(step_s - ops_s) * 1e3:.2f} ms; modeled: ops {sum(g[2] for g in groups.values()) * 1e3:.2f} "
          f"ms + per-op overhead {launch_s * 1e3:.2f} ms")
    print("| op | calls | measured ms | modeled ms (w/o overhead) | modeled / measured |")
    print("|---|---|---|---|---|")
    for name, (calls, t, m) in sorted(groups.items(), key=lambda kv: -kv[1][1]):
        if t < 0.01 * ops_s and m < 0.01 * ops_s:
            continue
        ratio = m / t if t else float("inf")
        print(f"| {name.replace('aten.', '')} | {calls} | {t * 1e3:.3f} | {m * 1e3:.3f} | {ratio:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--by-op", action="store_true", help="per-op measured vs modeled, after the table")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    built = {case: build(case, args.batch) for case in args.cases}
    counted = {case: count_step(m, x, y, loss_fn, opt, gpu=False) for case, (m, opt, x, y) in built.items()}
    rows: dict[str, list[tuple]] = {case: [] for case in args.cases}
    calibrations = []
    for _ in range(args.rounds):
        cal = calibrate_cpu()
        calibrations.append(cal)
        spec = cpu_spec_from_record(cal)
        roof = Roofline(spec, 1.0)
        # the same figures without the convolution curve and the element rates (the model before them)
        plain = Roofline(dataclasses.replace(spec, conv_curve=None, element_rates=None), 1.0)
        for case, (m, opt, x, y) in built.items():
            phases = {p: roof.price(getattr(counted[case], p)) for p in ("forward", "backward", "optimizer")}
            modeled = sum(p.seconds for p in phases.values())
            flat = sum(plain.price(getattr(counted[case], p)).seconds for p in ("forward", "backward", "optimizer"))
            cpu_s, wall_s, least_s = measure(m, opt, x, y, args.warmup, args.repeats)
            rows[case].append((modeled, cpu_s, phases, flat, wall_s, least_s))

    load = os.getloadavg()
    print(f"# {calibrations[0]['cpu']}, torch {torch.__version__}, {args.threads} thread(s), batch {args.batch}, "
          f"{args.rounds} round(s), load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the end")
    for i, cal in enumerate(calibrations):
        curve = ", ".join(f"{int(k)}: {r / 1e9:.1f}" for k, r in cal.get("matmul_curve") or [])
        conv = ", ".join(f"{int(k)}: {r / 1e9:.1f}" for k, r in cal.get("conv_curve") or [])
        rates = ", ".join(f"{k} {r / 1e9:.2f}" for k, r in (cal.get("element_rates") or {}).items())
        print(f"# calibration {i}: matmul {cal['peak_flops'] / 1e9:.1f} GFLOP/s (by smallest dim k: {curve}), conv "
              f"GFLOP/s by c: {conv}, copy {cal['memory_bandwidth'] / 1e9:.1f} GB/s, first touch "
              f"{cal.get('first_touch_bandwidth', 0) / 1e9:.2f} GB/s, exp {cal['special_rate'] / 1e9:.2f} G/s, "
              f"G elements/s: {rates}, per-op {cal['launch_s'] * 1e6:.2f} us")
    print("| model | ops (fwd/bwd/opt) | profile ms (fwd/bwd/opt) | compute / memory / overhead / first touch ms | "
          "measured ms (cpu; wall) | ratio | median round ratio | ratio range | ratio to the least step | "
          "ratio w/o conv curve + element rates |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for case in args.cases:
        modeled = min(r[0] for r in rows[case])
        measured = min(r[1] for r in rows[case])
        wall = min(r[4] for r in rows[case])
        least = min(r[5] for r in rows[case])
        ratios = [r[0] / r[1] for r in rows[case]]
        flat = min(r[3] for r in rows[case]) / measured
        ph = min(rows[case], key=lambda r: r[0])[2]
        c = counted[case]
        comp = sum(p.compute_bound_s for p in ph.values())
        mem = sum(p.memory_bound_s for p in ph.values())
        lau = sum(p.launch_s for p in ph.values())
        touch = sum(p.first_touch_s for p in ph.values())
        print(f"| {case} | {len(c.forward)}/{len(c.backward)}/{len(c.optimizer)} | {modeled * 1e3:.2f} "
              f"({ph['forward'].seconds * 1e3:.2f}/{ph['backward'].seconds * 1e3:.2f}/{ph['optimizer'].seconds * 1e3:.2f}) "
              f"| {comp * 1e3:.2f} / {mem * 1e3:.2f} / {lau * 1e3:.2f} / {touch * 1e3:.2f} | {measured * 1e3:.2f}; "
              f"{wall * 1e3:.2f} | {modeled / measured:.2f} | {statistics.median(ratios):.2f} | "
              f"{min(ratios):.2f} .. {max(ratios):.2f} | {modeled / least:.2f} | {flat:.2f} |")
    if args.by_op:
        roof = Roofline(cpu_spec_from_record(calibrations[-1]), 1.0)
        for case, (m, opt, x, y) in built.items():
            by_op(case, m, opt, x, y, roof, args.repeats, min(r[1] for r in rows[case]))


if __name__ == "__main__":
    main()
