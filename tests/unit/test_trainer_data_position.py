"""The worker loop's data path (``Trainer.work`` with :meth:`Algorithm.data_position`): a worker
reads the batches an algorithm names, one stream per shard, across epochs and shard switches; with
no answer it reads its own shard at its step count, as before."""

from __future__ import annotations

import types

from lsgd.training.trainer import Trainer


class _Loader:
    """Shard ``shard``'s batches as labels ``(shard, batch)``; counts the streams opened."""

    def __init__(self, shard, steps_per_epoch, opened):
        self.shard, self.spe, self.opened = shard, steps_per_epoch, opened

    def batches(self, epoch, start=0):
        self.opened.append((self.shard, epoch, start))
        for s in range(start, self.spe):
            yield (self.shard, epoch * self.spe + s), None


class _Algorithm:
    def __init__(self, script, total):
        self.script, self.total = script, total

    def progress(self, step):
        return min(step, self.total)

    def data_position(self, step):
        return None if self.script is None else self.script[step]


def _loop(script, total, worker=1, spe=3):
    """Run Trainer.work on fakes: returns the batches read, in order, and the streams opened."""
    t = Trainer.__new__(Trainer)
    read, opened = [], []
    t.algorithm = _Algorithm(script, total)
    t.step, t.total_steps, t.steps_per_epoch, t.worker_index, t.diverged = 0, total, spe, worker, False
    t.cfg = {}
    t.loaders = {s: _Loader(s, spe, opened) for s in range(3)}
    t.bookkeeping = lambda: False

    def train_step(x, y):
        read.append(x)
        t.step += 1

    t.train_step = train_step
    t._check_injected_failure = lambda: None
    # measured mode's compute marks (lsgd.training.timekeeping): not what this test is about
    t.timer = types.SimpleNamespace(mark_gap=lambda: None)
    t.work()
    return read, opened


def test_without_an_answer_a_worker_reads_its_own_shard_at_its_step_count():
    read, opened = _loop(None, 7)
    assert read == [(1, k) for k in range(7)]
    assert opened == [(1, 0, 0), (1, 1, 0), (1, 2, 0)]  # one stream per epoch, as before


def test_a_worker_follows_the_named_shards_and_positions_across_epochs():
    script = [(0, 0), (0, 1), (2, 2), (2, 3), (2, 4), (0, 2), (0, 3), (1, 7), (1, 8)]
    read, opened = _loop(script, len(script))
    assert read == script
    # a new stream at each shard switch and each epoch end; position 3 of shard 2 is epoch 1, batch 0
    assert opened == [(0, 0, 0), (2, 0, 2), (2, 1, 0), (0, 0, 2), (0, 1, 0), (1, 2, 1)]
