"""Throughput of the training input pipeline alone (no model): samples/s of one worker's batches.

    python scripts/bench_data.py [--workers 2] [--repeats 7] [--images 384] [--batch 32]

Two training sets, each read through lsgd's own path (:class:`lsgd.data.ShardedLoader` with a
:class:`lsgd.data.pipeline.BatchPipeline`), with ``dataset.num_workers=0`` (batches built in this
process) and ``dataset.num_workers=--workers`` (DataLoader processes, persistent), one pass each
in alternating order (0, N, N, 0, ...) so each measurement has its comparator next to it in time:

(a) **imagenet**: an ImageFolder tree of ``--images`` generated JPEGs (256 x 256, smooth colour
    fields plus noise: baseline JPEG at quality 90, decoded by Pillow) under a temporary folder,
    read with lsgd's ImageNet training transforms (RandomResizedCrop(128) + flip + normalize):
    what a ResNet-50 worker's input costs per sample, at a smaller crop. Goal: ratio of samples/s
    (``--workers`` processes / in-process) >= 1.5 with 2 processes: decoding parallelizes across
    processes, less the transfer of each batch through shared memory. Needs the cores: on a loaded
    2-core machine the processes wait for a core and the ratio drops.
(b) **cifar-shaped**: an in-memory uint8 set (N, 3, 32, 32) with lsgd's batched crop + flip: the
    in-memory sets need no DataLoader processes (a batch is one indexing operation); the ratio is
    printed for information (no goal).

Each figure is the median over ``--repeats`` (>= 5) passes, after a warm-up pass that starts the
persistent processes. The batches of both settings are compared for equality (the pipeline's
contract: the same batches, so resume stays exact). The last line follows the bench convention
(scripts/bench_all.py): ``BENCH data_workers_ratio_imagenet <ratio> >= 1.5``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

GOAL = 1.5


def make_image_tree(root: Path, images: int, classes: int = 8, size: int = 256, seed: int = 0) -> None:
    """``root/train/c<k>/<i>.JPEG``: ``images`` JPEGs spread over ``classes`` folders (and a
    one-image ``val`` tree, which ImageFolderSet's callers expect beside it)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    for split, n in (("train", images), ("val", classes)):
        for i in range(n):
            folder = root / split / f"c{i % classes}"
            folder.mkdir(parents=True, exist_ok=True)
            a, b, c = rng.uniform(0, 255, 3)
            img = np.stack([a * xx + (255 - a) * yy, b * yy, c * xx], axis=-1)
            img = np.clip(img + rng.normal(0, 12, img.shape), 0, 255).astype(np.uint8)
            Image.fromarray(img).save(folder / f"{i}.JPEG", quality=90)


def pass_rate(loader, epoch: int) -> tuple[float, list]:
    """(samples/s of one pass over ``epoch``, the batches)."""
    t0 = time.perf_counter()
    out = [(x, y) for x, y in loader.batches(epoch)]
    seconds = time.perf_counter() - t0
    return sum(len(y) for _, y in out) / seconds, out


def compare(train, cfg: dict, workers: int, batch: int, repeats: int) -> tuple[float, float, float, bool]:
    """(median samples/s in-process, median with ``workers`` processes, median of the per-pair
    ratios, the batches equal)."""
    from lsgd.data import ShardedLoader
    from lsgd.data.pipeline import BatchPipeline

    pipes = {0: BatchPipeline(train, 0), workers: BatchPipeline(train, workers, persistent_workers=True)}
    loaders = {n: ShardedLoader(train, cfg, 0, 1, batch, seed=0, pipeline=p) for n, p in pipes.items()}
    same = True
    _, ref = pass_rate(loaders[0], 0)  # warm-up (page cache, first-touch) and the reference batches
    _, got = pass_rate(loaders[workers], 0)  # starts the persistent processes
    same &= all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(ref, got)) and len(ref) == len(got)
    rates: dict[int, list[float]] = {0: [], workers: []}
    ratios = []
    for r in range(repeats):
        order = (0, workers) if r % 2 == 0 else (workers, 0)
        got = {}
        for n in order:
            got[n], _ = pass_rate(loaders[n], 1 + r)
            rates[n].append(got[n])
        ratios.append(got[workers] / got[0])
    for p in pipes.values():
        p.close()
    return statistics.median(rates[0]), statistics.median(rates[workers]), statistics.median(ratios), same


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=2, help="DataLoader processes of the compared setting")
    ap.add_argument("--repeats", type=int, default=7, help="timed passes per setting (>= 5)")
    ap.add_argument("--images", type=int, default=384, help="JPEGs in the generated ImageFolder tree")
    ap.add_argument("--batch", type=int, default=32, help="local batch size")
    args = ap.parse_args(argv)
    if args.repeats < 5 or args.workers < 1:
        ap.error("--repeats must be >= 5 and --workers >= 1")
    torch.set_num_threads(1)  # one core per decoding process, and this one
    from lsgd.data.memory import TensorDataset
    from lsgd.data.vision import ImageFolderSet

    load0 = os.getloadavg()[0]
    print(f"data-path throughput: num_workers 0 vs {args.workers}, batch {args.batch}, {args.repeats} passes each, "
          f"{os.cpu_count()} cores, load average {load0:.2f}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="lsgd-bench-data-") as tmp:
        make_image_tree(Path(tmp), args.images)
        train = ImageFolderSet(Path(tmp) / "train", 128, True)
        cfg = {"name": "imagenet", "root": tmp, "num_train": len(train), "num_classes": 8, "image_size": 128}
        rows.append(("imagenet (JPEG decode + crop)", *compare(train, cfg, args.workers, args.batch, args.repeats)))
    g = torch.Generator().manual_seed(0)
    n = 8192
    cifar = TensorDataset(torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8, generator=g),
                          torch.randint(0, 10, (n,), generator=g), (0.5,) * 3, (0.25,) * 3, augment_padding=4)
    cfg = {"name": "synthetic", "num_train": n, "input_shape": [3, 32, 32]}
    rows.append(("cifar-shaped in memory (crop + flip)", *compare(cifar, cfg, args.workers, 128, args.repeats)))
    print(f"{'set':38s} {'samples/s, 0':>14s} {f'samples/s, {args.workers}':>14s} {'ratio':>7s} same batches")
    for name, r0, rn, ratio, same in rows:
        print(f"{name:38s} {r0:14.0f} {rn:14.0f} {ratio:7.2f} {'yes' if same else 'NO'}")
    print(f"load average after {os.getloadavg()[0]:.2f}")
    if not all(r[-1] for r in rows):
        print("the batches differ between the settings", file=sys.stderr)
        return 1
    print(f"BENCH data_workers_ratio_imagenet {rows[0][3]:.3f} >= {GOAL}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
