"""logger=tensorboard and combined loggers (issue 24): TensorBoard's own reader gets back what
metrics.jsonl holds, by step and by modeled time, and the resolved config as hyperparameters; W&B
beside it names the run by its arm label, groups by experiment, tags algo and variant."""

from __future__ import annotations

import json

import numpy as np
import yaml
from runner import summary
from wandb_history import run_records

from lsgd.training.loggers import run_label


def flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else k
        out.update(flat(v, key) if isinstance(v, dict) else {key: v})
    return out


def test_tensorboard_and_wandb_together_hold_what_metrics_jsonl_holds(gravac_crash):
    """GraVAC (per-step rows) with logger=[jsonl,tensorboard,wandb] (the uninterrupted run of
    conftest.gravac_crash: records every 2 steps, evaluations every 5): every number of every
    metrics.jsonl line is a TensorBoard scalar at its step (float32, as TensorBoard stores them),
    records again under by_modeled_time/ at round(modeled_time_s * 1e6); nothing else is there;
    one event file (rank 0 only); the HParams session holds the saved config.yaml's values and ends
    in success; the W&B run of the same job is named, grouped and tagged."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    run = gravac_crash.plain
    assert summary(run)["status"] == "completed"
    assert len(list((run / "tensorboard").glob("events.out.tfevents.*"))) == 1
    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()

    want: dict[str, dict[int, float]] = {}
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any("kind" in row for row in lines) and any("test_acc" in row for row in lines)
    for row in lines:
        step = row["step"]
        if "kind" in row:
            numbers = {f"{row['kind']}/{k}": v for k, v in row.items() if k not in ("kind", "step")}
        else:
            numbers = {k: v for k, v in row.items() if k != "step"}
        numbers = {k: v for k, v in numbers.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        for key, value in numbers.items():
            want.setdefault(key, {})[step] = value
            if "kind" not in row:
                want.setdefault(f"by_modeled_time/{key}", {})[round(row["modeled_time_s"] * 1e6)] = value
    got = {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}
    assert sorted(got) == sorted(want)
    for tag, series in want.items():
        assert got[tag] == {s: float(np.float32(v)) for s, v in series.items()}, tag
    # modeled time grows: the second axis is ordered like the steps
    modeled = [row["modeled_time_s"] for row in lines if "kind" not in row]
    assert modeled == sorted(modeled) and sorted(got["by_modeled_time/train_loss"]) == [round(m * 1e6) for m in modeled]

    # hyperparameters: the resolved config (config.yaml adds world_size and derived keys after)
    content = acc.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"]).session_start_info
    end = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_end_info"]).session_end_info
    hp = {k: v.string_value if v.HasField("string_value") else v.bool_value if v.HasField("bool_value")
          else v.number_value for k, v in start.hparams.items()}
    saved = flat(yaml.safe_load((run / "config.yaml").read_text()))
    common = [k for k in hp if k in saved]
    assert len(common) > 50 and {"algo.name", "algo.compressor", "seed", "optim.lr", "batch_size"} <= set(common)
    for k in common:
        v = saved[k]
        assert hp[k] == (v if isinstance(v, (bool, int, float, str)) else str(v)), k
    assert end.status == 1  # STATUS_SUCCESS

    # W&B beside it: named by the arm label and seed, grouped by experiment, tagged with algo
    (wandb_file,) = (run / "wandb").glob("offline-run-*/run-*.wandb")
    runs = run_records(wandb_file)
    assert runs and runs[0].display_name == "GraVAC, top-k, seed 1"
    assert runs[0].run_group == "debug" and list(runs[0].tags) == ["algo:gravac"]


def test_run_label_writes_the_arm_as_the_report_does_plus_the_seed():
    local = {"algo": {"name": "local_sgd", "local_steps": 8, "buffer_policy": "maintain"}, "seed": 1}
    assert run_label(local) == "local SGD, H=8, seed 1"
    topk = {"algo": {"name": "compressed", "compressor": "topk", "cf": 100, "error_feedback": True}, "seed": 0}
    assert run_label(topk) == "compressed, top-k, CF=100, seed 0"
    arm = {"algo": {"name": "adsaga", "mode": "async"}, "study": {"arm": "adsaga"}, "seed": 2}
    assert run_label(arm) == "ADSAGA, seed 2"  # a part written twice (the arm named as its method) is written once
