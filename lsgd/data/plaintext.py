"""``dataset=text``: language modeling on local plain-text files, offline.

The corpus is ``dataset.files`` (a glob or a list of globs of UTF-8 text files, relative to
``dataset.root`` unless absolute), or with ``dataset.files=null`` Jane Austen's six novels under
``<root>/text/austen`` (:mod:`lsgd.data.austen`, fetched by ``lsgd data text`` / ``make data``).

Documents (``dataset.document``):
  - ``paragraph`` (default): a block of lines between blank lines (a blank line holds nothing or
    only spaces / tabs); runs of blank lines count as one separator. A novel is one long stream of
    paragraphs, so a paragraph is the smallest unit that keeps sentences whole; Austen's six
    novels hold 10,298.
  - ``file``: a whole file.
  Line endings are normalized to "\\n"; leading and trailing newlines of a document are dropped,
  documents with no visible character are skipped.

Split (:func:`split_documents`): documents are ranked by SHA-256(``split_seed``, text) (ties by
corpus position); the first ``round(val_fraction * n)`` go to ``validation``, the next
``round(test_fraction * n)`` to ``test``, the rest to ``train``. Deterministic, disjoint and
complete; a document's rank depends only on its own text (adding a file moves few documents), and
identical documents (a repeated heading) rank side by side, so they mostly share a split. Each
split keeps corpus order (files sorted by path, documents in file order).

Tokenizer (``dataset.tokenizer``): ``bpe`` (default) is a byte-level BPE (Hugging Face
``tokenizers``: GPT-2's byte-to-unicode pre-tokenizer and regex, no normalization, so
decode(encode(x)) == x) trained on the training split only, with ``dataset.vocab_size`` entries at
most (the 256 bytes, the end-of-text token ``<|endoftext|>`` = id 0, then merges of pairs seen at
least twice). It is cached as ``<tokenizer_dir>/bpe<vocab_size>-<hash>.json`` where ``hash`` is
the first 16 hex digits of SHA-256 over the recipe, vocab size and every training document, so a
changed corpus, split or vocabulary trains a new one. Training happens once, under a file lock
(the main process in ``prepare``, before the workers start; or the first rank to get there), and
the file is written atomically, so all ranks load the same tokenizer. ``byte`` is
:class:`lsgd.data.text.ByteTokenizer` (UTF-8 bytes + eos, vocabulary 257).

Sets: each split's documents are tokenized, an eos appended to each, and packed into
``seq_len + 1`` token blocks (:func:`lsgd.data.text.pack_blocks`, the tail dropped), held in
memory as :class:`lsgd.data.memory.TokenBlockDataset` (the training blocks are shuffled and split
across workers by :class:`lsgd.data.ShardedLoader` like any map-style set). The test set is the
``dataset.eval_split`` blocks (the first ``eval_sequences`` when set); the trainer reports its
loss and perplexity (``test_loss``, ``test_ppl``) as for c4.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import os
import re
from pathlib import Path

import numpy as np
import torch

from lsgd.data import austen
from lsgd.data.memory import TokenBlockDataset
from lsgd.data.text import ByteTokenizer, _tokenized, pack_blocks
from lsgd.core.errors import ConfigError
from lsgd.core.files import write_atomic

DOCUMENT_UNITS = ("paragraph", "file")
SPLITS = ("train", "validation", "test")
EVAL_SPLITS = ("validation", "test")
TOKENIZERS = ("bpe", "byte")
EOS = "<|endoftext|>"
#: smallest ``dataset.vocab_size`` of the BPE tokenizer: 256 bytes + the end-of-text token
MIN_VOCAB = 257
#: changes whenever the BPE training recipe changes, so cached tokenizers of an old recipe are not reused
BPE_RECIPE = "bytelevel-bpe-v1:min_frequency=2:eos=<|endoftext|>"

_BLANK_LINES = re.compile(r"\n(?:[ \t]*\n)+")


def tokenizer_dir(cfg: dict) -> Path:
    """``dataset.tokenizer_dir`` (relative to ``dataset.root`` unless absolute), or
    ``<dataset.root>/tokenizers`` when it is null."""
    return Path(cfg["root"]) / (cfg.get("tokenizer_dir") or "tokenizers")


def corpus_files(cfg: dict) -> list[Path]:
    """The corpus files: the Austen novels (``files=null``; they may not exist yet) or every file
    matching ``dataset.files``, sorted by path, duplicates and files under :func:`tokenizer_dir`
    removed."""
    spec = cfg["files"]
    if spec is None:
        return austen.corpus_files(cfg["root"])
    patterns = [spec] if isinstance(spec, (str, os.PathLike)) else list(spec)
    skip = tokenizer_dir(cfg).resolve()
    found: set[Path] = set()
    for p in patterns:
        p = Path(p)
        if not p.is_absolute():
            p = Path(cfg["root"]) / p
        for f in glob.glob(str(p), recursive=True):
            f = Path(f)
            if f.is_file() and skip not in f.resolve().parents:
                found.add(f)
    return sorted(found)


def documents_of(text: str, unit: str) -> list[str]:
    """The documents of one file's ``text`` (see the module docstring for ``unit``)."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    parts = [text] if unit == "file" else _BLANK_LINES.split(text)
    docs = (p.strip("\n") for p in parts)
    return [d for d in docs if d.strip()]


