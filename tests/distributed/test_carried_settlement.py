"""DDP's clock settlement carried in the next step's gradient bucket (``algo.carry_settlement``,
lsgd.comm.settlement.CarriedSettlement) against the independent paths: its own exchange after backward
(``algo.carry_settlement=false``), through the shared-memory board (lsgd.comm.shared_memory, the default where
the ranks share a host) and through gloo's all-gather (``LSGD_BOARD=0``). On real gloo ranks running the real trainer, with ranks of
different speeds (so the settlement's MAX decides the modeled times), the stop agreement carried
along, records between the steps that carry, evaluations, a checkpoint and a resume: every record
is the same, number for number."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from gloo import run_gloo
from trainer_runs import TINY, compose_cfg, records

from lsgd.training.preemption import PreemptionWatch

MEASURED = {"wall_time_s", "comm_time_s", "compute_time_s", "compute_time_s_max", "samples_per_s"}
STEPS = 10
COMMON = [f"max_steps={STEPS}", "log_every=4", "eval_unit=step", "eval_every=6", "checkpoint_every=5",
          "cluster.speeds=[1.0,0.6]", "cluster.step_time_s=0.01", "network.bandwidth_gbps=1", "algo=ddp"]


class _StopOnRank1(PreemptionWatch):
    """The stop agreement with no handler installed; rank 1's code is an interrupt's (SIGINT) from
    the settlement of step ``stop_at`` on (``stop_at`` None: never)."""

    def __init__(self, rank: int, stop_at: int | None):
        super().__init__("off", interrupts=True)
        self.rank, self.stop_at, self.trainer = rank, stop_at, None

    def code(self) -> int:
        if self.rank == 1 and self.stop_at is not None and self.trainer.step + 1 >= self.stop_at:
            return 100 + signal.SIGINT
        return super().code()


def _train(rank, world, cfg, run_dir, stop_at, board):
    import os

    from lsgd.comm.settlement import CarriedSettlement
    from lsgd.training.trainer import Trainer

    os.environ["LSGD_BOARD"] = "1" if board else "0"  # (this rank's own environment)

    trainer = Trainer(cfg, Path(run_dir), "cpu", watch := _StopOnRank1(rank, stop_at))
    watch.trainer = trainer
    after_backward, trace = trainer.algorithm.after_backward, []

    def traced(step):
        after_backward(step)
        # the clock as after_backward's own read resolved it (the previous step's settlement
        # applied): a peek, not a read (a read would make the settlement's exchange here)
        trace.append([trainer.step, *trainer.clock._now.tolist()])

    trainer.algorithm.after_backward = traced
    try:
        summary = trainer.fit()
    finally:
        (Path(run_dir) / f"rank{rank}.json").write_text(json.dumps({
            "carried": CarriedSettlement.carried, "explicit": CarriedSettlement.explicit, "trace": trace,
            "board": trainer.comm._board is not None,
            "status": summary["status"], "steps": summary["steps"]}))


def _run(tmp_path: Path, overrides: list[str], name: str, resume: bool = False, stop_at: int | None = None,
         board: bool = True):
    """(records without the measured keys, each rank's exchange counts, clock trace and status);
    ``board``: the uncarried settlements through the shared-memory board (lsgd.comm.shared_memory; False:
    ``LSGD_BOARD=0``, gloo's all-gather)."""
    cfg = compose_cfg([*TINY, "launcher.nproc_per_node=2", f"results_dir={tmp_path}", *COMMON, *overrides])
    cfg.update(run_id=name, resume=resume)
    run_dir = tmp_path / name
    run_dir.mkdir(exist_ok=resume)
    run_gloo(_train, 2, cfg, str(run_dir), stop_at, board)
    recs = [{k: v for k, v in r.items() if k not in MEASURED} for r in records(run_dir) if "kind" not in r]
    return recs, [json.loads((run_dir / f"rank{r}.json").read_text()) for r in range(2)]


def test_carried_settlement_gives_the_records_of_its_own_exchange(tmp_path):
    gathered, ga_ranks = _run(tmp_path, ["algo.carry_settlement=false"], "gathered", board=False)
    explicit, ex_ranks = _run(tmp_path, ["algo.carry_settlement=false"], "explicit")
    carried, ranks = _run(tmp_path, ["algo.carry_settlement=true"], "carried")
    assert [r["step"] for r in carried] == [4, 6, 8, 10]
    assert carried == explicit == gathered
    # the settlements went through the shared-memory board (lsgd.comm.shared_memory) or, with LSGD_BOARD=0,
    # gloo's all-gather: the same values
    assert [r["board"] for r in ex_ranks] == [True] * 2 and [r["board"] for r in ga_ranks] == [False] * 2
    for rank in range(2):
        assert ga_ranks[rank]["trace"] == ex_ranks[rank]["trace"]
    # every step's clock on every rank, the previous step's settlement applied: the same values
    for rank in range(2):
        assert ranks[rank]["trace"] == ex_ranks[rank]["trace"]
        assert [t[0] for t in ranks[rank]["trace"]] == list(range(STEPS))
    # every settlement moved both clocks to the same end (the slow rank's, speed 0.6), then each
    # added its own step's compute (0.01 s at speed 1, 0.01 / 0.6 s)
    ends = [[t[1] - 0.01 / speed for t in ranks[rank]["trace"]] for rank, speed in enumerate((1.0, 0.6))]
    assert ends[0] == pytest.approx(ends[1], rel=1e-12, abs=1e-15)
    assert all(b - a > 0.01 / 0.6 for a, b in zip(ends[0], ends[0][1:]))
    assert carried[-1]["modeled_compute_s_max"] > 1.2 * carried[-1]["modeled_compute_s"]
    # explicit path: none carried; carried path: the settlements of the steps after which no
    # record, evaluation or checkpoint reads the clock (1, 2, 3, 7, 9) ride in the next step's
    # bucket, the others (records at 4, 6, 8, 10; the checkpoint at 5) are exchanged there
    assert [(r["carried"], r["explicit"]) for r in ex_ranks] == [(0, 0)] * 2
    assert [(r["carried"], r["explicit"]) for r in ranks] == [(5, 5)] * 2

    # resumed from the checkpoint at step 5 (which exchanged step 5's settlement: step 6's bucket
    # carries nothing), rank 1 interrupted from step 7's settlement on: its stop code rides in step
    # 8's bucket and every rank stops at step 8 (the record and a checkpoint written), with the
    # records and clocks of the uninterrupted run
    resumed, res_ranks = _run(tmp_path, ["algo.carry_settlement=true"], "carried", resume=True, stop_at=7)
    assert resumed == carried[:3]
    for rank in range(2):
        assert res_ranks[rank]["status"] == "interrupted" and res_ranks[rank]["steps"] == 8
        assert res_ranks[rank]["trace"] == ranks[rank]["trace"][5:8]
    assert [(r["carried"], r["explicit"]) for r in res_ranks] == [(1, 2)] * 2  # 7 carried; 6, 8
