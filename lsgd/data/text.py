"""Streaming text (C4) for language modeling: Hugging Face ``datasets`` in streaming mode,
tokenized and packed into fixed-length blocks."""

from __future__ import annotations

import functools
import glob
import itertools
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from lsgd.data.memory import TokenBlockDataset

TRAIN_SPLIT, EVAL_SPLIT = "train", "validation"


class ByteTokenizer:
    """Offline byte-level tokenizer: token = UTF-8 byte (0..255), plus end-of-text ``eos_id`` = 256.
    ``vocab_size`` = 257. Needs no files."""

    vocab_size = 257
    eos_id = 256

    def encode(self, text: str) -> np.ndarray:
        """int64 token ids of ``text`` (no eos appended)."""
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


class HFTokenizer:
    """A Hugging Face tokenizer (``transformers.AutoTokenizer``); ``vocab_size`` = ``len(tokenizer)``
    (base vocabulary plus added tokens), ``eos_id`` = its eos token (sep token if it has none).

    Raises:
        OSError: the tokenizer is not in the local cache and ``local_files_only`` (or no network).
        ValueError: the tokenizer has neither an eos nor a sep token.
    """

    def __init__(self, name: str, local_files_only: bool = True):
        from transformers import AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(name, local_files_only=local_files_only)
        self.vocab_size = len(self.tok)
        eos = self.tok.eos_token_id if self.tok.eos_token_id is not None else self.tok.sep_token_id
        if eos is None:
            raise ValueError(f"tokenizer {name!r} has no eos or sep token to separate documents")
        self.eos_id = int(eos)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        ids = self.tok(texts, add_special_tokens=False)["input_ids"]
        return [np.asarray(i, dtype=np.int64) for i in ids]

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids``, the tokenizer's special tokens (eos, pad, unk, ...) left out."""
        return self.tok.decode(list(ids), skip_special_tokens=True)


@functools.lru_cache(maxsize=8)
def get_tokenizer(name: str, local_files_only: bool = True):
    """``"byte"`` -> :class:`ByteTokenizer`, anything else -> :class:`HFTokenizer` (cached per process)."""
    if name == "byte":
        return ByteTokenizer()
    return HFTokenizer(name, local_files_only=local_files_only)


def pack_blocks(docs: Iterable[np.ndarray], eos_id: int, block_len: int) -> Iterator[Tensor]:
    """Concatenate token arrays, each followed by ``eos_id``, and cut the stream into consecutive
    non-overlapping blocks of ``block_len`` tokens (int64 tensors of shape (block_len,)); the
    incomplete tail is dropped."""
    pending: list[np.ndarray] = []
    size = 0
    eos = np.array([eos_id], dtype=np.int64)
    for ids in docs:
        pending += [ids, eos]
        size += len(ids) + 1
        if size >= block_len:
            buf = np.concatenate(pending)
            n = len(buf) // block_len
            for b in buf[: n * block_len].reshape(n, block_len):
                yield torch.from_numpy(b.copy())
            rest = buf[n * block_len :]
            pending, size = [rest], len(rest)


def resolve_data_files(cfg: dict, split: str) -> list[str]:
    """Local files of ``split`` from ``cfg["data_files"][split]`` (a path, glob or list of them;
    relative ones are relative to ``cfg["root"]``), sorted; [] when none match."""
    spec = cfg["data_files"][split]
    patterns = [spec] if isinstance(spec, (str, os.PathLike)) else list(spec)
    files: list[str] = []
    for p in patterns:
        p = Path(p)
        if not p.is_absolute():
            p = Path(cfg["root"]) / p
        files += sorted(glob.glob(str(p)))
    return files


def open_split(cfg: dict, split: str):
    """The ``split`` of the configured text corpus as a streaming ``datasets.IterableDataset``
    holding only the ``text`` column: local JSON lines (``data_files``, C4's schema
    ``{"text", "timestamp", "url"}``, ``.json`` or ``.json.gz``) or the hub dataset
    ``path``/``config``."""
    from datasets import load_dataset

    if cfg.get("data_files"):
        ds = load_dataset("json", data_files={split: resolve_data_files(cfg, split)}, split=split, streaming=True)
    else:
        ds = load_dataset(cfg["path"], cfg.get("config"), split=split, streaming=True)
    return ds.select_columns(["text"])


class StreamingTextDataset:
    """The training split of a text corpus as an endless per-rank stream of token blocks.

    Rank r reads its part of the corpus (``datasets.distributed.split_dataset_by_node``: whole
    files/shards when their number is a multiple of world_size, else every world_size-th document),
    after a buffered shuffle seeded with the run seed (the same on all ranks, so the parts are
    disjoint). The text is tokenized and packed into blocks of ``seq_len + 1`` tokens. When the
    corpus is exhausted the next pass starts, reshuffled (``set_epoch(pass)``).
    """

    task = "lm"
    labels = None

    def __init__(self, cfg: dict, seed: int):
        self.cfg = cfg
        self.seed = int(seed)
        self.seq_len = int(cfg["seq_len"])
        self.tokenizer = get_tokenizer(cfg["tokenizer"], not cfg.get("download", False))

    def documents(self, rank: int = 0, world_size: int = 1, epoch: int = 0) -> Iterator[str]:
        """Texts of this rank's part of the training split, in pass ``epoch``'s shuffled order."""
        from datasets.distributed import split_dataset_by_node

        ds = open_split(self.cfg, TRAIN_SPLIT)
        ds = ds.shuffle(seed=self.seed, buffer_size=int(self.cfg.get("shuffle_buffer", 10_000)))
        if world_size > 1:
            ds = split_dataset_by_node(ds, rank=rank, world_size=world_size)
        ds.set_epoch(epoch)
        for ex in ds:
            yield ex["text"]

    def blocks(self, rank: int = 0, world_size: int = 1) -> Iterator[Tensor]:
        """Endless stream of (seq_len + 1,) int64 blocks for ``rank``.

        Raises:
            RuntimeError: a whole pass over this rank's part yields no block.
        """
        for p in itertools.count():
            empty = True
            for block in pack_blocks(
                _tokenized(self.tokenizer, self.documents(rank, world_size, p)), self.tokenizer.eos_id, self.seq_len + 1
            ):
                empty = False
                yield block
            if empty:
                raise RuntimeError(
                    f"rank {rank}/{world_size}: the training text holds fewer than seq_len + 1 = {self.seq_len + 1} "
                    "tokens; add data files or lower dataset.seq_len"
                )


def _tokenized(tokenizer, texts: Iterable[str], chunk: int = 64) -> Iterator[np.ndarray]:
    it = iter(texts)
    while True:
        batch = list(itertools.islice(it, chunk))
        if not batch:
            return
        yield from tokenizer.encode_batch(batch)


def load_eval_blocks(cfg: dict) -> TokenBlockDataset:
    """The test set: the first ``eval_sequences`` packed (seq_len + 1)-token blocks of the
    ``validation`` split in file order (no shuffle), held in memory; fewer if the split is shorter.

    Raises:
        RuntimeError: the validation split yields no block.
    """
    tok = get_tokenizer(cfg["tokenizer"], not cfg.get("download", False))
    texts = (ex["text"] for ex in open_split(cfg, EVAL_SPLIT))
    stream = pack_blocks(_tokenized(tok, texts), tok.eos_id, int(cfg["seq_len"]) + 1)
    blocks = list(itertools.islice(stream, int(cfg["eval_sequences"])))
    if not blocks:
        raise RuntimeError("the validation split holds fewer than seq_len + 1 tokens")
    return TokenBlockDataset(torch.stack(blocks))
