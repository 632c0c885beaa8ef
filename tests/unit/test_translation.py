"""WMT17 (lsgd.data.translation) on small files in the hub's real format: loading, packing
(BOS / EOS / PAD / -100), determinism, sharding across workers, config errors; and the evaluator
counting only real target tokens."""

from __future__ import annotations

import contextlib
import gzip
import itertools
import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F

from lsgd.data import (
    IGNORE_INDEX,
    ShardedLoader,
    build_datasets,
    check_available,
    dataset_info,
    eval_batches,
)
from lsgd.data.translation import SpecialIds, pack_pairs
from lsgd.core.errors import ConfigError
from lsgd.training.evaluator import Evaluator, bleu_from_stats, bleu_stats, loss_fn

EOS, BOS, PAD = 256, 257, 258  # ByteTokenizer: bytes 0..255, EOS 256; BOS and PAD appended


@pytest.fixture(autouse=True)
def _datasets_cache(tmp_path, monkeypatch):
    """Keep the Arrow caches that datasets builds from the test files inside tmp_path."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")


def _pair(split: str, i: int) -> dict:
    de = f"{split} Satz {i}: Grüße aus Köln, " + "schöne Straße " * (i % 4)
    en = f"{split} sentence {i}: greetings from Cologne, " + "nice street " * (i % 3)
    return {"translation": {"de": de, "en": en}}


def write_wmt17(root: Path, n_train=48, n_valid=10, n_test=6, train_files=2, fmt="parquet") -> dict:
    """The hub's wmt/wmt17 de-en layout: de-en/train-0000k-of-0000n.parquet, validation-..., test-...
    (records {"translation": {"de", "en"}}); ``fmt="jsonl.gz"`` writes the same records as
    gzip-compressed JSON lines. Returns the pairs per split in file order."""
    folder = root / "de-en"
    folder.mkdir(parents=True, exist_ok=True)
    pairs = {}
    for split, n, files in (("train", n_train, train_files), ("validation", n_valid, 1), ("test", n_test, 1)):
        rows = [_pair(split, i) for i in range(n)]
        pairs[split] = rows
        for k, part in enumerate(np.array_split(np.arange(n), files)):
            part_rows = [rows[i] for i in part]
            path = folder / f"{split}-{k:05d}-of-{files:05d}.{fmt}"
            if fmt == "parquet":
                pq.write_table(pa.Table.from_pylist(part_rows), path)
            else:
                with gzip.open(path, "wt", encoding="utf-8") as f:
                    f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in part_rows)
    return pairs


def wmt_cfg(root: Path, fmt="parquet", **kw) -> dict:
    return {
        "name": "wmt17",
        "root": str(root),
        "download": False,
        "data_files": {
            "train": f"de-en/train-*.{fmt}",
            "validation": [f"de-en/validation-00000-of-00001.{fmt}"],
            "test": f"de-en/test-*.{fmt}",
        },
        "src_len": 40,
        "tgt_len": 48,
        **kw,
    }


def _bytes(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def expected_row(pair: dict, src_len: int, tgt_len: int, src="de", tgt="en") -> tuple[list[int], list[int]]:
    s = _bytes(pair["translation"][src])[: src_len - 1]
    t = _bytes(pair["translation"][tgt])[: tgt_len - 1]
    x = s + [EOS] + [PAD] * (src_len - len(s) - 1) + [BOS] + t + [PAD] * (tgt_len - len(t) - 1)
    y = t + [EOS] + [IGNORE_INDEX] * (tgt_len - len(t) - 1)
    return x, y


# ------------------------------------------------------------------ packing
def test_pack_pairs_bos_eos_padding_and_truncation():
    ids = SpecialIds(eos=2, bos=10, pad=11, vocab_size=12)
    src = [np.array([5, 6, 7]), np.array([3, 3, 3, 3, 3, 3])]
    tgt = [np.array([8]), np.array([], dtype=np.int64)]
    x, y = pack_pairs(src, tgt, src_len=5, tgt_len=3, ids=ids)
    assert x.dtype == y.dtype == torch.int64
    assert x.tolist() == [[5, 6, 7, 2, 11, 10, 8, 11], [3, 3, 3, 3, 2, 10, 11, 11]]  # 2nd source truncated, EOS kept
    assert y.tolist() == [[8, 2, -100], [2, -100, -100]]  # an empty target predicts EOS only


# ------------------------------------------------------------------ loading
def test_wmt17_parquet_info_shapes_and_packing(tmp_path):
    pairs = write_wmt17(tmp_path)
    cfg = wmt_cfg(tmp_path)
    check_available(cfg)
    info = dataset_info(cfg)
    assert (info.task, info.input_shape, info.num_classes, info.num_train) == ("translation", (88,), 259, None)
    assert (info.src_len, info.pad_id) == (40, PAD)
    train, test = build_datasets(cfg, seed=0)
    assert (len(train), len(test)) == (48, 10)
    assert train.pairs([0, 47]) == [(p["translation"]["de"], p["translation"]["en"]) for p in (pairs["train"][0], pairs["train"][47])]

    # every pair packed as the module docstring says: sources of 33..75 bytes and targets of 42..67,
    # so both truncated (EOS last) and padded ones (PAD in x, -100 in y)
    x, y = train.batch(torch.arange(48))
    assert x.shape == (48, 88) and y.shape == (48, 48) and x.dtype == y.dtype == torch.int64
    for i in range(48):
        ex, ey = expected_row(pairs["train"][i], 40, 48)
        assert x[i].tolist() == ex and y[i].tolist() == ey, i
    assert (x[:, 39] == EOS).any() and (x[:, 39] == PAD).any() and (x[:, 40] == BOS).all()
    assert (y == IGNORE_INDEX).any() and (y[:, -1] == EOS).any()
    # teacher forcing: the decoder input is BOS + the targets shifted by one (up to the final EOS)
    tokens = (y[:, :-1] != IGNORE_INDEX) & (y[:, :-1] != EOS)
    assert torch.equal(x[:, 41:][tokens], y[:, :-1][tokens])
    assert int(x.max()) < info.num_classes and int(y.max()) < info.num_classes

    # the training loader yields those packed rows for its shard's pairs, 4 per step
    loader = ShardedLoader(train, cfg, 0, 2, 4, seed=0)
    assert loader.steps_per_epoch == 48 // 8
    batches = list(loader.batches(0))
    assert len(batches) == 6
    idx = loader.indices(0).view(6, 4)
    for (bx, by), rows in zip(batches, idx):
        assert torch.equal(bx, x[rows]) and torch.equal(by, y[rows])


def test_wmt17_direction_and_eval_split(tmp_path):
    pairs = write_wmt17(tmp_path)
    cfg = wmt_cfg(tmp_path, src_lang="en", tgt_lang="de", src_len=64, tgt_len=80, eval_split="test", eval_samples=4)
    _, test = build_datasets(cfg, seed=0)
    assert len(test) == 4
    x, y = test.batch(torch.arange(4))
    for row in range(4):
        ex, ey = expected_row(pairs["test"][row], 64, 80, src="en", tgt="de")
        assert x[row].tolist() == ex and y[row].tolist() == ey
    assert (y == IGNORE_INDEX).any()  # short targets are padded with -100


def test_wmt17_jsonl_gz_loads_the_same_batches_as_parquet(tmp_path):
    write_wmt17(tmp_path / "pq")
    write_wmt17(tmp_path / "js", fmt="jsonl.gz")
    train_pq, test_pq = build_datasets(wmt_cfg(tmp_path / "pq"), seed=0)
    train_js, test_js = build_datasets(wmt_cfg(tmp_path / "js", fmt="jsonl.gz"), seed=0)
    idx = torch.tensor([5, 0, 47, 12])
    for a, b in ((train_pq.batch(idx), train_js.batch(idx)), (test_pq.batch(idx[:2]), test_js.batch(idx[:2]))):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_wmt17_deterministic_resumable_and_reshuffled(tmp_path):
    write_wmt17(tmp_path)
    cfg = wmt_cfg(tmp_path)
    a = list(ShardedLoader(build_datasets(cfg, seed=3)[0], cfg, 1, 2, 4, seed=3).batches(0))
    loader = ShardedLoader(build_datasets(cfg, seed=3)[0], cfg, 1, 2, 4, seed=3)  # another process, same seed
    b = list(loader.batches(0))
    assert all(torch.equal(p[0], q[0]) and torch.equal(p[1], q[1]) for p, q in zip(a, b))
    tail = list(loader.batches(0, start=4))
    assert all(torch.equal(p[0], q[0]) and torch.equal(p[1], q[1]) for p, q in zip(tail, b[4:])) and len(tail) == 2
    assert not torch.equal(next(loader.batches(1))[0], b[0][0])  # the next epoch is another permutation


def test_wmt17_shards_are_disjoint_and_cover_the_epoch(tmp_path):
    write_wmt17(tmp_path)
    cfg = wmt_cfg(tmp_path)
    train, test = build_datasets(cfg, seed=0)
    shards = [ShardedLoader(train, cfg, r, 3, 4, seed=0).indices(0) for r in range(3)]
    assert sorted(torch.cat(shards).tolist()) == list(range(48))  # 48 = 3 workers x 4 steps x 4 pairs
    # evaluation: each rank packs its contiguous slice; together the whole test split in order
    full_x, full_y = test.batch(torch.arange(len(test)))
    parts = [b for r in range(3) for b in eval_batches(test, r, 3, 2)]
    assert torch.equal(torch.cat([x for x, _ in parts]), full_x) and torch.equal(torch.cat([y for _, y in parts]), full_y)
    # more ranks than test pairs: the ranks with an empty slice get no (empty) batch
    per_rank = [list(eval_batches(test, r, 16, 4)) for r in range(16)]
    assert sum(len(b) == 0 for b in per_rank) == 6 and all(len(x) == 1 for b in per_rank for x, _ in b)


# ------------------------------------------------------------------ config errors
@pytest.mark.parametrize(
    "override, words",
    [
        ({"partition": "dirichlet"}, ["dataset.partition", "iid"]),
        ({"src_lang": "en"}, ["dataset.src_lang", "dataset.tgt_lang", "differ"]),
        ({"src_len": 1}, ["dataset.src_len", ">= 2"]),
        ({"eval_split": "dev"}, ["dataset.eval_split", "validation, test"]),
        ({"eval_samples": 0}, ["dataset.eval_samples"]),
        ({"data_files": {"train": "x.parquet"}}, ["dataset.data_files", "validation"]),
        ({"src_len_": 3}, ["dataset.src_len_", "src_len"]),
    ],
)
def test_wmt17_invalid_keys_name_the_key(tmp_path, override, words):
    with pytest.raises(ConfigError) as e:
        check_available({**wmt_cfg(tmp_path), **override})
    for w in words:
        assert w in str(e.value)


def test_wmt17_files_and_hub_errors(tmp_path):
    with pytest.raises(ConfigError, match="dataset.data_files.train"):
        check_available(wmt_cfg(tmp_path))  # no files yet
    write_wmt17(tmp_path)
    (tmp_path / "de-en" / "train-extra.csv").write_text("de,en\n")
    with pytest.raises(ConfigError, match=r"dataset.data_files.train must be all parquet"):
        check_available(wmt_cfg(tmp_path, data_files={"train": "de-en/train-*", "validation": "de-en/validation-*"}))
    with pytest.raises(ConfigError, match="dataset.download"):
        check_available({"name": "wmt17", "download": False})
    with pytest.raises(ConfigError, match="allowed: de, en"):
        check_available({"name": "wmt17", "src_lang": "fr"})
    with pytest.raises(ConfigError, match=r"dataset.tgt_lang='fr' is not a language of dataset.data_files.train; allowed: de, en"):
        build_datasets(wmt_cfg(tmp_path, tgt_lang="fr"), seed=0)  # the languages the files hold


# ------------------------------------------------------------------ evaluation counts real tokens only
class _Algo:
    models_in_sync = True
    consensus_distance = None

    def eval_context(self):
        return contextlib.nullcontext()


class _Comm:
    def all_reduce(self, buf, count=True):
        return buf


class _Unigram(torch.nn.Module):
    """Logits that depend only on a learned bias: (B, tgt_len, vocab)."""

    def __init__(self, vocab: int, tgt_len: int):
        super().__init__()
        self.tgt_len = tgt_len
        self.bias = torch.nn.Parameter(torch.randn(vocab, generator=torch.Generator().manual_seed(0)))

    def forward(self, x):
        return self.bias.expand(x.shape[0], self.tgt_len, -1)


def test_evaluator_averages_over_real_target_tokens(tmp_path):
    write_wmt17(tmp_path)
    _, test = build_datasets(wmt_cfg(tmp_path, src_len=16, tgt_len=64), seed=0)
    model = _Unigram(259, 64)
    x, y = test.batch(torch.arange(len(test)))
    real = y != IGNORE_INDEX
    assert 0 < real.sum() < y.numel()  # padding present
    logp = F.log_softmax(model.bias.detach(), -1)
    expected = -logp[y[real]].mean().item()
    assert loss_fn(model(x), y).item() == pytest.approx(expected, rel=1e-6)  # the training loss too

    ev = Evaluator(test, "translation", batch_size=3, device=torch.device("cpu"))
    loss_sum, _, count = ev._sums(model, 0, 1)
    assert count == int(real.sum()) and loss_sum / count == pytest.approx(expected, rel=1e-6)
    out = ev.evaluate(model, _Algo(), _Comm(), 0, 1)
    assert out["test_loss"] == pytest.approx(expected, rel=1e-6)
    assert out["test_ppl"] == pytest.approx(math.exp(expected), rel=1e-6)
    assert "test_acc" not in out


# ------------------------------------------------------------------ label smoothing (training loss only)
def test_label_smoothing_matches_the_closed_form_and_ignores_padding():
    """(1 - eps) * NLL + eps * mean over the C classes of -log p, averaged over the real targets;
    a -100 target adds nothing whatever its logits; eps = 0 is plain cross-entropy, bit for bit."""
    eps = 0.1
    logits = torch.tensor([[[2.0, -1.0, 0.5, 0.0], [0.3, 0.3, -2.0, 1.5], [9.0, -9.0, 4.0, 1.0]]], dtype=torch.float64)
    y = torch.tensor([[2, 0, IGNORE_INDEX]])
    logp = torch.log_softmax(logits[0, :2], -1).tolist()  # the two real targets
    by_hand = [(1 - eps) * -lp[t] + eps * sum(-v for v in lp) / 4 for lp, t in zip(logp, (2, 0))]
    assert loss_fn(logits, y, label_smoothing=eps).item() == pytest.approx(sum(by_hand) / 2, rel=1e-12)
    assert loss_fn(logits, y, reduction="sum", label_smoothing=eps).item() == pytest.approx(sum(by_hand), rel=1e-12)
    assert by_hand[0] != pytest.approx(-logp[0][2])  # smoothing moves the loss
    other = logits.clone()
    other[0, 2] = torch.tensor([-50.0, 50.0, 0.0, 3.0])  # the ignored position's logits do not matter
    assert loss_fn(other, y, label_smoothing=eps).item() == loss_fn(logits, y, label_smoothing=eps).item()
    assert torch.equal(loss_fn(logits, y, label_smoothing=0.0), loss_fn(logits, y))
    # classification logits (B, C): the same closed form per sample
    lp = torch.log_softmax(logits[0], -1)
    labels = torch.tensor([1, 3, 0])
    expected = ((1 - eps) * -lp[torch.arange(3), labels] + eps * -lp.mean(-1)).mean()
    assert loss_fn(logits[0], labels, label_smoothing=eps).item() == pytest.approx(expected.item(), rel=1e-12)


def test_trainer_smooths_the_training_loss_and_not_the_test_loss(tmp_path):
    """A real Trainer (one process) on the WMT17 files: ``label_smoothing`` reaches its training
    loss (``Trainer.loss_fn``), while the evaluator's ``test_loss`` stays plain cross-entropy."""
    from lsgd.training.trainer import Trainer

    write_wmt17(tmp_path / "wmt")
    cfg = _mt_run_cfg(tmp_path, ["label_smoothing=0.1"])
    trainer = Trainer(cfg, tmp_path / "run")
    x, y = next(iter(trainer.loader.batches(0, 0)))
    with torch.no_grad():
        out = trainer.model(x)
    assert trainer.loss_fn(out, y).item() == pytest.approx(loss_fn(out, y, label_smoothing=0.1).item(), rel=1e-12)
    assert trainer.loss_fn(out, y).item() != pytest.approx(loss_fn(out, y).item(), rel=1e-6)
    ev = trainer.evaluator
    loss_sum, _, _ = ev._sums(trainer.model.eval(), 0, 1)
    batches = list(eval_batches(trainer.test_set, 0, 1, 4))  # eval_batch_size=4
    plain = sum(loss_fn(trainer.model(bx), by, reduction="sum").item() for bx, by in batches)
    smoothed = sum(loss_fn(trainer.model(bx), by, reduction="sum", label_smoothing=0.1).item() for bx, by in batches)
    assert loss_sum == plain and smoothed != pytest.approx(plain, rel=1e-3)


