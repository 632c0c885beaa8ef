"""The trainer's recorder: training-loss accumulators, metrics records, metrics.jsonl, the
logger and progress display, the target accuracy and summary.json.

A record holds the per-worker figures gathered over all ranks at a record point (bytes, measured
and modeled compute, the modeled time at every what-if bandwidth); rank 0 writes metrics.jsonl and
summary.json (docs/results.md), every rank keeps its part of the checkpoint
(:meth:`Recorder.state_dict`).

Every collective here is uncounted (measurement, not training) and every rank reaches it at the
same point of the run (the algorithm's :meth:`~lsgd.algorithms.base.Algorithm.progress`), so ranks
with different roles never deadlock in bookkeeping.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

from lsgd.core.files import write_atomic
from lsgd.training.loggers import Progress, build_logger

log = logging.getLogger("lsgd")
#: train.log alone (lsgd.training.trainer.setup_logging): the step lines while a progress bar has the console
file_log = logging.getLogger("lsgd.file")


def modeled_time_key(bandwidth_gbps: float) -> str:
    """Metric name of the modeled time at a what-if inter-node bandwidth: ``modeled_time_1gbps_s``."""
    return f"modeled_time_{bandwidth_gbps:g}gbps_s"


def _maybe_int(x: float):
    return int(x) if float(x).is_integer() else float(x)


def record_step(line: str) -> float:
    """Step of a metrics.jsonl line; inf for a blank or torn line (a write cut by a kill)."""
    try:
        return json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):
        return float("inf")


class Recorder:
    """Metrics records, metrics.jsonl (rank 0), the logger, the target and summary.json.

    Args:
        cfg: the resolved run config.
        run_dir: the run folder.
        rank, is_main: this process; rank 0 writes.
        total_steps: for the progress display.
    """

    def __init__(self, cfg: dict, run_dir: Path, rank: int, total_steps: int):
        self.cfg, self.run_dir, self.rank = cfg, Path(run_dir), rank
        self.is_main = rank == 0
        # the training-loss accumulators live on the losses' device (moved there at the first
        # loss): a step adds to them without a device-to-host read; a record reads them once.
        # CPU losses wait as they are (_host_losses) and are folded in, in step order, when
        # the accumulators are read (the loss_sum / _counts properties): see add_loss
        self._loss_sum = torch.zeros((), dtype=torch.float64)
        self._loss_counts = torch.zeros(2, dtype=torch.int64)  # finite losses, non-finite losses
        self._host_losses: list[torch.Tensor] = []  # CPU losses (0-dim) not yet folded in
        self.best_test_acc = None
        self.best_test_ppl = None
        self.best_test_bleu = None
        self.last_eval: dict = {}
        self.target_hit: dict | None = None
        self.figures: dict = {}  # per-worker figures of the last record (worker_figures)
        self.pending_rows: list[dict] = []
        self.last_record_time = time.perf_counter()
        self.last_record_samples = 0
        self.metrics_path = self.run_dir / "metrics.jsonl"
        self.logger = None  # built in start(), after a resume has truncated metrics.jsonl
        self.resumed_step: int | None = None
        self.progress = Progress(total_steps) if self.is_main and sys.stdout.isatty() else None

    # -- accumulators ---------------------------------------------------------------------------
    #: CPU losses kept as Python floats at most (then folded into the tensors); 0: every loss
    #: takes the tensor path (the one a GPU's losses take)
    HOST_LOSSES_MAX = 1024

    @property
    def loss_sum(self) -> torch.Tensor:
        """The float64 sum of the finite training losses since the last record (0-dim tensor)."""
        self._fold_host_losses()
        return self._loss_sum

    @loss_sum.setter
    def loss_sum(self, value: torch.Tensor) -> None:
        self._fold_host_losses()
        self._loss_sum = value

    @property
    def _counts(self) -> torch.Tensor:
        """``[finite losses, non-finite losses]`` since the last record (int64)."""
        self._fold_host_losses()
        return self._loss_counts

    @_counts.setter
    def _counts(self, value: torch.Tensor) -> None:
        self._fold_host_losses()
        self._loss_counts = value

    def _fold_host_losses(self) -> None:
        """Add the CPU losses waiting in ``_host_losses`` to the accumulators, in step order, as
        the tensor path of :meth:`add_loss` would have: float64 adds one loss at a time (0.0 for a
        non-finite one), so the sum is bit for bit the same."""
        if not self._host_losses:
            return
        losses, self._host_losses = self._host_losses, []
        total, finite = self._loss_sum.item(), 0
        for t in losses:
            v = t.item()  # exact: a float32 / bfloat16 value is a float64 value
            if math.isfinite(v):
                total += v
                finite += 1
            else:
                total += 0.0
        self._loss_sum.fill_(total)
        self._loss_counts[0] += finite
        self._loss_counts[1] += len(losses) - finite

    @property
    def loss_count(self) -> int:
        """Finite training losses accumulated since the last record (a device-to-host read)."""
        return int(self._counts[0])

    @loss_count.setter
    def loss_count(self, value: int) -> None:
        self._counts[0] = int(value)

    @property
    def nonfinite(self) -> int:
        """Non-finite training losses accumulated (a device-to-host read)."""
        return int(self._counts[1])

    @nonfinite.setter
    def nonfinite(self, value: int) -> None:
        self._counts[1] = int(value)

    def add_loss(self, loss: torch.Tensor) -> None:
        """Accumulate one step's (detached, scalar) training loss; non-finite losses are counted
        apart. No device-to-host read (no host sync on a GPU): the sums stay on the loss's device
        until a record reads them. The arithmetic is the float64 sum of the float32 / bfloat16
        losses in step order, as a host-side sum (adding 0.0 for a non-finite loss is exact).

        A CPU loss (with CPU accumulators) is kept, as it is, in a list until the accumulators are
        read (:meth:`_fold_host_losses`, at the record, or every ``HOST_LOSSES_MAX`` losses), which
        reads each as a Python float (exact: a float32 / bfloat16 value is a float64 value): a list
        append per step instead of ~10 small torch ops (about 0.15 ms of a 7 ms demo step on this
        machine's CPU) or an ``item()``. The caller passes a detached loss (it is kept)."""
        if self.HOST_LOSSES_MAX and loss.is_cpu and self._loss_sum.is_cpu:
            losses = self._host_losses
            losses.append(loss)
            if len(losses) >= self.HOST_LOSSES_MAX:
                self._fold_host_losses()
            return
        v = loss.detach().reshape(()).to(torch.float64)
        if self.loss_sum.device != v.device:
            self.loss_sum, self._counts = self.loss_sum.to(v.device), self._counts.to(v.device)
        finite = torch.isfinite(v)
        self.loss_sum += torch.where(finite, v, torch.zeros_like(v))
        self._counts += torch.stack([finite, ~finite]).long()

    def take_losses(self) -> tuple[float, int, int]:
        """This rank's ``(loss sum, count, non-finite count)`` since the last call or record; zeroes
        them (see ``RunContext.take_losses``)."""
        counts = self._counts.tolist()
        out = (self.loss_sum.item(), counts[0], counts[1])
        self.loss_sum.zero_()
        self._counts.zero_()
        return out

    def add_losses(self, loss_sum: float, count: int, nonfinite: int) -> None:
        """Add losses another rank shipped (see ``RunContext.add_losses``)."""
        self.loss_sum += float(loss_sum)
        self._counts += torch.tensor([int(count), int(nonfinite)], dtype=torch.int64).to(self._counts.device)

    def start(self, samples: int) -> None:
        """Training (re)starts: rank 0 opens the logger; after a resume it first replays the kept
        metrics.jsonl lines into it, so the logger's history equals metrics.jsonl."""
        if self.is_main and self.logger is None:
            self.logger = build_logger(self.cfg, self.run_dir, resumed_step=self.resumed_step)
            if self.resumed_step is not None and self.metrics_path.exists():
                for line in self.metrics_path.read_text().splitlines():
                    self.logger.log(json.loads(line))
        self.last_record_time = time.perf_counter()
        self.last_record_samples = samples

    # -- records --------------------------------------------------------------------------------
    def make_record(self, trainer, step: int | None = None, local: bool = False) -> dict | None:
        """Reduce the loss accumulators over ranks (uncounted) and build a metrics record at
        progress ``step`` (default: the trainer's progress); None when some rank saw a non-finite
        loss (every rank gets the same reduced flag).

        ``local``: this rank alone, no collective (server bookkeeping,
        :attr:`lsgd.algorithms.base.Algorithm.bookkeeping`): its own accumulators (the losses its
        workers shipped), its own figures; a record without new losses repeats the previous
        record's ``train_loss`` (one arrival crossing several record points). Otherwise a record
        over which no worker finished a step (an asynchronous method whose workers all straddle
        it) has no ``train_loss`` key: no NaN in metrics.jsonl unless training diverged."""
        step = trainer.progress if step is None else step
        comm = trainer.comm
        buf = torch.cat([self.loss_sum.reshape(1), self._counts.to(torch.float64)])  # on the losses' device
        buf = buf.to(trainer.device) if trainer.device.type == "cuda" and not local else buf.cpu()
        if not local:
            comm.all_reduce(buf, count=False)
        loss_sum, count, nonfinite = buf.tolist()  # the record's one read
        self.loss_sum.zero_()
        self._counts[0] = 0
        if local:
            self._counts[1] = 0
        if nonfinite > 0:
            return None
        train_loss = loss_sum / count if count else None
        if local and not count:
            train_loss = getattr(self, "_last_train_loss", None)
        if train_loss is not None:
            self._last_train_loss = train_loss
        now = time.perf_counter()
        samples = step * int(self.cfg["batch_size"]) * trainer.num_workers
        rate = (samples - self.last_record_samples) / max(now - self.last_record_time, 1e-9)
        self.last_record_time, self.last_record_samples = now, samples
        self.pending_rows = trainer.algorithm.pop_step_rows()
        self.figures = self.worker_figures(trainer, gather=not local)
        return {
            "step": step,
            "epoch": step / trainer.steps_per_epoch,
            "samples": samples,
            "lr": trainer.optimizer.param_groups[0]["lr"],
            **({} if train_loss is None else {"train_loss": train_loss}),
            "comm_rounds": comm.stats.comm_rounds,
            "wall_time_s": now - trainer.start_time,
            "comm_time_s": comm.stats.comm_time_s,
            **self.figures,
            "samples_per_s": rate,
            **trainer.algorithm.metrics(),
            **trainer.precision.metrics(),
            **({} if local else self.consensus(trainer)),
        }

    def consensus(self, trainer) -> dict:
        """``consensus_distance`` of the workers' parameters at this record when they differ and
        ``consensus_every_record`` is on (uncounted collectives, on every rank); else nothing."""
        if not self.cfg.get("consensus_every_record") or trainer.role != "worker" or trainer.num_workers != trainer.world_size:
            return {}
        distance = trainer.algorithm.measure_consensus()
        return {} if distance is None else {"consensus_distance": distance}

    def worker_figures(self, trainer, gather: bool = True) -> dict:
        """Per-worker figures over all ranks (an uncounted all-gather at a record point).

        ``comm_bytes``, ``wire_bytes``, ``compute_time_s`` (measured), ``modeled_compute_s``,
        ``model_alpha_terms`` and ``model_beta_bytes`` are means over ranks, with ``<name>_max``
        beside the first four; ``peak_step_bytes`` is the maximum over ranks of the most wire bytes
        a rank sent in one step so far; ``modeled_time_s`` is the maximum of the ranks' clocks (the run's
        time on the configured cluster) with ``modeled_time_s_mean`` beside it, and
        ``modeled_time_<bw>gbps_s`` the maximum at each what-if bandwidth (``network.report_gbps``; the
        network preset's link of that bandwidth, latency included: :func:`lsgd.clock.network.what_if_latency_us`).
        In a run with server ranks (``num_workers`` < world size) ``comm_bytes_workers`` and
        ``wire_bytes_workers`` are the means over the worker ranks alone (what one worker sends;
        absent where no worker's values are at hand: ``gather=False`` on a server).
        ``gather=False``: this rank's own values (a failing run cannot gather).
        """
        comm, clock = trainer.comm, trainer.clock
        s = comm.stats
        values = [s.comm_bytes, s.wire_bytes, trainer.compute_time_s, clock.compute_s,
                  s.model_alpha_terms, s.model_beta_bytes, s.peak_step_bytes, *clock.now.tolist(),
                  float(trainer.role == "worker")]
        table = comm.gather_values(values) if gather else np.asarray([values], dtype=np.float64)
        is_worker = table[:, -1] > 0
        table = table[:, :-1]
        mean, top = table.mean(axis=0), table.max(axis=0)
        out = {
            "comm_bytes": _maybe_int(mean[0]), "comm_bytes_max": _maybe_int(top[0]),
            "wire_bytes": float(mean[1]), "wire_bytes_max": float(top[1]),
            "compute_time_s": float(mean[2]), "compute_time_s_max": float(top[2]),
            "modeled_compute_s": float(mean[3]), "modeled_compute_s_max": float(top[3]),
            "model_alpha_terms": float(mean[4]), "model_beta_bytes": float(mean[5]),
            "peak_step_bytes": float(top[6]),
            "modeled_time_s": float(top[7]), "modeled_time_s_mean": float(mean[7]),
        }
        for i, bw in enumerate(comm.network_config.report_gbps, start=8):
            out[modeled_time_key(bw)] = float(top[i])
        if trainer.num_workers < trainer.world_size and is_worker.any():
            workers = table[is_worker].mean(axis=0)
            out["comm_bytes_workers"] = _maybe_int(workers[0])
            out["wire_bytes_workers"] = float(workers[1])
        return out

    def note_eval(self, out: dict, step: int) -> None:
        """Best metrics and the first step that reached ``target_acc``."""
        if "test_acc" in out:
            acc = out["test_acc"]
            self.best_test_acc = acc if self.best_test_acc is None else max(self.best_test_acc, acc)
            target = self.cfg.get("target_acc")
            if target is not None and self.target_hit is None and acc >= float(target):
                self.target_hit = {"step": step}
        if "test_ppl" in out:
            ppl = out["test_ppl"]
            self.best_test_ppl = ppl if self.best_test_ppl is None else min(self.best_test_ppl, ppl)
        if "test_bleu" in out:
            bleu = out["test_bleu"]
            self.best_test_bleu = bleu if self.best_test_bleu is None else max(self.best_test_bleu, bleu)
        self.last_eval = {k: v for k, v in out.items() if k in ("test_loss", "test_acc", "test_ppl", "test_bleu")}

    def emit(self, rec: dict, step: int, total_steps: int) -> None:
        """Rank 0: append the record to metrics.jsonl, the logger and the progress display."""
        if self.target_hit is not None and "wall_time_s" not in self.target_hit:
            self.target_hit.update(wall_time_s=rec["wall_time_s"], modeled_time_s=rec["modeled_time_s"])
        if not self.is_main:
            return
        rows, self.pending_rows = self.pending_rows, []
        with open(self.metrics_path, "a") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)  # each row carries its "kind"
            f.write(json.dumps(rec) + "\n")
        if self.logger is not None:
            for row in rows:
                self.logger.log(row)
            self.logger.log(rec)
        if self.progress is not None:
            self.progress.update(step, rec)
        # the step line: on the console unless the progress bar shows it, always in train.log
        (log if self.progress is None else file_log).info(
            "step %d/%d epoch %.2f loss %s%s %.0f samples/s %.2f MB sent",
            rec["step"], total_steps, rec["epoch"], f"{rec['train_loss']:.4f}" if "train_loss" in rec else "-",
            (f" test_acc {rec['test_acc']:.4f}" if "test_acc" in rec else (f" test_ppl {rec['test_ppl']:.2f}" if "test_ppl" in rec else ""))
            + (f" test_bleu {rec['test_bleu']:.2f}" if "test_bleu" in rec else ""),
            rec["samples_per_s"], rec["comm_bytes"] / 1e6,
        )

    def tick(self, step: int) -> None:
        if self.progress is not None:
            self.progress.update(step, None)

    def write_summary(self, trainer, status: str, error: str | None = None) -> dict:
        """Final record (see docs/results.md); rank 0 writes summary.json atomically."""
        s = trainer.comm.stats
        wall = time.perf_counter() - trainer.start_time
        hit = self.target_hit or {}
        summary = {
            "status": status,
            "run_id": self.cfg.get("run_id"),
            "experiment_name": self.cfg["experiment_name"],
            "algo": self.cfg["algo"]["name"],
            "world_size": trainer.world_size,
            "num_workers": trainer.ctx.num_workers,
            "steps": trainer.progress,
            "epochs": trainer.progress / trainer.steps_per_epoch,
            "samples": trainer.samples,
            "final_test_loss": self.last_eval.get("test_loss"),
            "final_test_acc": self.last_eval.get("test_acc"),
            "best_test_acc": self.best_test_acc,
            "final_test_ppl": self.last_eval.get("test_ppl"),
            "best_test_ppl": self.best_test_ppl,
            "final_test_bleu": self.last_eval.get("test_bleu"),
            "best_test_bleu": self.best_test_bleu,
            "comm_rounds": s.comm_rounds,
            "wall_time_s": wall,
            "comm_time_s": s.comm_time_s,
            # LogGP's per-message overhead o the clock priced every message with (network.overhead_us)
            "network_overhead_us": trainer.comm.network_config.inter.overhead_us,
            **(self.figures or self.worker_figures(trainer, gather=False)),
            **{f"profile_{k}": v for k, v in trainer.compute_model.profile.items()},
            "target_acc": self.cfg.get("target_acc"),
            "time_to_target_s": hit.get("wall_time_s"),
            "modeled_time_to_target_s": hit.get("modeled_time_s"),
            "step_to_target": hit.get("step"),
            "error": error,
        }
        if getattr(trainer, "stop_signal", None):  # preempted / interrupted: by which signal
            from lsgd.training.preemption import signal_name

            summary["signal"] = signal_name(trainer.stop_signal)
        if self.is_main:
            write_atomic(self.run_dir / "summary.json", json.dumps(summary, indent=2))
        return summary

    def finish(self, summary: dict) -> None:
        """Finish the logger's run. A logger error is logged, never raised: it must not hide the
        run's own outcome or exception."""
        if self.logger is not None:
            try:
                self.logger.finish(summary)
            except Exception:
                log.exception("the logger could not finish its run")

    def close(self) -> None:
        if self.progress is not None:
            self.progress.close()

    def truncate_to(self, step: int) -> None:
        """Rank 0 on resume: keep the metrics.jsonl lines up to ``step`` (drops a torn last line).

        Per-step rows (``kind``) are written just before the record they precede; rows after the
        last kept record belong to a later record (a checkpoint between two records holds them in
        the algorithm's ``step_rows``, which the resumed run writes again), so they are dropped."""
        self.resumed_step = step
        if self.is_main and self.metrics_path.exists():
            kept = [line for line in self.metrics_path.read_text().splitlines() if record_step(line) <= step]
            while kept and "kind" in json.loads(kept[-1]):
                kept.pop()
            write_atomic(self.metrics_path, "".join(line + "\n" for line in kept))

    def state_dict(self) -> dict:
        return {
            "loss_sum": self.loss_sum.cpu().clone(), "loss_count": self.loss_count, "nonfinite": self.nonfinite,
            "best_test_acc": self.best_test_acc, "best_test_ppl": self.best_test_ppl,
            "best_test_bleu": self.best_test_bleu,
            "last_eval": self.last_eval, "target_hit": self.target_hit,
        }

    def load_state_dict(self, state: dict) -> None:
        for key in ("loss_sum", "loss_count", "nonfinite", "best_test_acc", "best_test_ppl", "last_eval", "target_hit"):
            setattr(self, key, state[key])
        self.loss_sum = self.loss_sum.to(self._counts.device)  # saved on the host
        self.best_test_bleu = state.get("best_test_bleu")  # absent from checkpoints written before BLEU
