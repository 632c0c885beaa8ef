"""The trainer's services: recording, evaluation and checkpoints, the same for every role.

Each service owns one concern and its part of the checkpoint:

* :class:`Recorder`: the training-loss accumulators, metrics records (per-worker figures gathered
  over all ranks at a record point), metrics.jsonl, the logger and progress display, target
  accuracy and summary.json;
* :class:`Evaluator`: test loss / accuracy / perplexity (translation: also BLEU of greedy decodes)
  of the model the algorithm exposes for evaluation (the average model when replicas differ, with
  the consensus distance);
* :class:`Checkpointer`: per-rank shards under ``checkpoints/step_XXXXXXXX/`` and ``last.json``.

Every collective here is uncounted (measurement, not training) and every rank reaches it at the
same point of the run (the algorithm's :meth:`~lsgd.algorithms.base.Algorithm.progress`), so ranks
with different roles never deadlock in bookkeeping.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from lsgd.data import IGNORE_INDEX, eval_batches
from lsgd.core.files import write_atomic
from lsgd.training.loggers import Progress, build_logger

log = logging.getLogger("lsgd")
#: train.log alone (lsgd.training.trainer.setup_logging): the step lines while a progress bar has the console
file_log = logging.getLogger("lsgd.file")


def loss_fn(out: torch.Tensor, y: torch.Tensor, reduction: str = "mean", label_smoothing: float = 0.0) -> torch.Tensor:
    """Cross-entropy in nats; language and translation models: over the (B*T) next-token targets,
    where targets equal to ``IGNORE_INDEX`` (-100, translation padding) carry no loss and ``mean``
    averages over the others.

    ``label_smoothing`` = eps in [0, 1) (Szegedy et al. 2016, "Rethinking the Inception
    Architecture", Sec. 7; Vaswani et al. 2017 train with eps_ls = 0.1, Sec. 5.4): the target is
    (1 - eps) one-hot + eps uniform over all C classes, so a target's loss is
    (1 - eps) * (-log p_y) + eps * (1/C) sum_c (-log p_c) (``F.cross_entropy``'s
    ``label_smoothing``); ignored targets still carry none. 0 (the default) is plain
    cross-entropy, bit for bit. The trainer smooths its training loss only (``label_smoothing``
    in the run config); the evaluator's ``test_loss`` is always plain cross-entropy."""
    if out.dim() == 3:
        return F.cross_entropy(out.reshape(-1, out.size(-1)), y.reshape(-1), reduction=reduction,
                               ignore_index=IGNORE_INDEX, label_smoothing=label_smoothing)
    return F.cross_entropy(out, y, reduction=reduction, ignore_index=IGNORE_INDEX, label_smoothing=label_smoothing)


#: BLEU's sufficient statistics: matching n-gram counts (n = 1..4), n-gram totals, hypothesis and
#: reference lengths (in 13a tokens); sums over sentences, so ranks add theirs
BLEU_STATS = 10


def bleu_stats(hypotheses: list[str], references: list[str]) -> np.ndarray:
    """float64 (``BLEU_STATS``,) statistics of sacreBLEU's corpus BLEU (Post 2018, "A Call for
    Clarity in Reporting BLEU Scores"; its default: one reference, mixed case, 13a tokenization of
    detokenized text, exponential smoothing) of ``hypotheses`` against ``references`` (one each,
    same order); zeros for none."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    if not hypotheses:
        return np.zeros(BLEU_STATS)
    from sacrebleu.metrics import BLEU

    score = BLEU().corpus_score(list(hypotheses), [list(references)])
    return np.asarray([*score.counts, *score.totals, score.sys_len, score.ref_len], dtype=np.float64)


def bleu_from_stats(stats) -> float:
    """Corpus BLEU in [0, 100] from summed :func:`bleu_stats` (what ``sacrebleu.corpus_bleu`` gives
    on all the sentences together): 100 x brevity penalty x geometric mean of the 1..4-gram
    precisions, exponentially smoothed; 0 for an empty corpus."""
    from sacrebleu.metrics import BLEU

    c = [round(float(v)) for v in stats]
    return float(BLEU.compute_bleu(c[0:4], c[4:8], c[8], c[9], smooth_method="exp").score)


def target_count(y: torch.Tensor) -> int:
    """Targets that count in a loss sum: those not equal to ``IGNORE_INDEX`` (all of them for
    classification labels and language-model blocks)."""
    return int((y != IGNORE_INDEX).sum())


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
        beside the first four; ``modeled_time_s`` is the maximum of the ranks' clocks (the run's
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
                  s.model_alpha_terms, s.model_beta_bytes, *clock.now.tolist(), float(trainer.role == "worker")]
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
            "modeled_time_s": float(top[6]), "modeled_time_s_mean": float(mean[6]),
        }
        for i, bw in enumerate(comm.network_config.report_gbps, start=7):
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
        """Final record (see docs/run_format.md); rank 0 writes summary.json atomically."""
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


class Evaluator:
    """Test metrics of the model the algorithm exposes for evaluation.

    The test set is split across all ranks and the sums reduced (uncounted). Inside the
    algorithm's ``eval_context`` every rank holds the model to evaluate (the average model when the
    replicas differ, with the consensus distance in the record).

    Translation with ``bleu_samples`` > 0 adds ``test_bleu``: sacreBLEU's corpus BLEU (in [0, 100])
    of the model's greedy decodes (``model.greedy_decode``: at most source length + 50 tokens,
    stopping at EOS) of the first ``bleu_samples`` test pairs, detokenized with the loader's
    tokenizer, against the stored target texts; the pairs are split across ranks and the BLEU
    statistics summed, so the score is that of the whole corpus at once.
    """

    def __init__(self, test_set, task: str, batch_size: int, device: torch.device, workers: bool = False,
                 workers_samples: int | None = None, bleu_samples: int = 0):
        self.test_set, self.task, self.batch_size, self.device = test_set, task, batch_size, device
        self.workers, self.workers_samples = workers, workers_samples
        self.bleu_samples = int(bleu_samples or 0) if task == "translation" else 0

    def _bleu_stats(self, model, rank: int, world_size: int) -> np.ndarray:
        """:func:`bleu_stats` of this rank's contiguous slice of the first ``bleu_samples`` test
        pairs (the slicing of :func:`lsgd.data.eval_batches`)."""
        test = self.test_set
        n = min(len(test), self.bleu_samples)
        idx = torch.arange(rank * n // world_size, (rank + 1) * n // world_size)
        hyps: list[str] = []
        refs: list[str] = []
        for part in idx.split(self.batch_size):
            if not len(part):
                continue
            x, _ = test.batch(part)
            out = model.greedy_decode(x[:, : model.src_len].to(self.device), test.ids.bos, test.ids.eos)
            hyps += [test.detokenize(row) for row in out.tolist()]
            refs += test.references(part.tolist())
        return bleu_stats(hyps, refs)

    def _sums(self, model, rank: int, world_size: int, limit: int | None = None) -> tuple[float, float, float]:
        """(loss sum, correct, count) of ``model`` on this rank's slice of the test set (of its
        first ``limit`` samples); ``count`` is samples (classification) or target tokens, padding
        (``IGNORE_INDEX``) excluded."""
        loss_sum = correct = count = 0.0
        for x, y in eval_batches(self.test_set, rank, world_size, self.batch_size, limit):
            x, y = x.to(self.device), y.to(self.device)
            out = model(x)
            loss_sum += loss_fn(out, y, reduction="sum").item()
            count += target_count(y)
            if self.task == "classification":
                correct += (out.argmax(-1) == y).sum().item()
        return loss_sum, correct, count

    @torch.no_grad()
    def evaluate(self, model, algorithm, comm, rank: int, world_size: int, is_worker: bool = True,
                 local: bool = False) -> dict:
        """Test metrics of the evaluation model (split across ranks). With ``eval_workers`` and
        differing replicas, also every worker's own model on the whole test set (its first
        ``eval_workers_samples`` samples when set):
        ``test_acc_workers_mean`` / ``_min`` (``test_ppl_workers_mean`` / ``_max``). Translation
        with ``bleu_samples``: ``test_bleu`` of the evaluation model (class docstring).

        ``local``: this rank's own ``model`` over the whole test set, with no collective and no
        ``eval_context`` (server bookkeeping: the server's model)."""
        if local:
            rank, world_size = 0, 1
        was_training = model.training
        model.eval()
        own = None
        if self.workers and not algorithm.models_in_sync and world_size > 1:
            own = self._sums(model, 0, 1, self.workers_samples) if is_worker else None
        with contextlib.nullcontext() if local else algorithm.eval_context():
            loss_sum, correct, count = self._sums(model, rank, world_size)
            bleu = self._bleu_stats(model, rank, world_size) if self.bleu_samples else np.zeros(0)
        model.train(was_training)
        extra = self._worker_metrics(own, comm) if self.workers and not algorithm.models_in_sync and world_size > 1 else {}
        buf = torch.tensor([loss_sum, correct, count, *bleu], dtype=torch.float64, device=self.device)
        if not local:
            comm.all_reduce(buf, count=False)
        loss_sum, correct, count, *bleu = buf.tolist()
        test_loss = loss_sum / max(count, 1)
        out = {"test_loss": test_loss}
        if algorithm.consensus_distance is not None:
            out["consensus_distance"] = algorithm.consensus_distance
        if self.task == "classification":
            out["test_acc"] = correct / max(count, 1)
        else:
            out["test_ppl"] = math.exp(min(test_loss, 50.0))
        if self.bleu_samples:
            out["test_bleu"] = bleu_from_stats(bleu)
        out.update(extra)
        return out

    def _worker_metrics(self, own: tuple | None, comm) -> dict:
        """Mean and worst over workers of their own models' metrics (an uncounted all-gather)."""
        vals = [float("nan")] * 2 if own is None else [own[0] / max(own[2], 1), own[1] / max(own[2], 1)]
        table = comm.gather_values(vals)
        table = table[~np.isnan(table[:, 0])]
        if self.task == "classification":
            return {"test_acc_workers_mean": float(table[:, 1].mean()), "test_acc_workers_min": float(table[:, 1].min())}
        ppl = np.exp(np.minimum(table[:, 0], 50.0))
        return {"test_ppl_workers_mean": float(ppl.mean()), "test_ppl_workers_max": float(ppl.max())}


class Checkpointer:
    """Per-rank shards ``checkpoints/step_XXXXXXXX/rank{r}.pt`` (atomic), then rank 0 points
    ``checkpoints/last.json`` at the folder and drops older ones (after a barrier)."""

    def __init__(self, run_dir: Path, rank: int, world_size: int, device: torch.device):
        self.dir = Path(run_dir) / "checkpoints"
        self.rank, self.world_size, self.device = rank, world_size, device
        self.is_main = rank == 0

    def exists(self) -> bool:
        return (self.dir / "last.json").exists()

    def save(self, step: int, state: dict, comm) -> None:
        step_dir = self.dir / f"step_{step:08d}"
        step_dir.mkdir(parents=True, exist_ok=True)
        state = {**state, "step": step, "rng": {
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if self.device.type == "cuda" else None,
            "python": random.getstate(),
            "numpy": np.random.get_state(),
        }}
        path = step_dir / f"rank{self.rank}.pt"
        tmp = path.with_suffix(".pt.tmp")
        torch.save(state, tmp)
        os.replace(tmp, path)
        comm.barrier()
        if self.is_main:
            write_atomic(self.dir / "last.json", json.dumps({"step": step, "dir": step_dir.name, "world_size": self.world_size}))
            for old in self.dir.glob("step_*"):
                if old.name != step_dir.name:
                    for f in old.iterdir():
                        f.unlink()
                    old.rmdir()
        comm.barrier()

    def load(self) -> tuple[dict, str]:
        """This rank's shard named by last.json (RNG states restored); returns (state, folder name).

        Raises:
            ValueError: the checkpoint was written by another number of processes.
        """
        meta = json.loads((self.dir / "last.json").read_text())
        if meta["world_size"] != self.world_size:
            raise ValueError(f"checkpoint was written by {meta['world_size']} workers; this run has {self.world_size}")
        state = torch.load(self.dir / meta["dir"] / f"rank{self.rank}.pt", map_location=self.device, weights_only=False)
        rng = state["rng"]
        torch.set_rng_state(rng["torch"])
        if rng["cuda"] is not None:
            torch.cuda.set_rng_state_all(rng["cuda"])
        random.setstate(rng["python"])
        np.random.set_state(rng["numpy"])
        return state, meta["dir"]
