"""``param_server`` (a server rank + workers) against ``ddp`` on the same data, through the trainer."""

from __future__ import annotations

import pytest
import torch
from trainer_runs import TINY, compose_cfg, train

CNN_PARAMS = 215_418
CNN_FLOAT_BUFFERS = 2 * (16 + 32)


def test_param_server_equals_ddp_and_moves_the_ps_bytes(tmp_path):
    steps, workers = 12, 2
    common = [f"max_steps={steps}", "optim.momentum=0.9", "eval_every=6"]
    ddp_recs, ddp_models = train(tmp_path, ["algo=ddp", *common], world=workers, name="ddp")
    ps_recs, ps_models = train(tmp_path, ["algo=param_server", *common], world=workers + 1, name="ps")

    # same data shards, same schedule: the same losses and the same model, up to the order of the
    # gradient sum (ring all-reduce vs the server's worker-order sum)
    assert [r["step"] for r in ps_recs] == [r["step"] for r in ddp_recs]
    for a, b in zip(ps_recs, ddp_recs):
        assert a["train_loss"] == pytest.approx(b["train_loss"], abs=1e-6)
        assert a["lr"] == b["lr"] and a["samples"] == b["samples"]
        if "test_acc" in b:
            assert a["test_acc"] == b["test_acc"]
    for server_or_worker in ps_models:  # every replica holds the server's model
        for p, q in zip(server_or_worker["params"], ddp_models[0]["params"]):
            torch.testing.assert_close(p, q, atol=1e-6, rtol=0)
        for p, q in zip(server_or_worker["buffers"], ddp_models[0]["buffers"]):
            torch.testing.assert_close(p.float(), q.float(), atol=1e-6, rtol=0)

    # bytes of the PS pattern, per step: worker 0 sends n + b, worker 1 sends n, the server sends
    # N (n + b); the mean and max over the three processes
    n, b = 4 * CNN_PARAMS, 4 * CNN_FLOAT_BUFFERS
    per_rank = [workers * (n + b), n + b, n]
    last = ps_recs[-1]
    assert last["comm_bytes_max"] == steps * max(per_rank)
    assert last["comm_bytes"] == pytest.approx(steps * sum(per_rank) / 3)
    # the workers alone (issue 22 item 6): what one worker sends, payload and wire (messages: equal)
    assert last["comm_bytes_workers"] == pytest.approx(steps * (2 * n + b) / 2)
    assert last["wire_bytes_workers"] == pytest.approx(steps * (2 * n + b) / 2)
    assert "comm_bytes_workers" not in ddp_recs[-1]  # every rank a worker: comm_bytes is that mean
    import yaml

    from lsgd.analysis import experiment_tables

    cfg = compose_cfg([*TINY, f"launcher.nproc_per_node={workers + 1}", "algo=param_server", *common])
    (tmp_path / "ps" / "config.yaml").write_text(yaml.safe_dump({**cfg, "world_size": workers + 1, "run_id": "ps"}))
    (table,) = (t.table for t in experiment_tables(tmp_path / "ps").values())
    assert table["gb_sent_per_worker"].tolist() == pytest.approx([steps * (2 * n + b) / 2 / 1e9])
    assert last["comm_rounds"] == steps
    # the plot's bytes axis is the same quantity (issue 22 item 6; wire bytes since issue 42, equal
    # to the payload for messages): at each evaluation, the workers' own (2n + b) / 2 per step so
    # far, not the all-rank mean (2n + b + N(n + b)) / 3 of wire_bytes
    from unittest import mock

    from lsgd.analysis import plots

    figures = {}
    with mock.patch.object(plots, "_save", lambda fig, stem: figures.setdefault(stem.name, fig) and []):
        plots.plot_runs(tmp_path / "ps", tmp_path / "plots")
    (stem,) = [s for s in figures if s.endswith("_test_acc_vs_wire_bytes")]
    (line,) = [ln for ln in figures[stem].axes[0].get_lines() if not ln.get_label().startswith("_")]
    evals = [r["step"] for r in ps_recs if "test_acc" in r]
    assert evals and list(line.get_xdata()) == pytest.approx([s * (2 * n + b) / 2 for s in evals])
