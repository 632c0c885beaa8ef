"""Where records go besides metrics.jsonl: TensorBoard and Weights & Biases (rank 0), and the
progress display.

TensorBoard (``torch.utils.tensorboard``), W&B and rich do the work; this module picks the loggers
(``logger=tensorboard``, ``logger=wandb``, or several: ``logger=[jsonl,tensorboard,wandb]``) and
keeps the rank-0 / always-finish rules (design.md pitfalls: log from rank 0 only, pass the resolved
config, always finish the run).

How the list form works: each ``conf/logger/`` option sets ``name`` and a key of its own name set
to true (``tensorboard: true``, ``wandb: true``); Hydra merges the options of a list, so the
loggers in use are ``name`` plus every such key (:func:`logger_names`).
"""

from __future__ import annotations

import logging
import math
import numbers
import os
import shutil
from pathlib import Path

from lsgd.core.errors import ConfigError

log = logging.getLogger("lsgd")

#: the loggers ``logger=`` may name (metrics.jsonl, ``jsonl``, is always written)
LOGGERS = ("jsonl", "tensorboard", "wandb")


def logger_names(logger_cfg: dict) -> list[str]:
    """The loggers a run's ``logger`` section selects: ``name`` and each of :data:`LOGGERS` set to
    true, in :data:`LOGGERS` order, ``jsonl`` first (always).

    Raises:
        ConfigError: ``logger.name`` is not one of :data:`LOGGERS`.
    """
    name = logger_cfg.get("name", "jsonl")
    if name not in LOGGERS:
        raise ConfigError(f"logger.name={name!r} is not allowed; allowed: {', '.join(LOGGERS)} "
                          "(several: logger=[jsonl,tensorboard,wandb])")
    return [n for n in LOGGERS if n == "jsonl" or n == name or logger_cfg.get(n) is True]


def run_label(cfg: dict) -> str:
    """A run's name for people, as the report labels its arm plus the seed: ``"local SGD, H=8,
    seed 1"``, ``"compressed, top-k, CF=10, seed 0"`` (:func:`lsgd.core.labels.config_label_parts`: the
    method, the study arm, the keys that define the method, with the words of the registries,
    :meth:`lsgd.algorithms.base.Algorithm.label_facts`; the report adds the keys that differ between
    arms, which a single run cannot know). ``seed`` is written last, as ``seed 1``."""
    from lsgd.algorithms import ALGORITHMS
    from lsgd.core.labels import config_label_parts, flatten

    flat = flatten(cfg)
    name = flat.get("algo.name")
    facts = ALGORITHMS.entry(name).obj.label_facts(flat) if isinstance(name, str) and name in ALGORITHMS else None
    # a study arm named as its algorithm ("adsaga" beside the method's name "ADSAGA"): once
    seen: set[str] = set()
    parts = [p for p in config_label_parts(flat, facts) if not (p.casefold() in seen or seen.add(p.casefold()))]
    return ", ".join([*parts, f"seed {cfg.get('seed')}"])


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict):
            out.update(_flatten(v, key))
        else:
            out[key] = v
    return out


class JsonlOnly:
    """metrics.jsonl is always written by the recorder; this logger adds nothing."""

    def log(self, line: dict) -> None:
        pass

    def finish(self, summary: dict) -> None:
        pass