def _mt_run_cfg(tmp_path: Path, overrides: list[str]) -> dict:
    """A composed (and validated) one-process run config on the files of :func:`write_wmt17`."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from lsgd.cli import _register_resolvers
    from lsgd.config.validation import validate

    _register_resolvers()
    with initialize_config_module(config_module="lsgd.conf", version_base="1.3"):
        cfg = compose("config", overrides=[
            "dataset=wmt17", "model=transformer_mt", "algo=ddp", "device=cpu", "launcher.nproc_per_node=1",
            f"dataset.root={tmp_path / 'wmt'}", "dataset.download=false",
            "dataset.data_files={train: de-en/train-*.parquet, validation: de-en/validation-*.parquet}",
            "dataset.src_len=40", "dataset.tgt_len=48", "batch_size=8", "eval_batch_size=4", "epochs=1",
            f"results_dir={tmp_path}", *overrides,
        ])
    cfg = OmegaConf.to_container(cfg, resolve=True)
    validate(cfg)
    cfg["run_id"], cfg["resume"] = "run", False
    (tmp_path / "run").mkdir(exist_ok=True)
    return cfg


# ------------------------------------------------------------------ BLEU
REFS = [
    "the cat sat on the mat and looked at the dog",
    "a house by the river, with a garden full of trees",
    "Grüße aus Köln: die Straße ist schön",
    "he reads the book every evening before dinner",
    "it rained all day, so we stayed inside",
]


def test_bleu_of_references_against_themselves_is_100_and_statistics_add_up():
    """sacreBLEU corpus BLEU: a corpus against itself scores 100; statistics summed over any split
    of the corpus (the ranks' slices) give exactly sacrebleu.corpus_bleu of the whole."""
    import sacrebleu

    assert bleu_from_stats(bleu_stats(REFS, REFS)) == pytest.approx(100.0, abs=1e-9)
    hyps = ["the cat sat on a mat and looked at a dog", "a house near the river", REFS[2], "", "it rained all day"]
    whole = sacrebleu.corpus_bleu(hyps, [REFS]).score
    assert 0 < whole < 100
    for cuts in ([0, 5], [0, 2, 5], [0, 1, 1, 4, 5]):  # an empty slice included
        parts = [bleu_stats(hyps[a:b], REFS[a:b]) for a, b in itertools.pairwise(cuts)]
        assert bleu_from_stats(sum(parts)) == pytest.approx(whole, abs=1e-9)
    assert bleu_from_stats(bleu_stats([], [])) == 0.0
    assert bleu_from_stats(bleu_stats([""] * 5, REFS)) == 0.0
    with pytest.raises(ValueError):
        bleu_stats(hyps[:2], REFS)


def test_detokenize_inverts_the_packing_of_targets(tmp_path):
    """The decoded form of a packed target (y up to EOS) through the loader's tokenizer is the
    stored target text (when not truncated); BOS, PAD and anything after EOS are left out."""
    pairs = write_wmt17(tmp_path)
    _, test = build_datasets(wmt_cfg(tmp_path, src_len=16, tgt_len=80), seed=0)
    _, y = test.batch(torch.arange(len(test)))
    refs = test.references(range(len(test)))
    assert refs == [p["translation"]["en"] for p in pairs["validation"]]
    for row, ref in zip(y.tolist(), refs):
        assert test.detokenize(row) == ref  # y = target + EOS, then -100
        assert test.detokenize([BOS, *_bytes(ref), PAD, EOS, *_bytes("junk")]) == ref


class _Oracle(_Unigram):
    """Translation by lookup: ``greedy_decode`` returns the byte tokens + EOS of the stored target
    of each source (the ``wrong`` pairs get another pair's target); the forward pass (test loss)
    is :class:`_Unigram`'s."""

    def __init__(self, test, src_len: int, wrong: frozenset = frozenset()):
        super().__init__(259, 80)
        self.src_len, self.calls = src_len, []
        n = len(test)
        texts = test.pairs(range(n))
        self.table = {}
        for i, (src, _) in enumerate(texts):
            key = tuple(_bytes(src)[: src_len - 1])
            self.table[key] = texts[(i + 1) % n][1] if i in wrong else texts[i][1]

    def greedy_decode(self, src, bos_id, eos_id):
        self.calls.append(len(src))
        rows = []
        for row in src.tolist():
            key = tuple(row[: row.index(eos_id)])
            rows.append(_bytes(self.table[key]) + [eos_id])
        width = max(map(len, rows))
        return torch.tensor([r + [PAD] * (width - len(r)) for r in rows])


def test_evaluator_bleu_is_that_of_the_first_pairs_split_across_ranks(tmp_path):
    """test_bleu through the Evaluator: an oracle that returns every reference scores 100; one that
    is wrong on pairs 1 and 3 scores sacrebleu.corpus_bleu of exactly those hypotheses; pairs past
    bleu_samples are never decoded (an oracle wrong only there still scores 100); the statistics of
    3 ranks' slices sum to the one-rank result."""
    import sacrebleu

    write_wmt17(tmp_path)
    _, test = build_datasets(wmt_cfg(tmp_path, src_len=40, tgt_len=80), seed=0)  # 10 validation pairs
    refs = test.references(range(10))
    ev = Evaluator(test, "translation", batch_size=3, device=torch.device("cpu"), bleu_samples=6)

    perfect = _Oracle(test, 40)
    out = ev.evaluate(perfect, _Algo(), _Comm(), 0, 1)
    assert out["test_bleu"] == pytest.approx(100.0, abs=1e-9) and sum(perfect.calls) == 6 and max(perfect.calls) <= 3
    assert out["test_loss"] > 0 and "test_ppl" in out  # the other metrics are still there
    assert ev.evaluate(_Oracle(test, 40, wrong=frozenset({6, 7, 9})), _Algo(), _Comm(), 0, 1)["test_bleu"] == pytest.approx(100.0, abs=1e-9)

    wrong = _Oracle(test, 40, wrong=frozenset({1, 3}))
    hyps = [refs[(i + 1) % 10] if i in (1, 3) else refs[i] for i in range(6)]
    expected = sacrebleu.corpus_bleu(hyps, [refs[:6]]).score
    assert 0 < expected < 100
    assert ev.evaluate(wrong, _Algo(), _Comm(), 0, 1)["test_bleu"] == pytest.approx(expected, abs=1e-9)
    parts = [ev._bleu_stats(wrong, r, 3) for r in range(3)]  # pairs 0-1, 2-3, 4-5
    assert all(p[9] > 0 for p in parts) and np.array_equal(sum(parts), ev._bleu_stats(wrong, 0, 1))
    assert bleu_from_stats(sum(parts)) == pytest.approx(expected, abs=1e-9)

    assert "test_bleu" not in Evaluator(test, "translation", 3, torch.device("cpu"), bleu_samples=0).evaluate(
        perfect, _Algo(), _Comm(), 0, 1)
    assert Evaluator(test, "classification", 3, torch.device("cpu"), bleu_samples=6).bleu_samples == 0


def test_evaluator_bleu_of_real_transformers(tmp_path):
    """The untrained transformer_mt decodes greedily and scores a number in [0, 100]; one whose
    every argmax is EOS translates everything to the empty string and scores 0."""
    from lsgd.models import build_model

    write_wmt17(tmp_path)
    cfg = wmt_cfg(tmp_path, src_len=40, tgt_len=48)
    _, test = build_datasets(cfg, seed=0)
    torch.manual_seed(0)
    model = build_model({"name": "transformer_mt", "share_embeddings": False}, dataset_info(cfg))
    ev = Evaluator(test, "translation", batch_size=4, device=torch.device("cpu"), bleu_samples=5)
    out = ev.evaluate(model, _Algo(), _Comm(), 0, 1)
    assert isinstance(out["test_bleu"], float) and 0.0 <= out["test_bleu"] <= 100.0
    assert model.training  # evaluate restores the mode it found
    with torch.no_grad():  # the decoder's final LayerNorm outputs e; only EOS's output row is e
        norm = model.transformer.decoder.norm
        norm.weight.zero_()
        norm.bias.copy_(torch.linspace(-1.0, 1.0, norm.bias.numel()))
        model.out.weight.zero_()
        model.out.weight[EOS] = norm.bias
    assert ev.evaluate(model, _Algo(), _Comm(), 0, 1)["test_bleu"] == 0.0


def test_wmt17_with_a_hugging_face_tokenizer_folder(tmp_path):
    """dataset.tokenizer = a local Hugging Face tokenizer (here a word-level one built with the
    tokenizers library): its EOS ends sequences, BOS and PAD come after its vocabulary."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    pairs = write_wmt17(tmp_path)
    words = sorted({w for split in pairs.values() for p in split for t in p["translation"].values() for w in t.split()})
    vocab = {"[UNK]": 0, "</s>": 1, **{w: i + 2 for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="</s>").save_pretrained(tmp_path / "tok")

    cfg = wmt_cfg(tmp_path, tokenizer=str(tmp_path / "tok"), src_len=8, tgt_len=12)
    v = len(vocab)
    info = dataset_info(cfg)
    assert (info.num_classes, info.pad_id) == (v + 2, v + 1)
    train, _ = build_datasets(cfg, seed=0)
    x, y = train.batch(torch.tensor([1]))
    de = [vocab[w] for w in pairs["train"][1]["translation"]["de"].split()]
    en = [vocab[w] for w in pairs["train"][1]["translation"]["en"].split()]
    assert x[0].tolist() == de[:7] + [1] + [v] + en + [v + 1] * (11 - len(en))
    assert y[0].tolist() == en + [1] + [IGNORE_INDEX] * (11 - len(en))