def read_documents(files: list[Path], unit: str) -> list[str]:
    """All documents of ``files`` in order.

    Raises:
        ConfigError: a file is not UTF-8 text.
    """
    docs: list[str] = []
    for f in files:
        try:
            text = Path(f).read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(f"dataset.files: {f} is not UTF-8 text ({exc}); convert it or leave it out of the glob") from exc
        docs += documents_of(text, unit)
    return docs


def _round(x: float) -> int:
    return int(np.floor(x + 0.5))


def split_documents(docs: list[str], val_fraction: float, test_fraction: float, seed: int) -> dict[str, list[int]]:
    """Indices of ``docs`` in each split (see the module docstring), each list ascending.

    Args:
        docs: the documents in corpus order.
        val_fraction, test_fraction: shares of the documents (rounded to the nearest count).
        seed: ``dataset.split_seed``; another seed gives another split.
    Returns:
        {"train": [...], "validation": [...], "test": [...]}: disjoint, together range(len(docs)).
    """
    n = len(docs)
    salt = f"lsgd-text-split:{int(seed)}\0".encode()
    keys = [hashlib.sha256(salt + d.encode("utf-8")).digest() for d in docs]
    order = sorted(range(n), key=lambda i: (keys[i], i))
    n_val = min(n, _round(val_fraction * n))
    n_test = min(n - n_val, _round(test_fraction * n))
    return {
        "validation": sorted(order[:n_val]),
        "test": sorted(order[n_val : n_val + n_test]),
        "train": sorted(order[n_val + n_test :]),
    }


def corpus_splits(cfg: dict) -> dict[str, list[str]]:
    """The documents of each split of the configured corpus.

    Raises:
        ConfigError: no files, or the training split or ``eval_split`` holds no document.
    """
    files = corpus_files(cfg)
    missing = [str(f) for f in files if not f.is_file()]
    if not files or missing:
        raise ConfigError(_missing_message(cfg, missing))
    docs = read_documents(files, cfg["document"])
    idx = split_documents(docs, cfg["val_fraction"], cfg["test_fraction"], cfg["split_seed"])
    for split, key in (("train", None), (cfg["eval_split"], "val_fraction" if cfg["eval_split"] == "validation" else "test_fraction")):
        if not idx[split]:
            raise ConfigError(
                f"dataset=text: the {split} split is empty ({len(docs)} documents with dataset.document="
                f"{cfg['document']} in {len(files)} file(s), val_fraction={cfg['val_fraction']}, "
                f"test_fraction={cfg['test_fraction']}); "
                + (f"raise dataset.{key}" if key else "lower dataset.val_fraction / dataset.test_fraction")
                + (", or use dataset.document=paragraph" if cfg["document"] == "file" else ", or add text")
            )
    return {s: [docs[i] for i in idx[s]] for s in SPLITS}


def _missing_message(cfg: dict, missing: list[str]) -> str:
    if cfg["files"] is None:
        return (
            f"the Jane Austen corpus is not under {austen.corpus_dir(cfg['root'])} (dataset.files=null); run "
            "`lsgd data text` or `make data` (Debian package r-cran-janeaustenr, needs apt-get), set "
            "dataset.download=true, or set dataset.files to a glob of your own plain-text files"
        )
    return (
        f"dataset.files={cfg['files']!r} matches no file (relative globs are relative to dataset.root="
        f"{cfg['root']}); point it to UTF-8 plain-text files, e.g. 'books/*.txt', or set dataset.files=null "
        "for the Jane Austen corpus"
    )


