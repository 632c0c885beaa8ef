"""Per-worker batches: :class:`ShardedLoader` for training, :func:`eval_batches` for evaluation."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from lsgd.data.catalog import resolve
from lsgd.data.partition import (
    derive_seed,
    dirichlet_partition,
    generator,
    iid_partition,
)
from lsgd.core.errors import ConfigError


class ShardedLoader:
    """Batches of one worker's shard of the training set.

    Map-style sets (everything but c4; wmt17's sentence pairs included): ``steps_per_epoch = floor(N / (world_size * batch_size))``
    on every rank.

    - ``dataset.partition=iid``: each epoch a permutation of all N samples seeded with
      ``(seed, epoch)``, the same on every rank (:func:`lsgd.data.partition.iid_partition`);
      rank r takes its disjoint slice and uses its first ``steps_per_epoch * batch_size`` samples.
    - ``dataset.partition=dirichlet``: a label-skewed split fixed at construction from ``seed``
      (:func:`lsgd.data.partition.dirichlet_partition`, same on every rank); each epoch the rank
      reshuffles its shard (seed, epoch, rank) and, when the shard is shorter than
      ``steps_per_epoch * batch_size``, appends further reshuffles of it (cycles), so all ranks run
      the same number of steps.

    Training augmentation (CIFAR crop/flip, ImageNet crops) is seeded per (seed, epoch, rank, step),
    so ``batches(epoch, start=k)`` yields exactly the tail of ``batches(epoch)``.

    Streaming sets (c4): ``steps_per_epoch = dataset.steps_per_epoch``; the rank's block stream
    continues across epochs (epoch e holds global batches ``e * steps_per_epoch ...``). Resuming in a
    new process re-reads and skips the earlier batches (tokenization cost, no training cost).

    Args:
        train: the training set from :func:`lsgd.data.build_datasets`.
        dataset_cfg: the ``dataset`` config dict.
        rank, world_size: this worker and the number of workers.
        batch_size: local batch size (samples per worker per step).
        seed: run seed; must be the same on every rank.
        pipeline: a :class:`lsgd.data.pipeline.BatchPipeline` of ``train`` building the batches
            (DataLoader processes, pinned memory); None: built here, as ``num_workers=0``. The
            batches are the same either way.
    Raises:
        ConfigError: the training set is smaller than one global batch, or dirichlet on unlabeled data.
        ValueError: ``rank`` not in ``[0, world_size)`` or ``batch_size < 1``.
    """

    def __init__(self, train, dataset_cfg: dict, rank: int, world_size: int, batch_size: int, seed: int,
                 pipeline=None):
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.cfg = resolve(dataset_cfg)
        self.train, self.rank, self.world_size = train, rank, world_size
        self.batch_size, self.seed = batch_size, int(seed)
        self.pipeline = pipeline
        self.streaming = not hasattr(train, "__len__")
        if self.streaming:
            self.steps_per_epoch = int(self.cfg["steps_per_epoch"])
            self._stream = None
            self._pos = 0
            return
        self.num_samples = len(train)
        self.steps_per_epoch = self.num_samples // (world_size * batch_size)
        if self.steps_per_epoch < 1:
            raise ConfigError(
                f"dataset {self.cfg['name']} has {self.num_samples} training samples, fewer than one global batch "
                f"(world_size {world_size} x batch_size {batch_size}); lower batch_size or the number of workers"
            )
        self.shard = None
        if self.cfg["partition"] == "dirichlet":
            if getattr(train, "labels", None) is None:
                raise ConfigError(f"dataset.partition=dirichlet needs class labels; {self.cfg['name']} has none")
            self.shard = dirichlet_partition(train.labels, world_size, self.cfg["alpha"], self.seed)[rank]

    def __len__(self) -> int:
        return self.steps_per_epoch

    def indices(self, epoch: int) -> Tensor:
        """Sample indices this rank trains on in ``epoch``, in order: int64 (steps_per_epoch * batch_size,).
        Map-style sets only."""
        if self.streaming:
            raise TypeError("a streaming dataset has no sample indices")
        need = self.steps_per_epoch * self.batch_size
        if self.shard is None:
            return iid_partition(self.num_samples, self.world_size, self.seed, epoch)[self.rank][:need]
        g = generator("dirichlet-epoch", self.seed, epoch, self.rank)
        parts, have = [], 0
        while have < need:
            parts.append(self.shard[torch.randperm(len(self.shard), generator=g)])
            have += len(self.shard)
        return torch.cat(parts)[:need]

    def batches(self, epoch: int, start: int = 0) -> Iterator[tuple[Tensor, Tensor]]:
        """Yield batches ``start .. steps_per_epoch - 1`` of ``epoch``: classification x float32
        (B, C, H, W), y int64 (B,); language modeling x int64 (B, T), y int64 (B, T) (x shifted by one);
        translation x int64 (B, src_len + tgt_len), y int64 (B, tgt_len) with -100 at padding
        (:mod:`lsgd.data.translation`).

        Raises:
            ValueError: ``start`` not in ``[0, steps_per_epoch]``.
        """
        if not 0 <= start <= self.steps_per_epoch:
            raise ValueError(f"start must be in [0, {self.steps_per_epoch}], got {start}")
        if self.streaming:
            yield from self._stream_batches(epoch, start)
            return
        idx = self.indices(epoch).view(self.steps_per_epoch, self.batch_size)[start:]
        seeds = [derive_seed("batch", self.seed, epoch, self.rank, s) for s in range(start, self.steps_per_epoch)]
        if self.pipeline is not None:
            yield from self.pipeline.batches(idx, seeds)
        else:
            yield from self.train.iter_batches(idx, seeds)

    def _next_block_batch(self) -> Tensor:
        b = torch.stack([next(self._stream) for _ in range(self.batch_size)])
        self._pos += 1
        return b

    def _stream_batches(self, epoch: int, start: int) -> Iterator[tuple[Tensor, Tensor]]:
        target = epoch * self.steps_per_epoch + start
        if self._stream is None or self._pos > target:
            self._stream = self.train.blocks(self.rank, self.world_size)
            self._pos = 0
        while self._pos < target:
            self._next_block_batch()
        for _ in range(start, self.steps_per_epoch):
            b = self._next_block_batch()
            if self.pipeline is not None:
                b = self.pipeline.pin(b)
            yield b[:, :-1], b[:, 1:]


def eval_batches(test, rank: int, world_size: int, batch_size: int, limit: int | None = None) -> Iterator[tuple[Tensor, Tensor]]:
    """This rank's contiguous slice ``[rank * N // world_size, (rank + 1) * N // world_size)`` of the
    test set (N samples; the first ``limit`` of them when given) in batches of at most
    ``batch_size``, without augmentation. The slices of all ranks are disjoint and cover the test
    set; sum loss / correct / count across ranks.

    Yields:
        (x, y) as in :meth:`ShardedLoader.batches`.
    Raises:
        ValueError: ``rank`` not in ``[0, world_size)`` or ``batch_size < 1``.
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    n = len(test) if limit is None else min(len(test), int(limit))
    idx = torch.arange(rank * n // world_size, (rank + 1) * n // world_size)
    yield from test.iter_batches(idx.split(batch_size))