class WandbLogger:
    """Weights & Biases on rank 0: resolved config, group = experiment, WANDB_MODE respected.

    Every line of metrics.jsonl reaches W&B at its ``step``: records as they are, per-step
    compression rows (lines with a ``kind``) as ``<kind>/<key>`` (e.g. ``gravac/cf``), so W&B's
    history holds what metrics.jsonl holds.

    Resume: W&B drops a ``log`` at a step below the run's last one, and a crashed run has logged
    steps past its last checkpoint, so continuing its W&B run would keep the pre-crash values. Each
    attempt is therefore its own W&B run (same name and group; id ``<run_id>`` for the first,
    ``<run_id>-r<k>`` for the k-th resume, listed in ``wandb_runs.json`` in the run folder), and a
    resumed attempt first replays the kept metrics.jsonl lines (the recorder does), so the newest
    attempt's history equals metrics.jsonl. Works offline; W&B's server-side rewind
    (``resume_from``) would need the service.
    """

    def __init__(self, cfg: dict, run_dir: Path, resumed_step: int | None = None):
        """W&B run named by :func:`run_label` (``"local SGD, H=8, seed 1"``), grouped by
        ``experiment_name``, tagged ``algo:<algo.name>`` and ``variant:<study.arm>`` (when the run
        is a study arm); the lsgd run id is its id and in its config."""
        import json

        import wandb

        from lsgd.core.files import write_atomic

        wcfg = cfg["logger"]
        attempts_file = Path(run_dir) / "wandb_runs.json"
        attempts = json.loads(attempts_file.read_text()) if attempts_file.exists() else []
        run_id = cfg.get("run_id")
        wandb_id = run_id if not attempts else f"{run_id}-r{len(attempts)}"
        write_atomic(attempts_file, json.dumps([*attempts, wandb_id]))
        self.run = wandb.init(
            project=wcfg.get("project", "lsgd"),
            entity=wcfg.get("entity"),
            group=cfg["experiment_name"],
            name=run_label(cfg),
            tags=[f"algo:{cfg['algo']['name']}"]
            + ([f"variant:{cfg['study']['arm']}"] if (cfg.get("study") or {}).get("arm") else []),
            id=wandb_id,
            config={**cfg, "wandb_attempt": len(attempts), "resumed_from_step": resumed_step},
            dir=str(run_dir),
            mode=os.environ.get("WANDB_MODE", wcfg.get("mode", "online")),
        )

    def log(self, line: dict) -> None:
        """One metrics.jsonl line (a record, or a per-step row with a ``kind``)."""
        if "kind" in line:
            kind = line["kind"]
            line = {"step": line["step"], **{f"{kind}/{k}": v for k, v in line.items() if k not in ("kind", "step")}}
        self.run.log(line, step=line["step"])

    def finish(self, summary: dict) -> None:
        """Summary values, then finish the run (once; later calls do nothing)."""
        if self.run is None:
            return
        run, self.run = self.run, None
        for k, v in summary.items():
            if v is not None:
                run.summary[k] = v
        if summary["status"] == "preempted":
            run.mark_preempting()
        run.finish(exit_code=0 if summary["status"] == "completed" else 1)


class TensorBoardLogger:
    """TensorBoard event files in ``<run folder>/tensorboard`` (rank 0), through
    ``torch.utils.tensorboard.SummaryWriter``.

    * Scalars: every number of a metrics.jsonl record under the record's own key (``train_loss``,
      ``test_acc``, ``comm_bytes``, ...) at global step = the record's ``step``; per-step rows (lines
      with a ``kind``) as ``<kind>/<key>``, as W&B gets them.
    * Modeled time as a second axis: the same record keys again under ``by_modeled_time/<key>`` at
      global step = round(``modeled_time_s`` x 1e6), the modeled time in microseconds (TensorBoard's
      steps are integers). Plot ``by_modeled_time/test_acc`` to see accuracy against the target
      cluster's time; TensorBoard shows the step axis, so read it as microseconds.
    * Hyperparameters (HParams dashboard): the resolved config, flattened to dotted keys (lists and
      null as text), with ``train_loss``, ``test_loss``, ``test_acc``, ``test_ppl`` as its metrics;
      the run's status ends the session.

    Scalars are stored as float32 (TensorBoard's ``simple_value``). A resumed run starts the folder
    afresh and replays the kept metrics.jsonl lines (the recorder does), so the event files hold
    exactly what metrics.jsonl holds.
    """

    DIR = "tensorboard"
    MODELED = "by_modeled_time/"

    def __init__(self, cfg: dict, run_dir: Path, resumed_step: int | None = None):
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        folder = Path(run_dir) / self.DIR
        if resumed_step is not None and folder.exists():
            shutil.rmtree(folder)  # the crashed attempt logged past the checkpoint; replayed below
        self.writer = SummaryWriter(log_dir=str(folder))
        exp, ssi, _ = hparams(_hparam_values(cfg), {m: 0.0 for m in ("train_loss", "test_loss", "test_acc", "test_ppl")})
        for summary in (exp, ssi):  # the session's end (sei) is written by finish(), with the status
            self.writer.file_writer.add_summary(summary)

    def log(self, line: dict) -> None:
        """One metrics.jsonl line (a record, or a per-step row with a ``kind``)."""
        step = int(line["step"])
        if "kind" in line:
            values = {f"{line['kind']}/{k}": v for k, v in line.items() if k not in ("kind", "step")}
        else:
            values = {k: v for k, v in line.items() if k != "step"}
        values = {k: float(v) for k, v in values.items() if isinstance(v, numbers.Real) and not isinstance(v, bool)}
        for key, value in values.items():
            self.writer.add_scalar(key, value, global_step=step)
        modeled = line.get("modeled_time_s")
        if "kind" not in line and isinstance(modeled, numbers.Real) and math.isfinite(modeled):
            micros = round(float(modeled) * 1e6)
            for key, value in values.items():
                self.writer.add_scalar(self.MODELED + key, value, global_step=micros)

    def finish(self, summary: dict) -> None:
        """Close the HParams session with the run's status, flush and close (once)."""
        if self.writer is None:
            return
        writer, self.writer = self.writer, None
        writer.file_writer.add_summary(_session_end(summary.get("status")))
        writer.flush()
        writer.close()