# ------------------------------------------------------------------ tokenizers
class BPETokenizer:
    """A trained byte-level BPE (``tokenizers.Tokenizer``) with the interface of
    :class:`lsgd.data.text.ByteTokenizer`. ``vocab_size`` is the configured size (the model's
    vocabulary); the trained vocabulary may be smaller on a small corpus, never larger."""

    def __init__(self, path: Path, vocab_size: int):
        from tokenizers import Tokenizer

        self.path = Path(path)
        self.tok = Tokenizer.from_file(str(path))
        self.vocab_size = int(vocab_size)
        eos = self.tok.token_to_id(EOS)
        if eos is None or self.tok.get_vocab_size() > self.vocab_size:
            raise ConfigError(
                f"{path} is not a BPE tokenizer of at most dataset.vocab_size={vocab_size} entries with {EOS}; "
                "delete it to retrain"
            )
        self.eos_id = int(eos)

    def encode(self, text: str) -> np.ndarray:
        """int64 token ids of ``text`` (no eos appended)."""
        return np.asarray(self.tok.encode(text).ids, dtype=np.int64)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [np.asarray(e.ids, dtype=np.int64) for e in self.tok.encode_batch(texts)]

    def decode(self, ids) -> str:
        """Text of ``ids`` (eos tokens are dropped)."""
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=True)


def bpe_path(cfg: dict, train_docs: list[str]) -> Path:
    """Where the BPE tokenizer of these training documents and ``dataset.vocab_size`` is cached."""
    h = hashlib.sha256(f"{BPE_RECIPE}\0{int(cfg['vocab_size'])}\0".encode())
    for d in train_docs:
        b = d.encode("utf-8")
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return tokenizer_dir(cfg) / f"bpe{int(cfg['vocab_size'])}-{h.hexdigest()[:16]}.json"


def train_bpe(train_docs: list[str], vocab_size: int):
    """A byte-level BPE ``tokenizers.Tokenizer`` trained on ``train_docs`` (see the module docstring)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=int(vocab_size),
        min_frequency=2,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(train_docs, trainer=trainer, length=len(train_docs))
    return tok


def ensure_bpe(cfg: dict, train_docs: list[str]) -> Path:
    """The cached BPE tokenizer of ``train_docs``, trained and written (atomically, under a lock)
    if it does not exist yet."""
    path = bpe_path(cfg, train_docs)
    if path.is_file():
        return path
    with austen.file_lock(path.parent / f".{path.name}.lock"):
        if not path.is_file():  # another process may have trained it while we waited
            tok = train_bpe(train_docs, cfg["vocab_size"])
            write_atomic(path, tok.to_str())
    return path


@functools.lru_cache(maxsize=4)
def _load_bpe(path: str, vocab_size: int) -> BPETokenizer:
    return BPETokenizer(Path(path), vocab_size)


def get_tokenizer(cfg: dict, train_docs: list[str]):
    """The tokenizer of ``dataset.tokenizer``: the byte tokenizer, or the BPE of ``train_docs``
    (trained first if needed)."""
    if cfg["tokenizer"] == "byte":
        return ByteTokenizer()
    return _load_bpe(str(ensure_bpe(cfg, train_docs)), int(cfg["vocab_size"]))


def vocab_size(cfg: dict) -> int:
    """The model's vocabulary size, without reading data: ``dataset.vocab_size`` for bpe, 257 for byte."""
    return ByteTokenizer.vocab_size if cfg["tokenizer"] == "byte" else int(cfg["vocab_size"])


# ------------------------------------------------------------------ entry points (via lsgd.data.catalog)
def prepare(cfg: dict) -> None:
    """Fetch the Austen corpus if it is missing (``files=null`` and ``download``), and train the
    BPE tokenizer if it is not cached. Run once in the main process before the workers start."""
    if cfg["files"] is None and cfg["download"]:
        austen.fetch(cfg["root"])
    splits = corpus_splits(cfg)
    get_tokenizer(cfg, splits["train"])


def _blocks(tok, docs: list[str], seq_len: int, limit: int | None = None) -> torch.Tensor | None:
    stream = pack_blocks(_tokenized(tok, docs, chunk=1024), tok.eos_id, seq_len + 1)
    blocks = []
    for b in stream:
        blocks.append(b)
        if limit is not None and len(blocks) >= limit:
            break
    return torch.stack(blocks) if blocks else None


def build(cfg: dict) -> tuple[TokenBlockDataset, TokenBlockDataset]:
    """(train, test) block sets of the configured corpus (see the module docstring).

    Raises:
        ConfigError: missing files, an empty split, or a split shorter than one block.
    """
    splits = corpus_splits(cfg)
    tok = get_tokenizer(cfg, splits["train"])
    out = []
    for split, limit in (("train", None), (cfg["eval_split"], cfg["eval_sequences"])):
        blocks = _blocks(tok, splits[split], int(cfg["seq_len"]), limit)
        if blocks is None:
            raise ConfigError(
                f"dataset=text: the {split} split ({len(splits[split])} documents) holds fewer than dataset.seq_len + 1 = "
                f"{int(cfg['seq_len']) + 1} tokens; lower dataset.seq_len or add text"
            )
        out.append(TokenBlockDataset(blocks))
    return out[0], out[1]
