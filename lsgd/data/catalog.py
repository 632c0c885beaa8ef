"""The datasets lsgd knows, their config keys, and the entry points that read a ``dataset`` config
(a plain dict: the resolved Hydra group ``conf/dataset/<name>.yaml``)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lsgd.core.errors import ConfigError
from lsgd.core.registry import Registry

PARTITIONS = ("iid", "dirichlet")

# num_workers, pin_memory, persistent_workers, prefetch_factor: the input pipeline (lsgd.data.pipeline)
_COMMON = {"root": "data", "partition": "iid", "alpha": 0.5, "num_workers": 0, "pin_memory": "auto",
           "persistent_workers": True, "prefetch_factor": 2, "download": True}

#: Every dataset, by ``dataset.name`` (:class:`lsgd.core.registry.Registry`). An entry's ``extra``:
#: ``defaults``, every key the dataset accepts with its default (conf/dataset/<name>.yaml sets the
#: same values), and ``task``: ``classification``, ``lm`` or ``translation``.
DATASETS: Registry = Registry("dataset", "dataset.name")
for _name, _label, _task, _defaults, _summary in (
    ("fashion_mnist", "Fashion-MNIST", "classification", {**_COMMON},
     "Zalando's 28x28 clothing images, 10 classes (offline from Debian's package; the demo's data)"),
    ("cifar10", "CIFAR-10", "classification", {**_COMMON, "augment": True}, "32x32 colour images, 10 classes"),
    ("cifar100", "CIFAR-100", "classification", {**_COMMON, "augment": True}, "32x32 colour images, 100 classes"),
    ("imagenet", "ImageNet", "classification",
     {**_COMMON, "download": False, "image_size": 224, "num_classes": 1000, "num_train": 1281167},
     "ILSVRC-2012 from an ImageFolder tree (train/, val/)"),
    ("c4", "C4", "lm",
     {**_COMMON, "path": "allenai/c4", "config": "en", "data_files": None, "tokenizer": "byte", "seq_len": 256,
      "eval_sequences": 512, "steps_per_epoch": 1000, "shuffle_buffer": 10_000},
     "the Colossal Clean Crawled Corpus, streamed (Hugging Face datasets)"),
    ("text", "Austen", "lm",
     {**_COMMON, "files": None, "document": "paragraph", "val_fraction": 0.05, "test_fraction": 0.05, "split_seed": 0,
      "eval_split": "test", "tokenizer": "bpe", "vocab_size": 8192, "tokenizer_dir": None, "seq_len": 256,
      "eval_sequences": None},
     "real English text offline: Jane Austen's novels (or your own files), a BPE tokenizer trained on them"),
    ("wmt17", "WMT17", "translation",
     {**_COMMON, "path": "wmt/wmt17", "config": "de-en", "data_files": None, "src_lang": "de", "tgt_lang": "en",
      "src_len": 128, "tgt_len": 128, "tokenizer": "byte", "eval_split": "validation", "eval_samples": None},
     "WMT17 sentence pairs for translation (Hugging Face datasets)"),
    ("synthetic", "synthetic", "classification",
     {**_COMMON, "download": False, "seed": 0, "num_train": 4096, "num_test": 1024, "num_classes": 10,
      "input_shape": [1, 28, 28], "noise": 1.0},
     "seeded Gaussian classes (tests and benchmarks)"),
):
    DATASETS.add(_name, _name, label=_label, summary=_summary, task=_task, defaults=_defaults)


@dataclass(frozen=True)
class DatasetInfo:
    """What a model and the trainer need to know about a dataset, without reading it.

    Attributes:
        name: ``dataset.name``.
        task: ``"classification"``, ``"lm"`` or ``"translation"``.
        input_shape: one sample's input: (C, H, W) for images, (seq_len,) for language modeling,
            (src_len + tgt_len,) for translation (source | decoder input, lsgd.data.translation).
        num_classes: number of classes, or the vocabulary size for ``lm`` and ``translation``.
        num_train: training samples, or None when unknown without reading the data (a streaming
            set, wmt17, text).
        src_len: translation: where the source ends in the input (its first src_len positions).
        pad_id: translation: the padding token id in the input.
    """

    name: str
    task: str
    input_shape: tuple
    num_classes: int
    num_train: int | None
    src_len: int | None = None
    pad_id: int | None = None


def resolve(dataset_cfg: dict) -> dict:
    """``dataset_cfg`` with defaults filled in, after checking every key.

    Raises:
        ConfigError: unknown ``dataset.name`` or key, or an invalid value (the message names the key).
    """
    name = dataset_cfg.get("name")
    defaults = DATASETS.entry(name).extra["defaults"]
    unknown = sorted(set(dataset_cfg) - set(defaults) - {"name"})
    if unknown:
        raise ConfigError(
            f"unknown key(s) dataset.{', dataset.'.join(unknown)} for dataset.name={name}; "
            f"allowed: {', '.join(sorted(defaults))}"
        )
    cfg = {**defaults, **dataset_cfg}

    if cfg["partition"] not in PARTITIONS:
        raise ConfigError(f"dataset.partition must be one of {', '.join(PARTITIONS)}; got {cfg['partition']!r}")
    if not _is_number(cfg["alpha"]) or not cfg["alpha"] > 0:
        raise ConfigError(f"dataset.alpha (Dirichlet concentration) must be a number > 0; got {cfg['alpha']!r}")
    _int(cfg, "num_workers", 0)
    from lsgd.data.pipeline import check_pipeline_keys

    check_pipeline_keys(cfg)
    if not isinstance(cfg["download"], bool):
        raise ConfigError(f"dataset.download must be true or false; got {cfg['download']!r}")
    if cfg["root"] is None or str(cfg["root"]) == "":
        raise ConfigError("dataset.root must be a folder path (default: $LSGD_DATA or ./data)")

    if name == "imagenet":
        for key in ("image_size", "num_classes", "num_train"):
            _int(cfg, key, 1)
    elif name == "c4":
        if cfg["partition"] != "iid":
            raise ConfigError("dataset.partition=dirichlet needs class labels; c4 supports only dataset.partition=iid")
        for key in ("seq_len", "eval_sequences", "steps_per_epoch", "shuffle_buffer"):
            _int(cfg, key, 1)
        if not isinstance(cfg["tokenizer"], str) or not cfg["tokenizer"]:
            raise ConfigError(f"dataset.tokenizer must be 'byte' or a Hugging Face tokenizer name; got {cfg['tokenizer']!r}")
        files = cfg["data_files"]
        if files is not None:
            if not hasattr(files, "keys") or not {"train", "validation"} <= set(files.keys()):
                raise ConfigError(
                    "dataset.data_files must be null (stream dataset.path from the hub) or a mapping "
                    "{train: <path/glob or list>, validation: <path/glob or list>} of local C4-format "
                    f"json(.gz) files; got {files!r}"
                )
    elif name == "text":
        _check_text(cfg)
    elif name == "wmt17":
        _check_wmt17(cfg)
    elif name == "synthetic":
        for key in ("num_train", "num_test"):
            _int(cfg, key, 1)
        _int(cfg, "num_classes", 2)
        _int(cfg, "seed", 0)
        shape = cfg["input_shape"]
        if not isinstance(shape, (list, tuple)) or len(shape) != 3 or not all(isinstance(s, int) and s >= 1 for s in shape):
            raise ConfigError(f"dataset.input_shape must be [C, H, W] of positive integers; got {shape!r}")
        if not _is_number(cfg["noise"]) or cfg["noise"] < 0:
            raise ConfigError(f"dataset.noise must be a number >= 0; got {cfg['noise']!r}")
    return cfg


def _check_text(cfg: dict) -> None:
    from lsgd.data.plaintext import DOCUMENT_UNITS, EVAL_SPLITS, MIN_VOCAB, TOKENIZERS

    if cfg["partition"] != "iid":
        raise ConfigError("dataset.partition=dirichlet needs class labels; text supports only dataset.partition=iid")
    files = cfg["files"]
    if files is not None and (
        not (isinstance(files, str) or (isinstance(files, (list, tuple)) and files))
        or not all(isinstance(f, str) and f for f in ([files] if isinstance(files, str) else files))
    ):
        raise ConfigError(
            "dataset.files must be null (the Jane Austen corpus under dataset.root/text/austen) or a glob / "
            f"list of globs of plain-text files (relative to dataset.root); got {files!r}"
        )
    for key, allowed in (("document", DOCUMENT_UNITS), ("eval_split", EVAL_SPLITS), ("tokenizer", TOKENIZERS)):
        if cfg[key] not in allowed:
            raise ConfigError(f"dataset.{key} must be one of {', '.join(allowed)}; got {cfg[key]!r}")
    for key in ("val_fraction", "test_fraction"):
        if not _is_number(cfg[key]) or not 0 <= cfg[key] < 1:
            raise ConfigError(f"dataset.{key} (share of the documents) must be a number in [0, 1); got {cfg[key]!r}")
    if cfg["val_fraction"] + cfg["test_fraction"] >= 1:
        raise ConfigError(
            f"dataset.val_fraction + dataset.test_fraction must be < 1 (the rest is the training split); got "
            f"{cfg['val_fraction']} + {cfg['test_fraction']}"
        )
    frac = "val_fraction" if cfg["eval_split"] == "validation" else "test_fraction"
    if cfg[frac] == 0:
        raise ConfigError(f"dataset.{frac} must be > 0 when dataset.eval_split={cfg['eval_split']} (the test set)")
    _int(cfg, "split_seed", 0)
    _int(cfg, "vocab_size", MIN_VOCAB)
    _int(cfg, "seq_len", 1)
    if cfg["eval_sequences"] is not None:
        _int(cfg, "eval_sequences", 1)
    tdir = cfg["tokenizer_dir"]
    if tdir is not None and (not isinstance(tdir, str) or not tdir):
        raise ConfigError(f"dataset.tokenizer_dir must be null (dataset.root/tokenizers) or a folder path; got {tdir!r}")


def _check_wmt17(cfg: dict) -> None:
    from lsgd.data.translation import EVAL_SPLITS

    if cfg["partition"] != "iid":
        raise ConfigError("dataset.partition=dirichlet needs class labels; wmt17 supports only dataset.partition=iid")
    for key in ("src_len", "tgt_len"):
        _int(cfg, key, 2)
    if cfg["eval_split"] not in EVAL_SPLITS:
        raise ConfigError(f"dataset.eval_split must be one of {', '.join(EVAL_SPLITS)}; got {cfg['eval_split']!r}")
    if cfg["eval_samples"] is not None:
        _int(cfg, "eval_samples", 1)
    if not isinstance(cfg["tokenizer"], str) or not cfg["tokenizer"]:
        raise ConfigError(f"dataset.tokenizer must be 'byte' or a Hugging Face tokenizer name; got {cfg['tokenizer']!r}")
    for key in ("src_lang", "tgt_lang"):
        if not isinstance(cfg[key], str) or not cfg[key]:
            raise ConfigError(f"dataset.{key} must be a language code of the pairs (de, en); got {cfg[key]!r}")
    if cfg["src_lang"] == cfg["tgt_lang"]:
        raise ConfigError(f"dataset.src_lang and dataset.tgt_lang must differ; both are {cfg['src_lang']!r}")
    files = cfg["data_files"]
    if files is None:
        # the hub's configs are "<lang>-<lang>" (de-en, cs-en, ...): both directions use the same one
        langs = str(cfg["config"]).split("-")
        for key in ("src_lang", "tgt_lang"):
            if len(langs) == 2 and cfg[key] not in langs:
                raise ConfigError(
                    f"dataset.{key}={cfg[key]!r} is not a language of dataset.config={cfg['config']}; "
                    f"allowed: {', '.join(langs)}"
                )
    elif not hasattr(files, "keys") or not {"train", cfg["eval_split"]} <= set(files.keys()):
        raise ConfigError(
            "dataset.data_files must be null (dataset.path from the hub) or a mapping "
            f"{{train: <path/glob or list>, {cfg['eval_split']}: <path/glob or list>}} of local files in the "
            f"hub's wmt17 format (parquet or JSON lines with a 'translation' field); got {files!r}"
        )


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _int(cfg: dict, key: str, lo: int) -> None:
    v = cfg[key]
    if not isinstance(v, int) or isinstance(v, bool) or v < lo:
        raise ConfigError(f"dataset.{key} must be an integer >= {lo}; got {v!r}")


def dataset_info(dataset_cfg: dict) -> DatasetInfo:
    """Static facts about the configured dataset. Reads no data files and downloads nothing
    (exception: c4 and wmt17 with a Hugging Face tokenizer load that tokenizer from the local cache to
    learn its vocabulary size; text's vocabulary is ``dataset.vocab_size``, or 257 with the byte
    tokenizer).

    Raises:
        ConfigError: invalid config (see :func:`resolve`), or c4's tokenizer is not available.
    """
    cfg = resolve(dataset_cfg)
    name = cfg["name"]
    if name == "fashion_mnist":
        return DatasetInfo(name, "classification", (1, 28, 28), 10, 60000)
    if name in ("cifar10", "cifar100"):
        return DatasetInfo(name, "classification", (3, 32, 32), 10 if name == "cifar10" else 100, 50000)
    if name == "imagenet":
        s = cfg["image_size"]
        return DatasetInfo(name, "classification", (3, s, s), cfg["num_classes"], cfg["num_train"])
    if name == "c4":
        vocab = _tokenizer(cfg).vocab_size
        return DatasetInfo(name, "lm", (cfg["seq_len"],), vocab, None)
    if name == "text":
        from lsgd.data.plaintext import vocab_size

        return DatasetInfo(name, "lm", (cfg["seq_len"],), vocab_size(cfg), None)
    if name == "wmt17":
        from lsgd.data.translation import SpecialIds

        ids = SpecialIds.of(_tokenizer(cfg))
        return DatasetInfo(name, "translation", (cfg["src_len"] + cfg["tgt_len"],), ids.vocab_size, None,
                           src_len=cfg["src_len"], pad_id=ids.pad)
    return DatasetInfo(name, "classification", tuple(cfg["input_shape"]), cfg["num_classes"], cfg["num_train"])


def _tokenizer(cfg: dict):
    from lsgd.data.text import get_tokenizer

    try:
        return get_tokenizer(cfg["tokenizer"], not cfg["download"])
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"dataset.tokenizer={cfg['tokenizer']!r} cannot be loaded ({exc}); use dataset.tokenizer=byte "
            "(offline byte-level), a local tokenizer folder, or set dataset.download=true to fetch it from "
            "the Hugging Face hub once (`make data`)"
        ) from exc


_HOW_TO = "run `make data` (downloads into dataset.root), or set dataset.root to a folder that holds it"


def check_available(dataset_cfg: dict) -> None:
    """Validate the config and check that the data is present or can be downloaded.

    Raises:
        ConfigError: invalid key (see :func:`resolve`), or the files are missing and
            ``dataset.download`` is false / cannot help; the message says how to get them.
    """
    cfg = resolve(dataset_cfg)
    name, root = cfg["name"], cfg["root"]
    if name == "fashion_mnist":
        from lsgd.data.vision import fashion_mnist_dirs, find_fashion_mnist

        if find_fashion_mnist(root) is None and not cfg["download"]:
            raise ConfigError(
                f"Fashion-MNIST not found (searched {', '.join(str(d) for d in fashion_mnist_dirs(root))}) and "
                f"dataset.download=false; {_HOW_TO} (the four *-ubyte[.gz] files), "
                "`apt-get install dataset-fashion-mnist`, or set dataset.download=true"
            )
    elif name in ("cifar10", "cifar100"):
        from lsgd.data.vision import cifar_files

        missing = [str(f) for f in cifar_files(name, root) if not f.is_file()]
        if missing and not cfg["download"]:
            raise ConfigError(
                f"{name} not found under dataset.root={root} (missing {missing[0]}"
                f"{f' and {len(missing) - 1} more' if len(missing) > 1 else ''}) and dataset.download=false; "
                f"{_HOW_TO} (torchvision's layout), or set dataset.download=true"
            )
    elif name == "imagenet":
        for split in ("train", "val"):
            if not (Path(root) / split).is_dir():
                raise ConfigError(
                    f"imagenet: {Path(root) / split} is not a folder. dataset.root must point to an ImageFolder tree "
                    "with train/<class>/*.JPEG and val/<class>/*.JPEG (ILSVRC-2012 cannot be downloaded "
                    "automatically: get it from image-net.org and sort val/ into class folders)"
                )
    elif name == "c4":
        if cfg["data_files"] is not None:
            from lsgd.data.text import resolve_data_files

            for split in ("train", "validation"):
                if not resolve_data_files(cfg, split):
                    raise ConfigError(
                        f"dataset.data_files.{split}={cfg['data_files'][split]!r} matches no file "
                        f"(relative paths are relative to dataset.root={root}); point it to C4 json.gz files, "
                        "e.g. c4-train.00000-of-01024.json.gz, or set dataset.data_files=null to stream from the hub"
                    )
        elif not cfg["download"] or os.environ.get("HF_DATASETS_OFFLINE") == "1":
            raise ConfigError(
                f"c4 with dataset.data_files=null streams {cfg['path']} from the Hugging Face hub, which needs "
                "dataset.download=true and network access; or set dataset.data_files to local C4 json.gz files"
            )
        if cfg["tokenizer"] != "byte" and not cfg["download"]:
            _tokenizer(cfg)
    elif name == "wmt17":
        _check_wmt17_files(cfg)
        if cfg["tokenizer"] != "byte" and not cfg["download"]:
            _tokenizer(cfg)
    elif name == "text":
        from lsgd.data import austen
        from lsgd.data.plaintext import _missing_message, corpus_files

        if cfg["files"] is None:
            if not austen.is_present(root) and not cfg["download"]:
                raise ConfigError(_missing_message(cfg, []) + " (dataset.download=false)")
        elif not corpus_files(cfg):
            raise ConfigError(_missing_message(cfg, []))


def _check_wmt17_files(cfg: dict) -> None:
    from lsgd.data.text import resolve_data_files
    from lsgd.data.translation import JSON_SUFFIXES, PARQUET_SUFFIXES, file_format

    if cfg["data_files"] is None:
        if not cfg["download"] or os.environ.get("HF_DATASETS_OFFLINE") == "1":
            raise ConfigError(
                f"wmt17 with dataset.data_files=null downloads {cfg['path']} ({cfg['config']}) from the Hugging Face "
                "hub, which needs dataset.download=true and network access once (then it is cached); or set "
                "dataset.data_files to local parquet / JSON-lines files in its format"
            )
        return
    for split in ("train", cfg["eval_split"]):
        files = resolve_data_files(cfg, split)
        if not files:
            raise ConfigError(
                f"dataset.data_files.{split}={cfg['data_files'][split]!r} matches no file (relative paths are "
                f"relative to dataset.root={cfg['root']}); point it to the hub's wmt17 files, e.g. "
                f"de-en/{split}-*.parquet, or set dataset.data_files=null to download them"
            )
        if file_format(files) is None:
            raise ConfigError(
                f"dataset.data_files.{split} must be all parquet ({', '.join(PARQUET_SUFFIXES)}) or all JSON lines "
                f"({', '.join(JSON_SUFFIXES)}); got {', '.join(files[:3])}"
            )


def prepare(dataset_cfg: dict) -> None:
    """Download what is missing and allowed (``dataset.download``) into ``dataset.root``: run once
    in the main process before workers start, and by ``make data``. No-op when present.

    Raises:
        ConfigError: as :func:`check_available`, or the download failed (no network).
    """
    check_available(dataset_cfg)
    cfg = resolve(dataset_cfg)
    name, root = cfg["name"], cfg["root"]
    try:
        if name == "fashion_mnist":
            from lsgd.data.vision import download_fashion_mnist, find_fashion_mnist

            if find_fashion_mnist(root) is None:
                download_fashion_mnist(root)
        elif name in ("cifar10", "cifar100"):
            from lsgd.data.vision import cifar_files, download_cifar

            if not all(f.is_file() for f in cifar_files(name, root)):
                download_cifar(name, root)
        elif name == "c4" and cfg["tokenizer"] != "byte":
            _tokenizer(cfg)
        elif name == "text":
            from lsgd.data.plaintext import prepare as prepare_text

            prepare_text(cfg)
        elif name == "wmt17":
            from lsgd.data.translation import load_pairs

            _tokenizer(cfg)
            load_pairs(cfg)  # downloads (hub) or converts (local files) once into the datasets cache
    except ConfigError:
        raise
    except Exception as exc:  # network / disk errors from torchvision's or datasets' downloader
        raise ConfigError(
            f"downloading {name} into dataset.root={root} failed: {exc}. Without network, copy the files "
            "there by hand or point dataset.root at a copy"
        ) from exc


#: The data sets loaded once and handed to every caller while :func:`sharing` is on (None: off).
_SHARED: dict | None = None
#: The data sets that are read-only once loaded (in memory; a streaming C4 set keeps its position).
SHAREABLE = ("fashion_mnist", "cifar10", "cifar100", "synthetic", "text", "wmt17")


@contextlib.contextmanager
def sharing() -> Iterator[None]:
    """Within the block, :func:`build_datasets` loads each read-only data set (:data:`SHAREABLE`)
    once and gives every caller the same objects: the workers of an in-process cluster
    (:mod:`lsgd.launch.inprocess`) hold one copy of Fashion-MNIST, not one each."""
    global _SHARED
    before, _SHARED = _SHARED, {} if _SHARED is None else _SHARED
    try:
        yield
    finally:
        _SHARED = before


def build_datasets(dataset_cfg: dict, seed: int) -> tuple[Any, Any]:
    """Load the (train, test) sets of the configured dataset (the same objects for every caller
    inside :func:`sharing`, for the data sets that allow it).

    Returns:
        fashion_mnist / cifar10 / cifar100 / synthetic: two in-memory
        :class:`lsgd.data.memory.TensorDataset`; imagenet: two
        :class:`lsgd.data.vision.ImageFolderSet`; c4: a
        :class:`lsgd.data.text.StreamingTextDataset` (train, shuffled with ``seed``) and an in-memory
        :class:`lsgd.data.memory.TokenBlockDataset` (the first ``eval_sequences`` validation blocks);
        wmt17: two :class:`lsgd.data.translation.TranslationPairs` (train and ``eval_split``);
        text: two in-memory :class:`lsgd.data.memory.TokenBlockDataset` (the training split and
        ``eval_split``, :mod:`lsgd.data.plaintext`).
        Use them through :class:`lsgd.data.ShardedLoader` and :func:`lsgd.data.eval_batches`.
    Raises:
        ConfigError: as :func:`check_available`, or an ImageFolder tree whose class / sample count
            differs from ``dataset.num_classes`` / ``dataset.num_train``.
    """
    check_available(dataset_cfg)
    cfg = resolve(dataset_cfg)
    if _SHARED is not None and cfg["name"] in SHAREABLE:
        key = (repr(sorted(cfg.items())), seed)
        if key not in _SHARED:
            _SHARED[key] = _build(cfg, seed)
        return _SHARED[key]
    return _build(cfg, seed)


def _build(cfg: dict, seed: int) -> tuple[Any, Any]:
    name, root = cfg["name"], cfg["root"]
    if name == "fashion_mnist":
        from lsgd.data.vision import load_fashion_mnist

        return load_fashion_mnist(root, True), load_fashion_mnist(root, False)
    if name in ("cifar10", "cifar100"):
        from lsgd.data.vision import load_cifar

        return load_cifar(name, root, True, cfg["augment"]), load_cifar(name, root, False, False)
    if name == "imagenet":
        from lsgd.data.vision import ImageFolderSet

        train = ImageFolderSet(Path(root) / "train", cfg["image_size"], True, cfg["num_workers"])
        test = ImageFolderSet(Path(root) / "val", cfg["image_size"], False, cfg["num_workers"])
        if len(train.classes) != cfg["num_classes"] or test.classes != train.classes:
            raise ConfigError(
                f"imagenet: {root}/train has {len(train.classes)} classes and val has {len(test.classes)} "
                f"(must be the same folders); set dataset.num_classes={len(train.classes)} for a subset"
            )
        if len(train) != cfg["num_train"]:
            raise ConfigError(
                f"imagenet: {root}/train holds {len(train)} images but dataset.num_train={cfg['num_train']}; "
                f"set dataset.num_train={len(train)}"
            )
        return train, test
    if name == "c4":
        from lsgd.data.text import StreamingTextDataset, load_eval_blocks

        _tokenizer(cfg)
        return StreamingTextDataset(cfg, seed), load_eval_blocks(cfg)
    if name == "wmt17":
        from lsgd.data.translation import load_pairs

        _tokenizer(cfg)
        return load_pairs(cfg)
    if name == "text":
        from lsgd.data.plaintext import build

        return build(cfg)
    from lsgd.data.vision import make_synthetic

    return make_synthetic(cfg)
