"""The real trainer on 2 gloo workers trains model=gpt (tiny) on dataset=text read from tiny
plain-text files, with the BPE tokenizer trained by the workers themselves (no `prepare`: the
first rank trains under the lock, the other loads its file): the training loss falls and the test
perplexity is finite and falls."""

from __future__ import annotations

import math
from pathlib import Path

from gloo import run_gloo
from trainer_runs import _train, compose_cfg, records

NAMES = ["Elinor", "Marianne", "Edward", "Willoughby", "Brandon", "Fanny", "Lucy", "Margaret"]
VERBS = ["walked to", "wrote to", "thought of", "spoke with", "waited for", "smiled at"]


def _write(folder: Path) -> None:
    """Three 'novels' of 60 short paragraphs (blank-line separated) built from a small grammar."""
    folder.mkdir(parents=True)
    for f in range(3):
        paras = []
        for j in range(60):
            i = f * 60 + j
            a, b = NAMES[i % 8], NAMES[(3 * i + 1) % 8]
            paras.append(f"{a} {VERBS[i % 6]} {b} in the morning.\n{b} {VERBS[(i + 2) % 6]} {a} at night.")
        (folder / f"novel{f}.txt").write_text("\n\n".join(paras) + "\n")


def test_gpt_trains_on_plain_text_files(tmp_path):
    _write(tmp_path / "data" / "books")
    cfg = compose_cfg([
        "debug=default", "dataset=text", "model=gpt", "model.size=tiny", "algo=diloco", "algo.local_steps=4",
        f"dataset.root={tmp_path / 'data'}", "dataset.files=books/*.txt", "dataset.download=false",
        "dataset.vocab_size=512", "dataset.seq_len=32", "dataset.val_fraction=0.1", "dataset.test_fraction=0.1",
        "optim.lr=3e-3", "optim.weight_decay=0", "schedule=constant",
        "batch_size=8", "epochs=10", "max_steps=40", "log_every=4", "eval_unit=step", "eval_every=20",
        "checkpoint_every=0", "launcher.nproc_per_node=2", f"results_dir={tmp_path}",
    ])
    cfg["run_id"], cfg["resume"] = "run", False
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    run_gloo(_train, 2, cfg, str(run_dir))

    tokenizers = sorted(p.name for p in (tmp_path / "data" / "tokenizers").iterdir() if not p.name.endswith(".lock"))
    assert len(tokenizers) == 1 and tokenizers[0].startswith("bpe512-")  # one file, no temporaries left
    recs = [r for r in records(run_dir) if "kind" not in r]
    losses = [r["train_loss"] for r in recs]
    assert len(losses) == 10 and all(math.isfinite(v) for v in losses)
    assert losses[0] > 4.0 and losses[-1] < 0.5 * losses[0]  # ln(512) = 6.2 at the start
    evals = [r for r in recs if "test_loss" in r]
    assert [r["step"] for r in evals] == [20, 40]
    assert all(math.isfinite(r["test_ppl"]) and r["test_ppl"] == math.exp(r["test_loss"]) for r in evals)
    assert evals[1]["test_ppl"] < evals[0]["test_ppl"] < 512
    assert recs[-1]["samples"] == 40 * 8 * 2
