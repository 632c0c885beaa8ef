"""The real trainer on 2 gloo workers trains model=transformer_mt on dataset=wmt17 read from tiny
files in the hub's parquet layout: the training loss falls, test loss / perplexity are finite and
fall, test_bleu (greedy decodes, summed over both ranks) is in [0, 100] and reaches summary.json,
and both workers' shards feed the run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from gloo import run_gloo
from trainer_runs import _train, compose_cfg, records

WORDS = [("Haus", "house"), ("Katze", "cat"), ("Hund", "dog"), ("Baum", "tree"), ("Stadt", "city"),
         ("Wasser", "water"), ("Buch", "book"), ("Tisch", "table")]


def _pairs(n: int, offset: int) -> list[dict]:
    rows = []
    for i in range(offset, offset + n):
        (de1, en1), (de2, en2) = WORDS[i % 8], WORDS[(3 * i + 1) % 8]
        rows.append({"translation": {"de": f"das {de1} und das {de2}", "en": f"the {en1} and the {en2}"}})
    return rows


def _write(root: Path) -> None:
    """de-en/train-0000k-of-00002.parquet, validation-00000-of-00001.parquet (the hub's names)."""
    folder = root / "de-en"
    folder.mkdir(parents=True)
    train = _pairs(128, 0)
    pq.write_table(pa.Table.from_pylist(train[:64]), folder / "train-00000-of-00002.parquet")
    pq.write_table(pa.Table.from_pylist(train[64:]), folder / "train-00001-of-00002.parquet")
    pq.write_table(pa.Table.from_pylist(_pairs(16, 1000)), folder / "validation-00000-of-00001.parquet")


def test_transformer_mt_trains_on_wmt17_files(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))  # the spawned workers' datasets cache
    _write(tmp_path / "wmt")
    cfg = compose_cfg([
        "debug=default", "dataset=wmt17", "model=transformer_mt", "algo=swarm_sgd",
        f"dataset.root={tmp_path / 'wmt'}", "dataset.download=false",
        "dataset.data_files={train: de-en/train-*.parquet, validation: de-en/validation-*.parquet}",
        "dataset.src_len=32", "dataset.tgt_len=32",
        "optim=adamw", "optim.lr=3e-3", "optim.weight_decay=0", "schedule=constant",
        "batch_size=8", "epochs=10", "max_steps=48", "log_every=4", "eval_unit=step", "eval_every=24",
        "checkpoint_every=0", "launcher.nproc_per_node=2", f"results_dir={tmp_path}",
    ])
    cfg["run_id"], cfg["resume"] = "run", False
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    run_gloo(_train, 2, cfg, str(run_dir))

    recs = [r for r in records(run_dir) if "kind" not in r]
    losses = [r["train_loss"] for r in recs]
    assert len(losses) == 12 and all(math.isfinite(v) for v in losses)
    assert losses[0] > 3.0 and losses[-1] < 0.6 * losses[0]  # ln(259) = 5.56 at the start
    assert sum(losses[-3:]) < sum(losses[:3])
    evals = [r for r in recs if "test_loss" in r]
    assert [r["step"] for r in evals] == [24, 48]
    assert all(math.isfinite(r["test_loss"]) and r["test_ppl"] == math.exp(r["test_loss"]) for r in evals)
    assert evals[1]["test_loss"] < evals[0]["test_loss"]
    assert all(isinstance(r["test_bleu"], float) and 0.0 <= r["test_bleu"] <= 100.0 for r in evals)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["final_test_bleu"] == evals[-1]["test_bleu"]
    assert summary["best_test_bleu"] == max(r["test_bleu"] for r in evals)
    assert recs[-1]["samples"] == 48 * 8 * 2  # 2 workers x 8 pairs per step: 6 epochs of 128 pairs


def test_transformer_mt_learns_the_toy_translation_to_high_bleu(tmp_path, monkeypatch):
    """Trained with label smoothing 0.1 for 96 steps on the word-for-word toy pairs, the average
    model's greedy decodes of the 16 held-out pairs score test_bleu >= 50, and the smoothed
    training loss stays above the plain test loss (its floor is eps x the cross-entropy against
    uniform)."""
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))
    _write(tmp_path / "wmt")
    cfg = compose_cfg([
        "debug=default", "dataset=wmt17", "model=transformer_mt", "algo=swarm_sgd",
        f"dataset.root={tmp_path / 'wmt'}", "dataset.download=false",
        "dataset.data_files={train: de-en/train-*.parquet, validation: de-en/validation-*.parquet}",
        "dataset.src_len=32", "dataset.tgt_len=32", "label_smoothing=0.1",
        "optim=adamw", "optim.lr=3e-3", "optim.weight_decay=0", "schedule=constant",
        "batch_size=8", "epochs=20", "max_steps=96", "log_every=48", "eval_unit=step", "eval_every=96",
        "checkpoint_every=0", "launcher.nproc_per_node=2", f"results_dir={tmp_path}",
    ])
    cfg["run_id"], cfg["resume"] = "run", False
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    run_gloo(_train, 2, cfg, str(run_dir))

    evals = [r for r in records(run_dir) if "test_bleu" in r]
    assert [r["step"] for r in evals] == [96]
    assert evals[0]["test_bleu"] >= 50.0
    assert evals[0]["train_loss"] > evals[0]["test_loss"]
