"""``cluster.stretch`` through the trainer on 2 real gloo workers: synchronous local SGD at speeds
[1.0, 0.5] runs at the slow worker's modeled pace in wall time, the fast worker waits at the
synchronizations, and the clock (``modeled_*``) is untouched by the sleep."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from gloo import run_gloo
from trainer_runs import TINY, compose_cfg

STEP_S = 0.05  # modeled seconds per step at speed 1.0 (cluster.step_time_s)
SPEEDS = (1.0, 0.5)
H = 4  # local steps per round
ROUNDS = 4
TOTAL = H * ROUNDS


def _train(rank, world, cfg, run_dir):
    from lsgd.training.trainer import Trainer

    trainer = Trainer(cfg, Path(run_dir), "cpu")
    ends, blocked, step = [], [], trainer.train_step

    def timed(x, y):  # the end of each local step (its after_step, the round's all-reduce, included)
        step(x, y)
        ends.append(time.perf_counter())
        blocked.append(trainer.comm.blocked_s())

    trainer.train_step = timed
    trainer.fit()
    (Path(run_dir) / f"rank{rank}.json").write_text(json.dumps({
        "ends": ends, "blocked": blocked, "compute_time_s": trainer.compute_time_s,
        "stretched_s": trainer.timer.stretched_s}))


@pytest.mark.serial
@pytest.mark.timeout(60)
def test_local_sgd_runs_at_the_slow_workers_modeled_pace(tmp_path):
    """Speeds [1.0, 0.5], 0.05 s per step at speed 1 (the slow worker's steps last 0.1 s), H = 4,
    4 rounds; no record, evaluation or stop agreement before the last step, so the workers meet
    only at the rounds' all-reduces. Window: from the end of round 1 (both workers leave that
    all-reduce together, whatever their start-up skew) to the end of round 4.

    Closed form: 3 rounds x H x 0.1 s = 1.2 s; each slow step lasts at least 0.1 s by
    construction, so 1.2 s is a hard lower bound. The upper tolerance, 0.15 s (12%), covers what
    lies outside the stretched span: 12 batch loads and loop turns (~1 ms each here), the 3
    all-reduces of a ~20k-parameter CNN on loopback gloo (~1-2 ms each) and scheduling on a
    shared 2-core machine. The fast worker (0.05 s per step) spends 3 x (0.4 - 0.2) = 0.6 s
    blocked at the all-reduces, the slow one almost none; the sleep is compute: measured
    ``compute_time_s`` is at least the stretched 16 x 0.05 and 16 x 0.1 s; ``modeled_compute_s``
    is the profile's, not the wall time."""
    cfg = compose_cfg([*TINY, "launcher.nproc_per_node=2", f"results_dir={tmp_path}", "algo=local_sgd",
                       f"algo.local_steps={H}", "epochs=2", f"max_steps={TOTAL}", "log_every=1000",
                       "eval_every=1000", "cluster.compute=profile", f"cluster.step_time_s={STEP_S}",
                       f"cluster.speeds=[{SPEEDS[0]},{SPEEDS[1]}]", "cluster.stretch=true"])
    cfg["run_id"] = "stretch"
    cfg["resume"] = False
    run_dir = tmp_path / "stretch"
    run_dir.mkdir()
    run_gloo(_train, 2, cfg, str(run_dir))
    fast, slow = (json.loads((run_dir / f"rank{r}.json").read_text()) for r in range(2))
    slow_step = STEP_S / min(SPEEDS)
    closed = (ROUNDS - 1) * H * slow_step
    for rank in (fast, slow):
        assert len(rank["ends"]) == TOTAL
        window = rank["ends"][-1] - rank["ends"][H - 1]
        assert closed <= window <= closed + 0.15, window
    # the fast worker waited at the synchronizations, the slow one hardly
    fast_wait = fast["blocked"][-1] - fast["blocked"][H - 1]
    slow_wait = slow["blocked"][-1] - slow["blocked"][H - 1]
    assert fast_wait >= (ROUNDS - 1) * H * (slow_step - STEP_S) - 0.1, fast_wait
    assert slow_wait <= 0.1, slow_wait
    # the sleep is emulated compute (measured), not on the clock (modeled)
    assert fast["compute_time_s"] >= TOTAL * STEP_S and slow["compute_time_s"] >= TOTAL * slow_step
    assert fast["stretched_s"] > 0.5 * TOTAL * STEP_S and slow["stretched_s"] > 0.5 * TOTAL * slow_step
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["modeled_compute_s_max"] == pytest.approx(TOTAL * slow_step, rel=1e-9)
    assert summary["modeled_compute_s"] == pytest.approx(TOTAL * (STEP_S + slow_step) / 2, rel=1e-9)
