"""The shared-memory board (lsgd.comm.shared_memory.Board) on real gloo ranks: what it gathers is what gloo's
all-gather delivers, bit for bit (edge values included, across the slots' wrap-around); a reader
that lagged too far or a rank that never posts raises instead of returning a wrong value; a failing
rank reads its own values without waiting; nothing is left in /dev/shm; ``LSGD_BOARD=0`` turns it
off on every rank."""

from __future__ import annotations

import glob
import json
import os

import numpy as np
import torch
import torch.distributed as dist
from gloo import run_gloo

from lsgd.comm.shared_memory import AGREE, CHANNELS, SETTLE, Board

EDGES = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 5e-324, -2.2250738585072014e-308, 2.0**53, 1e308, -1.5])


def _payload(rank: int, n: int, m: int) -> np.ndarray:
    """Rank ``rank``'s ``m`` values of exchange ``n``: random bit patterns of finite doubles, the
    edge values rotated by rank and exchange."""
    rng = np.random.default_rng(1000 * n + rank)
    values = rng.standard_normal(m) * 10.0 ** rng.integers(-300, 300, m)
    k = min(m, EDGES.size)
    values[:k] = np.roll(EDGES, rank + n)[:k]
    return values


def _same_as_gloo(rank, world_size, out):
    board = Board.create(slots=4, width=16)
    assert board is not None  # the ranks share this host's /dev/shm
    mismatches = 0
    for n in range(11):  # wraps around the 4 slots twice, on every channel
        for channel in range(CHANNELS):  # the settlements, the stop agreement, the records' figures
            m = 1 + (3 * n + channel) % 16  # the same size on every rank, different per exchange
            mine = _payload(rank, n, m)
            assert board.post(channel, mine) == n
            got = board.gather(channel, n, m)
            ref = torch.empty(world_size * m, dtype=torch.float64)
            dist.all_gather_into_tensor(ref, torch.from_numpy(mine))
            mismatches += int((got.view(np.int64) != ref.numpy().reshape(world_size, m).view(np.int64)).sum())
        dist.barrier()  # lockstep, as the clock's settlements: no row is overwritten before it is read
    (out / f"r{rank}.json").write_text(json.dumps({"mismatches": mismatches, "fits": [board.fits(16), board.fits(17)]}))


def test_the_board_gathers_what_gloos_all_gather_delivers_bit_for_bit(tmp_path):
    before = set(glob.glob("/dev/shm/lsgd-board-*"))
    run_gloo(_same_as_gloo, 3, tmp_path)
    for rank in range(3):
        got = json.loads((tmp_path / f"r{rank}.json").read_text())
        assert got == {"mismatches": 0, "fits": [True, False]}
    assert set(glob.glob("/dev/shm/lsgd-board-*")) == before  # unlinked once every rank mapped it


def _misuse(rank, world_size, out):
    board = Board.create(slots=2, width=4, timeout_s=0.3)
    errors = {}
    # rank 1 posts three exchanges of channel 0 while rank 0 has read none: exchange 2 overwrote
    # exchange 0's row (2 slots)
    if rank == 1:
        for n in range(3):
            board.post(SETTLE, np.full(2, float(n)))
    dist.barrier()
    if rank == 0:
        board.post(SETTLE, np.zeros(2))
        try:
            board.gather(SETTLE, 0, 2)
        except RuntimeError as e:
            errors["lagged"] = str(e)
        # channel 1: rank 1 never posts exchange 0
        board.post(AGREE, np.array([7.0]))
        try:
            board.gather(AGREE, 0, 1)
        except RuntimeError as e:
            errors["timeout"] = str(e)
        # a failing rank (an exception being handled) reads its own values, without waiting
        try:
            raise ValueError("a worker failing")
        except ValueError:
            errors["failing"] = board.gather(AGREE, 0, 1, own=np.array([7.0])).tolist()
    dist.barrier()
    (out / f"r{rank}.json").write_text(json.dumps(errors))


def test_a_lagging_reader_and_a_silent_rank_raise_a_failing_rank_reads_its_own(tmp_path):
    run_gloo(_misuse, 2, tmp_path)
    errors = json.loads((tmp_path / "r0.json").read_text())
    assert "rank 1's row of channel 0 holds exchange 2, read for exchange 0" in errors["lagged"]
    assert "rank(s) [1] did not post exchange 0 of channel 1 within 0.3 s" in errors["timeout"]
    assert errors["failing"] == [[7.0]]


def _switched_off(rank, world_size, out):
    os.environ["LSGD_BOARD"] = "0"
    try:
        board = Board.create()
    finally:
        del os.environ["LSGD_BOARD"]
    (out / f"r{rank}.json").write_text(json.dumps(board is None))


def test_lsgd_board_0_turns_it_off_on_every_rank(tmp_path):
    run_gloo(_switched_off, 2, tmp_path)
    assert [json.loads((tmp_path / f"r{r}.json").read_text()) for r in range(2)] == [True, True]


def test_without_torch_distributed_there_is_no_board():
    assert not dist.is_initialized()
    assert Board.create() is None
