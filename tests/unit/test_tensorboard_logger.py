"""TensorBoardLogger without processes: a resumed attempt replaces the crashed attempt's events
(TensorBoard would otherwise show both values at the steps past the checkpoint), and an unknown
logger is a ConfigError naming the allowed ones."""

from __future__ import annotations

import pytest

from lsgd.core.errors import ConfigError
from lsgd.training.loggers import Loggers, TensorBoardLogger, build_logger, logger_names

CFG = {"seed": 0, "algo": {"name": "ddp"}, "experiment_name": "x", "logger": {"name": "tensorboard", "tensorboard": True}}


def scalars(folder) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_a_resumed_attempt_replaces_the_crashed_attempts_events(tmp_path):
    first = TensorBoardLogger(CFG, tmp_path)
    for step, loss in ((2, 4.0), (4, 3.0), (6, 2.5)):  # the crash came after step 6, the checkpoint at 4
        first.log({"step": step, "train_loss": loss, "modeled_time_s": step * 0.5})
    first.finish({"status": "failed"})
    resumed = TensorBoardLogger(CFG, tmp_path, resumed_step=4)
    for line in ({"step": 2, "train_loss": 4.0, "modeled_time_s": 1.0}, {"step": 4, "train_loss": 3.0, "modeled_time_s": 2.0},
                 {"step": 6, "train_loss": 2.0, "modeled_time_s": 3.0}):  # replayed, then the new step 6
        resumed.log(line)
    resumed.finish({"status": "completed"})
    got = scalars(tmp_path / "tensorboard")
    assert got["train_loss"] == [(2, 4.0), (4, 3.0), (6, 2.0)]
    assert got["by_modeled_time/train_loss"] == [(1_000_000, 4.0), (2_000_000, 3.0), (3_000_000, 2.0)]


def test_logger_names_and_unknown_loggers():
    assert logger_names({"name": "jsonl"}) == ["jsonl"]
    assert logger_names({"name": "wandb", "tensorboard": True, "wandb": True}) == ["jsonl", "tensorboard", "wandb"]
    with pytest.raises(ConfigError, match="logger.name='mlflow' is not allowed; allowed: jsonl, tensorboard, wandb"):
        logger_names({"name": "mlflow"})


def test_build_logger_combines(tmp_path):
    logger = build_logger(CFG, tmp_path)
    assert isinstance(logger, Loggers) and [type(x) for x in logger.loggers] == [TensorBoardLogger]
    logger.finish({"status": "completed"})
