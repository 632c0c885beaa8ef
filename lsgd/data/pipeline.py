"""A worker's input pipeline: training batches built in DataLoader processes, pinned, prefetched.

Keys (``dataset.*``, every dataset):

* ``num_workers`` (int >= 0): DataLoader processes building this worker's training batches
  (0: built in the training process, as before).
* ``pin_memory`` (``auto`` | true | false): batches in page-locked host memory, so the trainer's
  ``x.to(device, non_blocking=True)`` is an asynchronous DMA copy that overlaps the previous step's
  kernels (NVIDIA, "How to Optimize Data Transfers in CUDA C/C++"; torch's DataLoader
  ``pin_memory``). ``auto``: on when the run's device is cuda. ``true`` needs device=cuda.
* ``persistent_workers`` (bool): keep the DataLoader processes across epochs and shard switches
  (torch's ``persistent_workers``; without it every epoch forks ``num_workers`` fresh processes).
* ``prefetch_factor`` (int >= 1): batches each DataLoader process builds ahead (torch's
  ``prefetch_factor``: ``num_workers x prefetch_factor`` batches in flight).

The three last keys act only when ``num_workers`` > 0 (``pin_memory`` acts with 0 too). Streaming
sets (c4) read their stream in the training process (an iterable stream cannot be split across
DataLoader processes without changing which documents a worker sees); their batches are pinned.

**Why batches, not samples.** Every map-style training set of lsgd builds a whole batch from
``(sample indices, augmentation seed)``: :meth:`lsgd.data.memory.TensorDataset.batch` (one
indexing operation and a batched crop/flip), :meth:`lsgd.data.vision.ImageFolderSet.batch` (JPEG
decode and torchvision transforms per sample), :meth:`lsgd.data.translation.TranslationPairs.batch`.
The DataLoader here has ``batch_size=None`` and a sampler that yields those ``(indices, seed)``
pairs, so one DataLoader process builds one whole batch, as torch's own ``batch_sampler`` does for
a per-sample set (each worker process collates a whole batch). torch's DataLoader returns the
batches in the sampler's order whatever process finished first, and a batch depends on its
``(indices, seed)`` alone (augmentation draws from generators seeded by the seed, never from a
process's global RNG), so the batches are bit-identical to ``num_workers=0``: a resumed run that
starts at batch k of an epoch reads exactly the tail of the batches (``ShardedLoader`` contract).
The DataLoader draws its base seed from a generator of its own, not from the training process's
torch RNG, which therefore advances exactly as without workers.

One pipeline serves every shard a worker reads (an algorithm that moves a worker across shards,
:meth:`lsgd.algorithms.base.Algorithm.data_position`): only the items of the pass change, so
``num_workers`` processes exist per training process, not per shard.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence

import numpy as np
import torch
from torch import Tensor

from lsgd.core.errors import ConfigError

#: allowed values of ``dataset.pin_memory``
PIN_MEMORY = ("auto", True, False)


def check_pipeline_keys(cfg: dict) -> None:
    """Check ``dataset.pin_memory``, ``dataset.persistent_workers``, ``dataset.prefetch_factor``
    of a resolved dataset config (``num_workers`` is checked by :func:`lsgd.data.catalog.resolve`).

    Raises:
        ConfigError: a value out of its allowed set, naming the key.
    """
    if not _pin_value_ok(cfg["pin_memory"]):
        raise ConfigError(f"dataset.pin_memory must be one of auto, true, false; got {cfg['pin_memory']!r}")
    if not isinstance(cfg["persistent_workers"], bool):
        raise ConfigError(f"dataset.persistent_workers must be true or false; got {cfg['persistent_workers']!r}")
    pf = cfg["prefetch_factor"]
    if not isinstance(pf, int) or isinstance(pf, bool) or pf < 1:
        raise ConfigError(f"dataset.prefetch_factor must be an integer >= 1 (batches each DataLoader process "
                          f"builds ahead); got {pf!r}")


def _pin_value_ok(v) -> bool:
    return v is True or v is False or (isinstance(v, str) and v == "auto")  # not 1 / 0 (== True / False)


def resolve_pin_memory(value, device: str) -> bool:
    """Whether batches are pinned: ``dataset.pin_memory`` ``value`` for a run on ``device``
    (``cpu`` / ``cuda``): ``auto`` -> device is cuda.

    Raises:
        ConfigError: ``true`` on a cpu run (page-locked memory speeds host-to-GPU copies only, and
            pinning needs a CUDA driver), or a value not in auto, true, false.
    """
    if not _pin_value_ok(value):
        raise ConfigError(f"dataset.pin_memory must be one of auto, true, false; got {value!r}")
    if isinstance(value, str):  # auto
        return device == "cuda"
    if value is True:
        if device != "cuda":
            raise ConfigError("dataset.pin_memory=true needs device=cuda (pinned host memory speeds host-to-GPU "
                              "copies only); allowed on cpu: auto, false")
        return True
    return False


def _init_process(dtype: torch.dtype, _worker_id: int) -> None:
    # the run's default dtype (lsgd.core.devices.default_dtype): a set's batch() builds inputs in it; a
    # forked process inherits it, a spawned one would not
    torch.set_default_dtype(dtype)


class _Pass:
    """The sampler: the ``(indices, seed)`` items of the current pass, set before each ``iter()``
    (a persistent DataLoader keeps its sampler object and re-iterates it at every ``iter()``)."""

    def __init__(self):
        self.items: list = []

    def __iter__(self):
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)


class _Batches(torch.utils.data.Dataset):
    """Item ``(indices as numpy int64, seed)`` -> ``train.batch(indices, seed)``."""

    def __init__(self, train):
        self.train = train

    def __len__(self) -> int:  # not used by the sampler; a Dataset's contract
        return len(self.train)

    def __getitem__(self, item):
        idx, seed = item
        return self.train.batch(torch.from_numpy(idx), seed)


class BatchPipeline:
    """Builds a training set's batches, in DataLoader processes when ``num_workers`` > 0, pinned
    when ``pin_memory`` (module docstring).

    Args:
        train: a map-style training set with ``batch(indices, seed) -> (x, y)`` and
            ``iter_batches(index_batches, seeds)``.
        num_workers, pin_memory, persistent_workers, prefetch_factor: as the ``dataset.*`` keys
            (``pin_memory`` resolved to a bool: :func:`resolve_pin_memory`).
    Raises:
        ValueError: ``num_workers`` < 0 or ``prefetch_factor`` < 1.
    """

    def __init__(self, train, num_workers: int = 0, pin_memory: bool = False, persistent_workers: bool = True,
                 prefetch_factor: int = 2):
        if num_workers < 0 or prefetch_factor < 1:
            raise ValueError(f"need num_workers >= 0 and prefetch_factor >= 1, got {num_workers}, {prefetch_factor}")
        self.train = train
        self.num_workers = int(num_workers)
        self.pin_memory = bool(pin_memory)
        self.persistent_workers = bool(persistent_workers)
        self.prefetch_factor = int(prefetch_factor)
        self._pass = _Pass()
        self._loader = None

    @classmethod
    def from_config(cls, train, dataset_cfg: dict, device: str) -> BatchPipeline:
        """The pipeline of the resolved ``dataset`` config for a run on ``device`` (cpu / cuda)."""
        return cls(train, int(dataset_cfg["num_workers"]), resolve_pin_memory(dataset_cfg["pin_memory"], device),
                   bool(dataset_cfg["persistent_workers"]), int(dataset_cfg["prefetch_factor"]))

    @property
    def passthrough(self) -> bool:
        """True when batches are built in this process, unpinned: exactly ``train.iter_batches``."""
        return self.num_workers == 0 and not self.pin_memory

    def _dataloader(self) -> torch.utils.data.DataLoader:
        if self._loader is None:
            self._loader = torch.utils.data.DataLoader(
                _Batches(self.train), batch_size=None, sampler=self._pass, num_workers=self.num_workers,
                pin_memory=self.pin_memory, persistent_workers=self.persistent_workers,
                prefetch_factor=self.prefetch_factor,
                worker_init_fn=functools.partial(_init_process, torch.get_default_dtype()),
                generator=torch.Generator().manual_seed(0),  # not the training process's RNG
            )
        return self._loader

    def batches(self, index_batches: Tensor | Sequence[Tensor], seeds: Sequence[int] | None) -> Iterator[tuple[Tensor, Tensor]]:
        """Yield ``train``'s batch of each index tensor (with its augmentation seed), in order;
        the same tensors as ``train.iter_batches(index_batches, seeds)``, pinned when
        ``pin_memory``."""
        if self.passthrough:
            yield from self.train.iter_batches(index_batches, seeds)
            return
        if self.num_workers == 0:
            for x, y in self.train.iter_batches(index_batches, seeds):
                yield self.pin(x), self.pin(y)
            return
        seeds = list(seeds) if seeds is not None else [None] * len(index_batches)
        self._pass.items = [(np.asarray(idx, dtype=np.int64), s) for idx, s in zip(index_batches, seeds)]
        yield from self._dataloader()

    def pin(self, t: Tensor) -> Tensor:
        """``t`` in page-locked memory when ``pin_memory`` (a copy), else ``t``."""
        return t.pin_memory() if self.pin_memory else t

    def close(self) -> None:
        """Stop the DataLoader processes (persistent ones live until then or until exit)."""
        loader, self._loader = self._loader, None
        it = getattr(loader, "_iterator", None) if loader is not None else None
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()