def _session_end(status: str | None):
    """The HParams session-end summary (as ``torch.utils.tensorboard.summary.hparams`` builds it)
    with the run's status: success for ``completed``, failure for ``failed`` and ``diverged``, unknown
    for a stopped run (``preempted``, ``interrupted``: it goes on after a resume)."""
    from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
    from tensorboard.plugins.hparams.api_pb2 import Status
    from tensorboard.plugins.hparams.metadata import PLUGIN_DATA_VERSION, PLUGIN_NAME, SESSION_END_INFO_TAG
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData, SessionEndInfo

    name = {"completed": "STATUS_SUCCESS", "failed": "STATUS_FAILURE", "diverged": "STATUS_FAILURE"}.get(status, "STATUS_UNKNOWN")
    info = SessionEndInfo(status=Status.Value(name))
    content = HParamsPluginData(session_end_info=info, version=PLUGIN_DATA_VERSION)
    meta = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name=PLUGIN_NAME,
                                                                  content=content.SerializeToString()))
    return Summary(value=[Summary.Value(tag=SESSION_END_INFO_TAG, metadata=meta)])


def _hparam_values(cfg: dict) -> dict:
    """The resolved config as HParams values: dotted keys; numbers, text and booleans as they are,
    anything else (null, lists) as its text."""
    out = {}
    for key, value in _flatten(cfg).items():
        out[key] = value if isinstance(value, (bool, int, float, str)) else str(value)
    return out


class Loggers:
    """Several loggers as one: each line to each; ``finish`` finishes them all, an error of one
    logged, not raised (it must not hide the run's outcome nor stop the others)."""

    def __init__(self, loggers: list):
        self.loggers = loggers

    def log(self, line: dict) -> None:
        for logger in self.loggers:
            logger.log(line)

    def finish(self, summary: dict) -> None:
        for logger in self.loggers:
            try:
                logger.finish(summary)
            except Exception:
                log.exception("the %s logger could not finish its run", type(logger).__name__)


def build_logger(cfg: dict, run_dir: Path, resumed_step: int | None = None):
    """The loggers of :func:`logger_names` (``jsonl``: metrics.jsonl only, which the recorder
    writes), as one :class:`Loggers`. ``resumed_step``: the checkpoint step this attempt resumes
    from (None: a fresh start)."""
    names = logger_names(cfg["logger"])
    made = []
    if "tensorboard" in names:
        made.append(TensorBoardLogger(cfg, run_dir, resumed_step))
    if "wandb" in names:
        made.append(WandbLogger(cfg, run_dir, resumed_step))
    return Loggers(made) if made else JsonlOnly()


class Progress:
    """A rich progress bar (rank 0, TTY only): step, epoch, loss, accuracy, samples/s, MB sent."""

    def __init__(self, total: int):
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            TextColumn,
            TimeRemainingColumn,
        )
        from rich.progress import (
            Progress as RichProgress,
        )

        self.progress = RichProgress(
            TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
            TextColumn("{task.fields[info]}"),
        )
        self.task = self.progress.add_task("train", total=total, info="")
        self.progress.start()
        self.info = ""

    def update(self, step: int, rec: dict | None) -> None:
        if rec is not None:
            acc = f" acc {rec['test_acc']:.3f}" if "test_acc" in rec else ""
            loss = f"{rec['train_loss']:.3f}" if "train_loss" in rec else "-"  # no step finished in the window
            self.info = (
                f"epoch {rec['epoch']:.2f} loss {loss}{acc} "
                f"{rec['samples_per_s']:.0f} samples/s {rec['comm_bytes'] / 1e6:.1f} MB sent"
            )
        self.progress.update(self.task, completed=step, info=self.info)

    def close(self) -> None:
        self.progress.stop()
