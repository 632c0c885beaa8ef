"""Datasets and their partitioning across workers.

Entry points (each takes the ``dataset`` config group as a plain dict)::

    info = dataset_info(cfg)              # static facts, no file reading
    check_available(cfg)                  # validate keys, data present or downloadable (ConfigError)
    prepare(cfg)                          # download if needed (main process, `make data`)
    train, test = build_datasets(cfg, seed)
    loader = ShardedLoader(train, cfg, rank, world_size, batch_size, seed)
    for x, y in loader.batches(epoch, start): ...
    for x, y in eval_batches(test, rank, world_size, batch_size): ...

Modules: ``catalog`` (config keys, defaults, the entry points), ``partition`` (iid / Dirichlet
splits, pure functions), ``memory`` (in-memory tensor sets), ``vision`` (Fashion-MNIST, CIFAR,
synthetic, ImageNet), ``text`` (streaming C4), ``plaintext`` (local plain-text files, BPE trained
locally), ``austen`` (the Jane Austen corpus from Debian), ``translation`` (WMT17 sentence pairs),
``loader`` (ShardedLoader, eval_batches).

Targets equal to ``IGNORE_INDEX`` (-100, translation padding) carry no loss and are not counted.
"""

from lsgd.data.catalog import (
    DATASETS,
    PARTITIONS,
    DatasetInfo,
    build_datasets,
    check_available,
    dataset_info,
    prepare,
    resolve,
)
from lsgd.data.loader import ShardedLoader, eval_batches
from lsgd.data.partition import (
    derive_seed,
    dirichlet_partition,
    iid_partition,
    label_entropy,
)
from lsgd.data.translation import IGNORE_INDEX

__all__ = [
    "DATASETS",
    "IGNORE_INDEX",
    "PARTITIONS",
    "DatasetInfo",
    "ShardedLoader",
    "build_datasets",
    "check_available",
    "dataset_info",
    "derive_seed",
    "dirichlet_partition",
    "eval_batches",
    "iid_partition",
    "label_entropy",
    "prepare",
    "resolve",
]
