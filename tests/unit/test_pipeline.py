"""lsgd.data.pipeline: DataLoader processes build the same batches as the training process (so
resume stays exact), leave the training process's RNG alone, and the keys are validated."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from lsgd.data import ShardedLoader, resolve
from lsgd.data.memory import TensorDataset
from lsgd.data.pipeline import BatchPipeline, resolve_pin_memory
from lsgd.core.errors import ConfigError

CFG = {"name": "synthetic", "num_train": 96, "input_shape": [3, 8, 8]}


def _augmented_set(n: int = 96) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randint(0, 256, (n, 3, 8, 8), dtype=torch.uint8, generator=g),
                         torch.randint(0, 10, (n,), generator=g), (0.5,) * 3, (0.25,) * 3, augment_padding=2)


def _same(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(x, u) and torch.equal(y, v) and x.dtype == u.dtype
                                    for (x, y), (u, v) in zip(a, b))


def test_worker_processes_build_the_same_batches_across_epochs_breaks_and_shards():
    """Two persistent DataLoader processes against the in-process reference (independent: the
    set's own iter_batches): whole epochs, a resumed tail (start=k), a pass abandoned half way and
    the next one, and a second shard through the same pipeline; in float64 (the run's default
    dtype reaches the processes); the training process's torch RNG does not move."""
    train = _augmented_set()
    pipe = BatchPipeline(train, num_workers=2, persistent_workers=True, prefetch_factor=2)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        ref = {r: ShardedLoader(train, CFG, r, 2, 8, seed=4) for r in range(2)}
        got = {r: ShardedLoader(train, CFG, r, 2, 8, seed=4, pipeline=pipe) for r in range(2)}
        rng = torch.get_rng_state()
        half = iter(got[0].batches(0))
        next(half), next(half)  # abandoned: the next pass must not see its prefetched batches
        assert _same(list(got[0].batches(1)), list(ref[0].batches(1)))
        assert _same(list(got[0].batches(2, start=4)), list(ref[0].batches(2, start=4)))
        assert _same(list(got[1].batches(0)), list(ref[1].batches(0)))  # another shard, same processes
        assert torch.equal(torch.get_rng_state(), rng)
        assert next(iter(got[1].batches(0)))[0].dtype == torch.float64
    finally:
        torch.set_default_dtype(previous)
        pipe.close()


def test_in_process_pipeline_is_the_sets_own_path():
    train = _augmented_set()
    pipe = BatchPipeline(train, num_workers=0)
    assert pipe.passthrough
    a = list(ShardedLoader(train, CFG, 0, 1, 16, seed=1, pipeline=pipe).batches(3))
    assert _same(a, list(ShardedLoader(train, CFG, 0, 1, 16, seed=1).batches(3)))


def test_image_folder_batch_matches_its_dataloader_path(tmp_path: Path):
    """ImageFolderSet.batch (what a DataLoader process runs: decode + seeded transforms) against
    its own DataLoader path, per-sample seeds derived as before."""
    from PIL import Image

    from lsgd.data.vision import ImageFolderSet

    rng = np.random.default_rng(0)
    for c in range(2):
        (tmp_path / f"c{c}").mkdir()
        for i in range(3):
            Image.fromarray(rng.integers(0, 256, (20 + i, 24, 3), dtype=np.uint8)).save(tmp_path / f"c{c}" / f"{i}.png")
    train = ImageFolderSet(tmp_path, 16, True)
    idx = [torch.tensor([0, 4, 2]), torch.tensor([5, 1, 3])]
    x0, y0 = train.batch(idx[0], 11)
    assert x0.shape == (3, 3, 16, 16) and y0.dtype == torch.int64
    assert _same([train.batch(i, s) for i, s in zip(idx, (11, 12))], list(train.iter_batches(idx, [11, 12])))
    assert not torch.equal(x0, train.batch(idx[0], 13)[0])  # the seed decides the crops


@pytest.mark.parametrize("key, value, message", [
    ("pin_memory", "yes", "dataset.pin_memory must be one of auto, true, false"),
    ("pin_memory", 1, "dataset.pin_memory must be one of auto, true, false"),
    ("persistent_workers", "no", "dataset.persistent_workers must be true or false"),
    ("prefetch_factor", 0, "dataset.prefetch_factor must be an integer >= 1"),
    ("num_workers", -1, "dataset.num_workers must be an integer >= 0"),
])
def test_bad_pipeline_keys_are_refused_naming_the_key(key, value, message):
    with pytest.raises(ConfigError, match=message):
        resolve({**CFG, key: value})


def test_pin_memory_follows_the_device():
    assert resolve_pin_memory("auto", "cuda") is True
    assert resolve_pin_memory("auto", "cpu") is False
    assert resolve_pin_memory(False, "cuda") is False
    assert resolve_pin_memory(True, "cuda") is True
    with pytest.raises(ConfigError, match="dataset.pin_memory=true needs device=cuda"):
        resolve_pin_memory(True, "cpu")


@pytest.mark.cuda
def test_pinned_batches_on_cuda():
    train = _augmented_set()
    for workers in (0, 2):
        pipe = BatchPipeline(train, num_workers=workers, pin_memory=True)
        got = list(ShardedLoader(train, CFG, 0, 1, 16, seed=1, pipeline=pipe).batches(0))
        pipe.close()
        assert all(x.is_pinned() and y.is_pinned() for x, y in got)
        assert _same(got, list(ShardedLoader(train, CFG, 0, 1, 16, seed=1).batches(0)))
