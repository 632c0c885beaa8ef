"""Sentence pairs for machine translation (WMT17) through Hugging Face ``datasets``, tokenized per
batch and packed into the one input tensor the trainer hands to the model.

Source: the hub dataset ``wmt/wmt17`` (the canonical name of ``wmt17``), config ``de-en``
(Bojar et al. 2017, "Findings of the 2017 Conference on Machine Translation"): train about 5.9M
pairs (Europarl v7, Common Crawl, News Commentary v12, Rapid 2016), validation newstest2016
(2,999 pairs), test newstest2017 (3,004 pairs). Its files are parquet
(``de-en/train-0000k-of-00004.parquet``, ``validation-00000-of-00001.parquet``,
``test-00000-of-00001.parquet``); one record is ``{"translation": {"de": "...", "en": "..."}}``.
Local files in that format, parquet or JSON lines (``.json``, ``.jsonl``, optionally compressed:
``.gz``, ``.bz2``, ``.xz``, ``.zst``), load the same way (``datasets.load_dataset("parquet" |
"json", data_files=...)``, memory-mapped Arrow tables: random access, no full copy in memory).

Packing (token ids): V = the tokenizer's vocabulary (``ByteTokenizer``: 257, ids 0..255 bytes and
EOS 256), EOS its end-of-text id, and two ids appended after it, BOS = V and PAD = V + 1, so the
model's vocabulary is V + 2. For one pair (source tokens s, target tokens t), with
``src_len`` = S and ``tgt_len`` = T::

    x[:S]  = s[:S-1] + [EOS], then PAD up to S             encoder input
    x[S:]  = [BOS] + t[:T-1], then PAD up to T             decoder input (teacher forcing)
    y      = t[:T-1] + [EOS], then IGNORE_INDEX up to T    next-token targets

A batch is ``x`` int64 (B, S + T) and ``y`` int64 (B, T): the decoder at position j sees
x[S:S+j+1] and predicts y[j]. Longer sentences are truncated (keeping EOS). ``y`` holds
IGNORE_INDEX = -100 (``F.cross_entropy``'s default ``ignore_index``) at padding, so the loss, the
test loss and the token counts behind perplexity cover real target tokens and EOS only.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from lsgd.core.errors import ConfigError

#: target id that cross-entropy ignores (torch.nn.functional.cross_entropy's default ignore_index)
IGNORE_INDEX = -100
TRAIN_SPLIT = "train"
EVAL_SPLITS = ("validation", "test")
PARQUET_SUFFIXES = (".parquet",)
JSON_SUFFIXES = tuple(f"{base}{comp}" for base in (".json", ".jsonl") for comp in ("", ".gz", ".bz2", ".xz", ".zst"))


@dataclass(frozen=True)
class SpecialIds:
    """Token ids of the packing (module docstring): ``eos`` is the tokenizer's, ``bos`` = V and
    ``pad`` = V + 1 are appended after its vocabulary V; ``vocab_size`` = V + 2."""

    eos: int
    bos: int
    pad: int
    vocab_size: int

    @classmethod
    def of(cls, tokenizer) -> SpecialIds:
        v = int(tokenizer.vocab_size)
        return cls(eos=int(tokenizer.eos_id), bos=v, pad=v + 1, vocab_size=v + 2)


def pack_pairs(
    sources: Sequence[np.ndarray], targets: Sequence[np.ndarray], src_len: int, tgt_len: int, ids: SpecialIds
) -> tuple[Tensor, Tensor]:
    """Pack tokenized pairs as in the module docstring.

    Args:
        sources, targets: one int64 array of token ids per pair (no special tokens).
        src_len, tgt_len: S >= 1 and T >= 1, positions of the encoder and decoder input.
        ids: the special token ids.
    Returns:
        x int64 (B, S + T), y int64 (B, T).
    """
    if len(sources) != len(targets):
        raise ValueError(f"{len(sources)} sources but {len(targets)} targets")
    b = len(sources)
    x = np.full((b, src_len + tgt_len), ids.pad, dtype=np.int64)
    y = np.full((b, tgt_len), IGNORE_INDEX, dtype=np.int64)
    for i, (s, t) in enumerate(zip(sources, targets)):
        s, t = s[: src_len - 1], t[: tgt_len - 1]
        x[i, : len(s)] = s
        x[i, len(s)] = ids.eos
        x[i, src_len] = ids.bos
        x[i, src_len + 1 : src_len + 1 + len(t)] = t
        y[i, : len(t)] = t
        y[i, len(t)] = ids.eos
    return torch.from_numpy(x), torch.from_numpy(y)


def file_format(files: Sequence[str]) -> str | None:
    """``"parquet"`` or ``"json"`` when every file has that format's suffix, else None."""
    names = [str(f).lower() for f in files]
    if names and all(n.endswith(PARQUET_SUFFIXES) for n in names):
        return "parquet"
    if names and all(n.endswith(JSON_SUFFIXES) for n in names):
        return "json"
    return None


