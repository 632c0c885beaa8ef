"""The trainer's evaluator: test loss / accuracy / perplexity (translation: also BLEU of greedy
decodes) of the model the algorithm exposes for evaluation (the average model when replicas differ,
with the consensus distance), and the loss both training and evaluation compute (:func:`loss_fn`).

The test set is split across all ranks and the sums reduced; every collective here is uncounted
(measurement, not training) and every rank reaches it at the same point of the run (the
algorithm's :meth:`~lsgd.algorithms.base.Algorithm.progress`), so ranks with different roles never
deadlock in bookkeeping.
"""

from __future__ import annotations

import contextlib
import math

import numpy as np
import torch
import torch.nn.functional as F

from lsgd.data import IGNORE_INDEX, eval_batches


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
