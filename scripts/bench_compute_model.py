"""Hold the ``cpu`` compute profile against measured time on this machine (issue 22).

For each model (the demo CNN and logistic regression on Fashion-MNIST shapes, GPT-tiny on the
byte-level text set, ResNet-20 on CIFAR-10 shapes; batch 32, the default, on random inputs of
the dataset's shapes) it prints, side by side from one run:

* ``profile``: the modeled compute of one step with ``cluster.device=cpu`` (this machine's
  calibration, :func:`lsgd.cluster.calibrate_cpu`, measured at the start of this run with the same
  thread count): forward + backward + optimizer step, each a roofline sum over the step's operators
  plus the per-op overhead;
* ``measured``: a real forward + backward + optimizer step (SGD with momentum 0.9 and weight decay
  5e-4, the default optimizer), the median of ``--repeats`` timed steps after ``--warmup`` ones;
* their ratio profile / measured (the goal: within 25%, i.e. 0.8 .. 1.25): the ratio of the
  medians, the median of the per-round ratios (calibration and measurement of one round run
  close together, so under a changing load this one is the steadier) and their range.

The calibration and the measurements interleave (``--rounds`` rounds, each recalibrating and
re-measuring every model); the table gives the median per model over the rounds and the spread
(min .. max ratio) says how noisy the machine was.

    python scripts/bench_compute_model.py --threads 1 --rounds 3
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import torch

from lsgd.cluster import Roofline, calibrate_cpu, count_step, cpu_spec_from_record
from lsgd.data.catalog import dataset_info
from lsgd.models import build_model
from lsgd.services import loss_fn

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


def measure(model, opt, x, y, warmup: int, repeats: int) -> float:
    def step():
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()

    for _ in range(warmup):
        step()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    built = {case: build(case, args.batch) for case in args.cases}
    counted = {case: count_step(m, x, y, loss_fn, opt, gpu=False) for case, (m, opt, x, y) in built.items()}
    rows: dict[str, list[tuple[float, float, dict]]] = {case: [] for case in args.cases}
    calibrations = []
    for _ in range(args.rounds):
        cal = calibrate_cpu()
        calibrations.append(cal)
        spec = cpu_spec_from_record(cal)
        roof = Roofline(spec, 1.0)
        # the same figures without the matmul curve and the first-touch term (the model before them)
        plain = Roofline(dataclasses.replace(spec, matmul_curve=None, first_touch_bandwidth=None), 1.0)
        for case, (m, opt, x, y) in built.items():
            phases = {p: roof.price(getattr(counted[case], p)) for p in ("forward", "backward", "optimizer")}
            modeled = sum(p.seconds for p in phases.values())
            flat = sum(plain.price(getattr(counted[case], p)).seconds for p in ("forward", "backward", "optimizer"))
            rows[case].append((modeled, measure(m, opt, x, y, args.warmup, args.repeats), phases, flat))

    print(f"# {calibrations[0]['cpu']}, torch {torch.__version__}, {args.threads} thread(s), batch {args.batch}, "
          f"{args.rounds} round(s)")
    for i, cal in enumerate(calibrations):
        curve = ", ".join(f"{int(k)}: {r / 1e9:.1f}" for k, r in cal.get("matmul_curve") or [])
        print(f"# calibration {i}: matmul {cal['peak_flops'] / 1e9:.1f} GFLOP/s (by smallest dim k: {curve}), copy "
              f"{cal['memory_bandwidth'] / 1e9:.1f} GB/s, first touch {cal.get('first_touch_bandwidth', 0) / 1e9:.2f} "
              f"GB/s, exp {cal['special_rate'] / 1e9:.2f} G/s, per-op {cal['launch_s'] * 1e6:.2f} us")
    print("| model | ops (fwd/bwd/opt) | profile ms (fwd/bwd/opt) | compute / memory / overhead / first touch ms | "
          "measured ms | ratio | median round ratio | ratio range | ratio w/o curve + first touch |")
    print("|---|---|---|---|---|---|---|---|---|")
    for case in args.cases:
        modeled = statistics.median(r[0] for r in rows[case])
        measured = statistics.median(r[1] for r in rows[case])
        ratios = [r[0] / r[1] for r in rows[case]]
        flat = statistics.median(r[3] / r[1] for r in rows[case])
        ph = rows[case][len(rows[case]) // 2][2]
        c = counted[case]
        comp = sum(p.compute_bound_s for p in ph.values())
        mem = sum(p.memory_bound_s for p in ph.values())
        lau = sum(p.launch_s for p in ph.values())
        touch = sum(p.first_touch_s for p in ph.values())
        print(f"| {case} | {len(c.forward)}/{len(c.backward)}/{len(c.optimizer)} | {modeled * 1e3:.2f} "
              f"({ph['forward'].seconds * 1e3:.2f}/{ph['backward'].seconds * 1e3:.2f}/{ph['optimizer'].seconds * 1e3:.2f}) "
              f"| {comp * 1e3:.2f} / {mem * 1e3:.2f} / {lau * 1e3:.2f} / {touch * 1e3:.2f} | {measured * 1e3:.2f} | "
              f"{modeled / measured:.2f} | {statistics.median(ratios):.2f} | {min(ratios):.2f} .. {max(ratios):.2f} | "
              f"{flat:.2f} |")


if __name__ == "__main__":
    main()