def load_split(cfg: dict, split: str):
    """The ``split`` of the configured corpus as a (memory-mapped) ``datasets.Dataset`` holding
    only the ``translation`` column: local files (``cfg["data_files"][split]``, parquet or JSON
    lines) or the hub dataset ``path``/``config`` (downloaded and cached once).

    Raises:
        ConfigError: the files have no ``translation`` column holding both ``src_lang`` and
            ``tgt_lang``.
    """
    from datasets import load_dataset

    if cfg.get("data_files"):
        from lsgd.data.text import resolve_data_files

        files = resolve_data_files(cfg, split)
        ds = load_dataset(file_format(files), data_files={split: files}, split=split)
        where = f"dataset.data_files.{split}"
    else:
        ds = load_dataset(cfg["path"], cfg.get("config"), split=split)
        where = f"{cfg['path']} ({cfg.get('config')}) split {split}"
    feature = ds.features.get("translation")
    if feature is None:
        raise ConfigError(
            f"{where}: records need a 'translation' field ({{\"translation\": {{\"de\": ..., \"en\": ...}}}}, "
            f"the format of the hub's wmt17); found columns {ds.column_names}"
        )
    langs = list(getattr(feature, "languages", None) or feature.keys())  # datasets.Translation or a struct
    for key in ("src_lang", "tgt_lang"):
        if cfg[key] not in langs:
            raise ConfigError(f"dataset.{key}={cfg[key]!r} is not a language of {where}; allowed: {', '.join(langs)}")
    return ds.select_columns(["translation"])


class TranslationPairs:
    """A split of sentence pairs (map-style): ``iter_batches`` tokenizes and packs each batch of
    indices on the fly (module docstring), so any sample order (the sharded loader's per-epoch
    permutations) costs no preprocessing pass over the corpus.

    Args:
        table: a ``datasets.Dataset`` with a ``translation`` column (:func:`load_split`).
        cfg: the resolved ``dataset`` config (``src_lang``, ``tgt_lang``, ``src_len``,
            ``tgt_len``, ``tokenizer``, ``download``).
    """

    task = "translation"
    labels = None

    def __init__(self, table, cfg: dict):
        from lsgd.data.text import get_tokenizer

        self.table = table
        self.src_lang, self.tgt_lang = cfg["src_lang"], cfg["tgt_lang"]
        self.src_len, self.tgt_len = int(cfg["src_len"]), int(cfg["tgt_len"])
        self.tokenizer = get_tokenizer(cfg["tokenizer"], not cfg.get("download", False))
        self.ids = SpecialIds.of(self.tokenizer)

    def __len__(self) -> int:
        return len(self.table)

    def pairs(self, idx: Iterable[int]) -> list[tuple[str, str]]:
        """(source, target) texts of the pairs ``idx``, in that order."""
        rows = self.table[[int(i) for i in idx]]["translation"]
        return [(r[self.src_lang], r[self.tgt_lang]) for r in rows]

    def references(self, idx: Iterable[int]) -> list[str]:
        """Target texts of the pairs ``idx`` as stored (untokenized: BLEU's references)."""
        return [t for _, t in self.pairs(idx)]

    def detokenize(self, ids: Iterable[int]) -> str:
        """Text of a decoded target: the ids before the first EOS, less the packing's own ids
        (BOS, PAD), through the loader's tokenizer (``ByteTokenizer``: UTF-8, invalid bytes
        replaced; a Hugging Face tokenizer: its ``decode`` without special tokens)."""
        out = []
        for i in ids:
            i = int(i)
            if i == self.ids.eos:
                break
            if 0 <= i < self.tokenizer.vocab_size:
                out.append(i)
        return self.tokenizer.decode(out)

    def batch(self, idx: Tensor, aug_seed: int | None = None) -> tuple[Tensor, Tensor]:
        """Pairs ``idx`` packed: x int64 (B, src_len + tgt_len), y int64 (B, tgt_len)."""
        pairs = self.pairs(idx.tolist())
        src = self.tokenizer.encode_batch([s for s, _ in pairs])
        tgt = self.tokenizer.encode_batch([t for _, t in pairs])
        return pack_pairs(src, tgt, self.src_len, self.tgt_len, self.ids)

    def iter_batches(self, index_batches: Iterable[Tensor], aug_seeds=None) -> Iterator[tuple[Tensor, Tensor]]:
        """One packed (x, y) batch per non-empty index tensor (an evaluation slice can be empty when
        the test set has fewer pairs than ranks; no augmentation: ``aug_seeds`` is ignored)."""
        for idx in index_batches:
            if len(idx):
                yield self.batch(idx)


def load_pairs(cfg: dict) -> tuple[TranslationPairs, TranslationPairs]:
    """(train, test): the ``train`` split and ``eval_split`` (its first ``eval_samples`` pairs in
    file order when set)."""
    train = load_split(cfg, TRAIN_SPLIT)
    test = load_split(cfg, cfg["eval_split"])
    if cfg.get("eval_samples") is not None:
        test = test.select(range(min(int(cfg["eval_samples"]), len(test))))
    return TranslationPairs(train, cfg), TranslationPairs(test, cfg)
