"""dataset=text (lsgd.data.plaintext) on tiny files written here: documents, the split, the BPE
tokenizer and its cache, the block sets, config errors, and fetching the default corpus through
a fake Debian package (tests/unit/test_austen.py builds it)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lsgd.data import (
    ShardedLoader,
    austen,
    build_datasets,
    check_available,
    dataset_info,
    eval_batches,
    plaintext,
    prepare,
)
from lsgd.core.errors import ConfigError

WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "her", "sister", "reads",
         "letters", "by", "the", "window", "and", "everyone", "agrees", "that", "it", "was", "a", "truth",
         "universally", "acknowledged"]


def _paragraph(i: int) -> str:
    """A deterministic two-line ASCII paragraph, different for every i."""
    w = [WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(12)]
    return f"Paragraph {i}: {' '.join(w[:6])},\n{' '.join(w[6:])}; said Mr. No{i}."


def _write_corpus(folder: Path, files: int = 3, paragraphs: int = 20, offset: int = 0) -> list[str]:
    """``files`` text files of ``paragraphs`` paragraphs each, separated by blank lines of varying
    form (empty, spaces, several); returns every paragraph in corpus order."""
    folder.mkdir(parents=True, exist_ok=True)
    seps = ["\n\n", "\n  \n", "\n\n\n", "\n\t\n\n"]
    out = []
    for f in range(files):
        paras = [_paragraph(offset + f * paragraphs + j) for j in range(paragraphs)]
        text = "\n" + "".join(p + seps[j % 4] for j, p in enumerate(paras))
        (folder / f"book{f}.txt").write_text(text, encoding="utf-8")
        out += paras
    return out


def _cfg(root: Path, **kw) -> dict:
    return {"name": "text", "root": str(root), "files": "corpus/*.txt", "download": False,
            "val_fraction": 0.1, "test_fraction": 0.1, "vocab_size": 300, "seq_len": 16, **kw}


def _resolved(root: Path, **kw) -> dict:
    from lsgd.data.catalog import resolve

    return resolve(_cfg(root, **kw))


# ------------------------------------------------------------------ documents and the split
def test_paragraphs_and_files_as_documents():
    text = "\r\nFirst line\r\nsecond line\r\n\r\n \t \n\n\nOnly one\n\n   \n"
    assert plaintext.documents_of(text, "paragraph") == ["First line\nsecond line", "Only one"]
    assert plaintext.documents_of(text, "file") == ["First line\nsecond line\n\n \t \n\n\nOnly one\n\n   "]
    assert plaintext.documents_of("\n \n\n", "file") == []


def test_split_is_deterministic_disjoint_and_complete(tmp_path):
    docs = _write_corpus(tmp_path / "corpus", files=3, paragraphs=40)
    read = plaintext.read_documents(plaintext.corpus_files(_resolved(tmp_path)), "paragraph")
    assert read == docs  # files sorted by path, paragraphs in file order

    split = plaintext.split_documents(docs, 0.1, 0.2, seed=0)
    assert split == plaintext.split_documents(list(docs), 0.1, 0.2, seed=0)
    assert [len(split[s]) for s in ("train", "validation", "test")] == [84, 12, 24]
    assert sorted(split["train"] + split["validation"] + split["test"]) == list(range(120))
    assert all(split[s] == sorted(split[s]) for s in split)  # corpus order inside a split

    other = plaintext.split_documents(docs, 0.1, 0.2, seed=1)
    assert other["validation"] != split["validation"]
    # a document's place depends on its own text: appending documents moves few of the old ones
    grown = plaintext.split_documents(docs + [_paragraph(10_000 + i) for i in range(12)], 0.1, 0.2, seed=0)
    moved = set(split["train"]) ^ {i for i in grown["train"] if i < 120}
    assert len(moved) <= 6

    by_file = plaintext.read_documents(plaintext.corpus_files(_resolved(tmp_path)), "file")
    assert len(by_file) == 3
    assert {len(v) for v in plaintext.split_documents(by_file, 0.34, 0.34, 0).values()} == {1}


def test_build_datasets_packs_each_split(tmp_path):
    docs = _write_corpus(tmp_path / "corpus")
    cfg = _cfg(tmp_path, tokenizer="byte", eval_split="validation")
    check_available(cfg)
    info = dataset_info(cfg)
    assert (info.task, info.input_shape, info.num_classes, info.num_train) == ("lm", (16,), 257, None)
    train, test = build_datasets(cfg, seed=0)
    assert train.blocks.shape[1] == test.blocks.shape[1] == 17

    split = plaintext.split_documents(docs, 0.1, 0.1, 0)
    for ds, name in ((train, "train"), (test, "validation")):
        # the blocks are the split's documents in corpus order, each followed by eos, tail dropped
        stream = b"".join(d.encode() + b"\x00" for d in (docs[i] for i in split[name]))
        ids = ds.blocks.flatten()
        got = bytes(0 if int(t) == 256 else int(t) for t in ids)
        assert got == stream[: len(ids)] and len(stream) - len(ids) < 17

    loader = ShardedLoader(train, cfg, 1, 2, 4, seed=0)
    x, y = next(loader.batches(0))
    assert x.shape == y.shape == (4, 16) and torch.equal(x[:, 1:], y[:, :-1])
    evals = torch.cat([x for r in range(2) for x, _ in eval_batches(test, r, 2, 4)])
    assert torch.equal(evals, test.blocks[:, :-1])

    few = build_datasets({**cfg, "eval_sequences": 2}, seed=0)[1]
    assert torch.equal(few.blocks, test.blocks[:2])


# ------------------------------------------------------------------ the BPE tokenizer
def test_bpe_round_trips_is_cached_and_retrains_on_a_new_corpus(tmp_path, monkeypatch):
    docs = _write_corpus(tmp_path / "corpus")
    cfg = _resolved(tmp_path, vocab_size=320)
    calls = []
    real = plaintext.train_bpe
    monkeypatch.setattr(plaintext, "train_bpe", lambda d, v: calls.append(len(d)) or real(d, v))

    prepare(cfg)  # trains once, in the main process
    assert len(calls) == 1
    (path,) = sorted((tmp_path / "tokenizers").glob("bpe*.json"))
    assert path.name.startswith("bpe320-")
    mtime = path.stat().st_mtime_ns

    train, _ = build_datasets(cfg, seed=0)  # loads the cached file: no retraining
    assert len(calls) == 1 and path.stat().st_mtime_ns == mtime
    tok = plaintext.get_tokenizer(cfg, plaintext.corpus_splits(cfg)["train"])
    assert tok.path == path and tok.vocab_size == 320 and tok.tok.get_vocab_size() <= 320
    assert dataset_info(cfg).num_classes == 320
    assert int(train.blocks.max()) < 320 and (train.blocks == tok.eos_id).any()

    for text in ["It is a truth universally acknowledged,\n  that  a single man...", docs[3], "x\ty \n\n z~!"]:
        ids = tok.encode(text)
        assert tok.decode(ids) == text
    assert len(tok.encode(docs[5])) < len(docs[5].encode()) / 2  # merges learned: fewer tokens than bytes

    # trained on the training split only (training is deterministic: same documents, same file)
    splits = plaintext.corpus_splits(cfg)
    assert path.read_text() == real(splits["train"], 320).to_str()
    assert path.read_text() != real([d for docs in splits.values() for d in docs], 320).to_str()

    # another corpus (one more file), another vocabulary size: new files, trained again
    _write_corpus(tmp_path / "corpus" / "more", files=1, offset=500)
    prepare({**cfg, "files": ["corpus/*.txt", "corpus/more/*.txt"]})
    assert len(calls) == 2
    prepare({**cfg, "vocab_size": 400})
    assert len(calls) == 3
    assert len(list((tmp_path / "tokenizers").glob("bpe*.json"))) == 3
    prepare(cfg)
    assert len(calls) == 3 and path.stat().st_mtime_ns == mtime

    # one letter of a training document changed (same sizes, same split): trained again; changed
    # back: the old file
    before = plaintext.split_documents(docs, 0.1, 0.1, 0)
    i = before["train"][0]
    changed = next(c for c in (docs[i].replace("a", x, 1) for x in "bcdefghijklmnop")
                   if plaintext.split_documents(docs[:i] + [c] + docs[i + 1 :], 0.1, 0.1, 0) == before)
    book = tmp_path / "corpus" / f"book{i // 20}.txt"
    original = book.read_text()
    book.write_text(original.replace(docs[i], changed))
    prepare(cfg)
    assert len(calls) == 4
    book.write_text(original)
    prepare(cfg)
    assert len(calls) == 4 and path.stat().st_mtime_ns == mtime


def test_bpe_training_is_deterministic(tmp_path):
    docs = _write_corpus(tmp_path / "corpus")
    assert plaintext.train_bpe(docs, 300).to_str() == plaintext.train_bpe(list(docs), 300).to_str()


def test_tokenizer_folder_is_not_part_of_the_corpus(tmp_path):
    _write_corpus(tmp_path / "corpus")
    cfg = _resolved(tmp_path, files="corpus/**/*", tokenizer_dir="corpus/tok")
    prepare(cfg)
    assert len(list((tmp_path / "corpus" / "tok").glob("bpe*.json"))) == 1
    assert [f.name for f in plaintext.corpus_files(cfg)] == ["book0.txt", "book1.txt", "book2.txt"]


# ------------------------------------------------------------------ config errors
@pytest.mark.parametrize(
    "override, match",
    [
        ({"document": "chapter"}, r"dataset\.document must be one of paragraph, file; got 'chapter'"),
        ({"tokenizer": "gpt2"}, r"dataset\.tokenizer must be one of bpe, byte"),
        ({"eval_split": "train"}, r"dataset\.eval_split must be one of validation, test"),
        ({"vocab_size": 100}, r"dataset\.vocab_size must be an integer >= 257"),
        ({"val_fraction": 1.5}, r"dataset\.val_fraction .* in \[0, 1\)"),
        ({"val_fraction": 0.5, "test_fraction": 0.5}, r"dataset\.val_fraction \+ dataset\.test_fraction must be < 1"),
        ({"test_fraction": 0}, r"dataset\.test_fraction must be > 0 when dataset\.eval_split=test"),
        ({"files": 3}, r"dataset\.files must be null"),
        ({"files": []}, r"dataset\.files must be null"),
        ({"partition": "dirichlet"}, r"text supports only dataset\.partition=iid"),
        ({"seq_len": 0}, r"dataset\.seq_len must be an integer >= 1"),
        ({"split_seed": -1}, r"dataset\.split_seed must be an integer >= 0"),
        ({"tokenizer_dir": ""}, r"dataset\.tokenizer_dir must be null"),
        ({"vocab": 8192}, r"unknown key\(s\) dataset\.vocab .* allowed: .*vocab_size"),
    ],
)
def test_config_errors_name_the_key_and_allowed_values(tmp_path, override, match):
    with pytest.raises(ConfigError, match=match):
        check_available(_cfg(tmp_path, **override))


def test_missing_files_and_empty_splits(tmp_path):
    with pytest.raises(ConfigError, match=r"dataset\.files='corpus/\*\.txt' matches no file"):
        check_available(_cfg(tmp_path))
    with pytest.raises(ConfigError, match=r"Jane Austen corpus .* `lsgd data text`"):
        check_available(_cfg(tmp_path, files=None))
    _write_corpus(tmp_path / "corpus")
    with pytest.raises(ConfigError, match=r"the test split is empty .* raise dataset\.test_fraction, or use dataset\.document=paragraph"):
        build_datasets(_cfg(tmp_path, document="file", test_fraction=0.1), seed=0)
    with pytest.raises(ConfigError, match=r"fewer than dataset\.seq_len \+ 1 = 100001 tokens"):
        build_datasets(_cfg(tmp_path, tokenizer="byte", seq_len=100_000), seed=0)


# ------------------------------------------------------------------ the default corpus
def test_prepare_fetches_the_default_corpus_then_splits_it(tmp_path, monkeypatch):
    from test_austen import TEXTS, fake_package

    tree, novels = fake_package(tmp_path, TEXTS)
    monkeypatch.setattr(austen, "NOVELS", novels)
    unpacked = []
    monkeypatch.setattr(austen, "_unpack_package", lambda tmp: unpacked.append(tmp) or tree)
    root = tmp_path / "data"
    cfg = _cfg(root, files=None, val_fraction=0.25, test_fraction=0.25, tokenizer="byte", seq_len=4)

    with pytest.raises(ConfigError, match=r"dataset\.download=false"):
        prepare(cfg)
    prepare({**cfg, "download": True})
    assert len(unpacked) == 1 and austen.verify(root) == []
    check_available(cfg)  # present now: no download needed
    splits = plaintext.corpus_splits(_resolved(root, files=None, val_fraction=0.25, test_fraction=0.25))
    assert sorted(d for docs in splits.values() for d in docs) == sorted(["EMMA", "Emma Woodhouse, handsome.", "PERSUASION", "Sir Walter."])
    assert [len(splits[s]) for s in ("train", "validation", "test")] == [2, 1, 1]
    prepare({**cfg, "download": True})
    assert len(unpacked) == 1
