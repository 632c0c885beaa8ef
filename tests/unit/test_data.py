"""lsgd.data: partitions, sharded loading, exact resume, and each dataset's real loading path
on small files written in the real formats."""

from __future__ import annotations

import gzip
import hashlib
import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lsgd.data import (
    DATASETS,
    ShardedLoader,
    build_datasets,
    check_available,
    dataset_info,
    dirichlet_partition,
    eval_batches,
    iid_partition,
    label_entropy,
    prepare,
)
from lsgd.data.memory import random_crop_flip
from lsgd.core.errors import ConfigError

CONF = Path(__file__).resolve().parents[2] / "conf" / "dataset"
SYNTH = {"name": "synthetic", "num_train": 1000, "num_test": 300, "num_classes": 5, "input_shape": [1, 8, 8]}


def _assert_partition(shards: list[torch.Tensor], n: int) -> None:
    """Pairwise disjoint and together exactly range(n)."""
    allidx = torch.cat(shards)
    assert len(allidx) == n
    assert torch.equal(allidx.sort().values, torch.arange(n))


# ------------------------------------------------------------------ partitions
def test_iid_partition_disjoint_covering_balanced():
    shards = iid_partition(1003, 4, seed=7, epoch=0)
    _assert_partition(shards, 1003)
    assert {len(s) for s in shards} <= {250, 251}


def test_iid_partition_reshuffles_across_epochs_and_seeds():
    e0, e1 = iid_partition(1000, 4, 7, 0), iid_partition(1000, 4, 7, 1)
    other_seed = iid_partition(1000, 4, 8, 0)
    assert not torch.equal(e0[0], e1[0])
    assert not torch.equal(e0[0], other_seed[0])
    assert torch.equal(torch.cat(e0), torch.cat(iid_partition(1000, 4, 7, 0)))  # deterministic


def test_iid_loaders_of_all_ranks_share_one_permutation():
    """Each rank builds its own loader; disjoint index sets prove they drew the same permutation."""
    train, _ = build_datasets(SYNTH, seed=0)
    loaders = [ShardedLoader(train, SYNTH, r, 4, 25, seed=3) for r in range(4)]
    assert {ld.steps_per_epoch for ld in loaders} == {1000 // (4 * 25)}
    for epoch in (0, 1):
        idx = [ld.indices(epoch) for ld in loaders]
        _assert_partition(idx, 1000)  # 10 steps x 25 x 4 ranks = 1000: covers everything
    assert not torch.equal(loaders[0].indices(0), loaders[0].indices(1))


def test_batch_kb_step_reads_the_samples_of_k_steps_of_batch_b():
    """experiment=local_vs_minibatch relies on this: in the first epoch a worker's step r at local
    batch K*b (minibatch_kb) reads exactly the images of its steps K r .. K r + K - 1 at batch b
    (local_sgd_k), in the same order, so the two arms see the same samples in every round."""
    train, _ = build_datasets(SYNTH, seed=0)
    k, b, workers = 4, 6, 4
    for rank in range(workers):
        big = ShardedLoader(train, SYNTH, rank, workers, k * b, seed=3)
        small = ShardedLoader(train, SYNTH, rank, workers, b, seed=3)
        xs_big = [x for x, _ in big.batches(0)]
        xs_small = [x for x, _ in small.batches(0)]
        assert len(xs_big) == big.steps_per_epoch and small.steps_per_epoch >= k * big.steps_per_epoch
        for r, x in enumerate(xs_big):
            assert torch.equal(x, torch.cat(xs_small[k * r : k * (r + 1)]))


def test_dirichlet_partition_disjoint_covering_deterministic():
    labels = torch.arange(5000) % 10
    shards = dirichlet_partition(labels, 8, alpha=0.3, seed=1)
    _assert_partition(shards, 5000)
    again = dirichlet_partition(labels, 8, alpha=0.3, seed=1)
    assert all(torch.equal(a, b) for a, b in zip(shards, again))
    assert not all(torch.equal(a, b) for a, b in zip(shards, dirichlet_partition(labels, 8, 0.3, seed=2)))


@pytest.mark.parametrize("alpha", [0.1, 1.0, 100.0])
def test_dirichlet_class_fractions_match_dirichlet_variance(alpha):
    """Fraction of class c on worker w ~ Beta(alpha, (K-1) alpha): mean 1/K, variance
    (K-1) / (K^2 (K alpha + 1))."""
    k, classes, per_class = 4, 500, 200
    labels = torch.arange(classes * per_class) % classes
    shards = dirichlet_partition(labels, k, alpha, seed=0)
    frac = torch.stack([torch.bincount(labels[s], minlength=classes) for s in shards]).double() / per_class
    expected_var = (k - 1) / (k**2 * (k * alpha + 1))
    assert frac.mean().item() == pytest.approx(1 / k, abs=1e-9)
    assert frac.var().item() == pytest.approx(expected_var, rel=0.15)


def test_dirichlet_small_alpha_gives_label_skew():
    labels = torch.arange(20000) % 10
    def mean_entropy(alpha):
        shards = dirichlet_partition(labels, 10, alpha, seed=0)
        return np.mean([label_entropy(labels[s], 10) for s in shards])
    skewed, near_iid = mean_entropy(0.1), mean_entropy(100.0)
    assert near_iid > 0.98 * np.log(10)  # alpha=100: almost uniform labels per worker
    assert skewed < 0.5 * near_iid


def test_dirichlet_loader_cycles_short_shards_and_keeps_steps_equal():
    cfg = {**SYNTH, "partition": "dirichlet", "alpha": 0.2}
    train, _ = build_datasets(cfg, seed=0)
    loaders = [ShardedLoader(train, cfg, r, 4, 20, seed=5) for r in range(4)]
    shards = dirichlet_partition(train.labels, 4, 0.2, seed=5)
    need = loaders[0].steps_per_epoch * 20
    assert min(len(s) for s in shards) < need < max(len(s) for s in shards)  # this seed has both kinds
    for ld, shard in zip(loaders, shards):
        assert ld.steps_per_epoch == 1000 // 80
        idx = ld.indices(0)
        assert len(idx) == need and set(idx.tolist()) <= set(shard.tolist())
        if len(shard) < need:  # cycled: every shard sample used, none more than ceil(need/len) times
            counts = torch.bincount(idx, minlength=1000)[shard]
            assert counts.min() >= need // len(shard) and counts.max() <= -(-need // len(shard))
        else:
            assert len(set(idx.tolist())) == need
        assert not torch.equal(ld.indices(0), ld.indices(1))  # reshuffled each epoch
        assert len(list(ld.batches(0))) == ld.steps_per_epoch


def test_loader_rejects_too_small_dataset():
    train, _ = build_datasets(SYNTH, seed=0)
    with pytest.raises(ConfigError, match="batch_size"):
        ShardedLoader(train, SYNTH, 0, 4, 300, seed=0)


# ------------------------------------------------------------------ batches, resume, eval
def _assert_same_batches(a, b):
    assert len(a) == len(b)
    for (xa, ya), (xb, yb) in zip(a, b):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_synthetic_batches_shapes_and_resume_tail():
    train, _ = build_datasets(SYNTH, seed=0)
    ld = ShardedLoader(train, SYNTH, 1, 2, 32, seed=0)
    full = list(ld.batches(2))
    assert len(full) == ld.steps_per_epoch == 1000 // 64
    x, y = full[0]
    assert x.shape == (32, 1, 8, 8) and x.dtype == torch.float32 and y.shape == (32,) and y.dtype == torch.int64
    _assert_same_batches(list(ld.batches(2, start=5)), full[5:])
    fresh = ShardedLoader(train, SYNTH, 1, 2, 32, seed=0)  # a resumed process
    _assert_same_batches(list(fresh.batches(2, start=5)), full[5:])


def test_synthetic_is_deterministic_and_learnable():
    a_train, a_test = build_datasets(SYNTH, seed=0)
    b_train, _ = build_datasets(SYNTH, seed=123)  # the run seed does not change the data
    assert torch.equal(a_train.data, b_train.data)
    c_train, _ = build_datasets({**SYNTH, "seed": 1}, seed=0)
    assert not torch.equal(a_train.data, c_train.data)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 5))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in ShardedLoader(a_train, SYNTH, 0, 1, 50, seed=0).batches(0):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    x, y = next(eval_batches(a_test, 0, 1, 1000))
    assert (model(x).argmax(1) == y).float().mean() > 0.9


def test_eval_batches_disjoint_covering():
    _, test = build_datasets(SYNTH, seed=0)
    ys, xs = [], []
    for r in range(3):
        for x, y in eval_batches(test, r, 3, 64):
            assert len(y) <= 64
            xs.append(x)
            ys.append(y)
    assert torch.equal(torch.cat(xs), test.batch(torch.arange(300))[0])
    assert torch.equal(torch.cat(ys), test.targets)


def test_eval_batches_limit_takes_the_first_samples():
    _, test = build_datasets(SYNTH, seed=0)
    got = torch.cat([x for r in range(2) for x, _ in eval_batches(test, r, 2, 16, limit=50)])
    assert torch.equal(got, test.batch(torch.arange(50))[0])
    assert sum(len(y) for _, y in eval_batches(test, 0, 1, 16, limit=10 ** 6)) == 300


def test_random_crop_flip_is_a_padded_crop_or_its_mirror():
    x = torch.randint(0, 256, (6, 3, 8, 8), dtype=torch.uint8)
    out = random_crop_flip(x, 2, torch.Generator().manual_seed(0))
    assert out.shape == x.shape and out.dtype == torch.uint8
    padded = F.pad(x, (2, 2, 2, 2))
    for i in range(6):
        crops = [padded[i, :, oy : oy + 8, ox : ox + 8] for oy in range(5) for ox in range(5)]
        assert any(torch.equal(out[i], c) or torch.equal(out[i], c.flip(-1)) for c in crops)
    again = random_crop_flip(x, 2, torch.Generator().manual_seed(0))
    assert torch.equal(out, again)
    assert not torch.equal(out, random_crop_flip(x, 2, torch.Generator().manual_seed(1)))


# ------------------------------------------------------------------ config validation
def test_yaml_configs_match_code_defaults():
    import omegaconf
    files = sorted(CONF.glob("*.yaml"))
    assert {f.stem for f in files} == set(DATASETS)
    for f in files:
        cfg = omegaconf.OmegaConf.to_container(omegaconf.OmegaConf.load(f), resolve=True)
        assert cfg["name"] == f.stem
        assert set(cfg) - {"name"} == set(DATASETS.entry(f.stem).extra["defaults"]), f.name
        info = dataset_info(cfg)
        assert info.name == f.stem and info.task == DATASETS.entry(f.stem).extra["task"]


@pytest.mark.parametrize(
    "override, key",
    [
        ({"partition": "random"}, "dataset.partition"),
        ({"alpha": 0}, "dataset.alpha"),
        ({"alpha": -1.0}, "dataset.alpha"),
        ({"partiton": "iid"}, "dataset.partiton"),
        ({"name": "mnist"}, "dataset.name"),
        ({"input_shape": [28, 28]}, "dataset.input_shape"),
    ],
)
def test_invalid_keys_raise_config_error_naming_the_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        check_available({**SYNTH, **override})


def test_c4_rejects_dirichlet():
    with pytest.raises(ConfigError, match="dataset.partition"):
        dataset_info({"name": "c4", "partition": "dirichlet"})


def test_check_available_missing_cifar_says_how_to_get_it(tmp_path):
    cfg = {"name": "cifar10", "root": str(tmp_path), "download": False}
    with pytest.raises(ConfigError) as e:
        check_available(cfg)
    msg = str(e.value)
    assert "make data" in msg and "dataset.root" in msg and "dataset.download" in msg
    check_available({**cfg, "download": True})  # downloadable: no error at validation time


def test_check_available_missing_imagenet_root(tmp_path):
    with pytest.raises(ConfigError, match="ImageFolder"):
        check_available({"name": "imagenet", "root": str(tmp_path / "nowhere")})


def test_check_available_missing_fashion_mnist(tmp_path, monkeypatch):
    monkeypatch.setattr("lsgd.data.vision.DEBIAN_FASHION_MNIST", tmp_path / "no-debian")
    with pytest.raises(ConfigError, match="apt-get install dataset-fashion-mnist"):
        check_available({"name": "fashion_mnist", "root": str(tmp_path), "download": False})


# ------------------------------------------------------------------ Fashion-MNIST
def test_fashion_mnist_loads_full_sets():
    cfg = {"name": "fashion_mnist", "root": "data", "download": False}
    train, test = build_datasets(cfg, seed=0)
    info = dataset_info(cfg)
    assert (len(train), len(test)) == (60000, 10000) == (info.num_train, 10000)
    x, y = next(ShardedLoader(train, cfg, 0, 4, 128, seed=0).batches(0))
    assert x.shape == (128, *info.input_shape) and x.dtype == torch.float32
    assert torch.equal(torch.bincount(train.targets), torch.full((10,), 6000))
    xa, _ = train.batch(torch.arange(0, 60000, 7))
    assert abs(xa.mean()) < 0.05 and abs(xa.std() - 1) < 0.05  # normalized


def test_fashion_mnist_reads_idx_gz_files(tmp_path, monkeypatch):
    """The real IDX format, gzip-compressed as distributed, written by the test."""
    monkeypatch.setattr("lsgd.data.vision.DEBIAN_FASHION_MNIST", tmp_path / "no-debian")
    rng = np.random.default_rng(0)
    sets = {"train": 30, "t10k": 10}
    written = {}
    for split, n in sets.items():
        images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, n, dtype=np.uint8)
        written[split] = images, labels
        with gzip.open(tmp_path / f"{split}-images-idx3-ubyte.gz", "wb") as f:
            f.write(bytes([0, 0, 8, 3]) + np.array([n, 28, 28], ">u4").tobytes() + images.tobytes())
        with gzip.open(tmp_path / f"{split}-labels-idx1-ubyte.gz", "wb") as f:
            f.write(bytes([0, 0, 8, 1]) + np.array([n], ">u4").tobytes() + labels.tobytes())
    train, test = build_datasets({"name": "fashion_mnist", "root": str(tmp_path), "download": False}, seed=0)
    assert len(train) == 30 and len(test) == 10
    assert torch.equal(train.data[:, 0], torch.from_numpy(written["train"][0]))
    assert torch.equal(test.targets, torch.from_numpy(written["t10k"][1]).long())


# ------------------------------------------------------------------ CIFAR (torchvision's loader)
def _write_cifar10(root: Path, per_batch: int, monkeypatch) -> dict:
    """A tiny CIFAR-10 tree in the real format (pickled dicts with b"data" rows of 3072 uint8 in
    RRR..GGG..BBB order and "labels"). torchvision verifies each file's md5 against its class
    attributes, so the test points those at the md5s of its own files: the real loader runs."""
    import torchvision

    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    written = {}
    md5 = lambda p: hashlib.md5(p.read_bytes()).hexdigest()
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8)
        labels = rng.integers(0, 10, per_batch).tolist()
        with open(folder / name, "wb") as f:
            pickle.dump({"batch_label": name, "labels": labels, "data": data, "filenames": []}, f)
        written[name] = data, labels
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({"label_names": [f"class{i}" for i in range(10)], "num_vis": 3072}, f)
    cls = torchvision.datasets.CIFAR10
    monkeypatch.setattr(cls, "train_list", [[f"data_batch_{i}", md5(folder / f"data_batch_{i}")] for i in range(1, 6)])
    monkeypatch.setattr(cls, "test_list", [["test_batch", md5(folder / "test_batch")]])
    monkeypatch.setattr(cls, "meta", {**cls.meta, "md5": md5(folder / "batches.meta")})
    return written


def test_cifar10_via_torchvision_loader(tmp_path, monkeypatch):
    written = _write_cifar10(tmp_path, 20, monkeypatch)
    cfg = {"name": "cifar10", "root": str(tmp_path), "download": False}
    check_available(cfg)
    prepare(cfg)  # present: no download attempted
    train, test = build_datasets(cfg, seed=0)
    assert len(train) == 100 and len(test) == 20
    expected = np.concatenate([written[f"data_batch_{i}"][0] for i in range(1, 6)]).reshape(-1, 3, 32, 32)
    assert torch.equal(train.data, torch.from_numpy(expected))  # CHW layout, file order kept
    assert test.targets.tolist() == written["test_batch"][1]

    loader = ShardedLoader(train, cfg, 1, 2, 10, seed=0)
    full = list(loader.batches(0))
    x, y = full[0]
    assert x.shape == (10, 3, 32, 32) and x.dtype == torch.float32 and y.dtype == torch.int64
    _assert_same_batches(list(ShardedLoader(train, cfg, 1, 2, 10, seed=0).batches(0, start=3)), full[3:])
    plain = train.batch(loader.indices(0)[:10])[0]
    assert not torch.equal(x, plain)  # augmented (crop/flip), deterministically
    no_aug = ShardedLoader(build_datasets({**cfg, "augment": False}, 0)[0], cfg, 1, 2, 10, seed=0)
    assert torch.equal(next(no_aug.batches(0))[0], plain)
    xe, _ = next(eval_batches(test, 0, 1, 20))
    assert torch.equal(xe, test.batch(torch.arange(20))[0])  # no augmentation at eval


# ------------------------------------------------------------------ ImageNet (ImageFolder)
def _write_image_tree(root: Path, classes=3, per_class=(6, 2)) -> None:
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, n in zip(("train", "val"), per_class):
        for c in range(classes):
            d = root / split / f"n0000000{c}"
            d.mkdir(parents=True)
            for i in range(n):
                img = Image.fromarray(rng.integers(0, 256, (40 + 3 * i, 48, 3), dtype=np.uint8))
                img.save(d / f"img{i}.{'png' if i % 2 else 'JPEG'}")


def test_imagenet_image_folder_path(tmp_path):
    _write_image_tree(tmp_path)
    cfg = {"name": "imagenet", "root": str(tmp_path), "image_size": 32, "num_classes": 3, "num_train": 18}
    check_available(cfg)
    info = dataset_info(cfg)
    train, test = build_datasets(cfg, seed=0)
    assert len(train) == 18 and len(test) == 6
    assert torch.equal(torch.bincount(train.labels), torch.full((3,), 6))
    loader = ShardedLoader(train, cfg, 0, 2, 4, seed=0)
    full = list(loader.batches(1))
    assert len(full) == 2
    x, y = full[0]
    assert x.shape == (4, *info.input_shape) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert torch.equal(y, train.labels[loader.indices(1)[:4]])
    _assert_same_batches(list(ShardedLoader(train, cfg, 0, 2, 4, seed=0).batches(1, start=1)), full[1:])
    ys = torch.cat([y for r in range(2) for _, y in eval_batches(test, r, 2, 4)])
    assert torch.equal(ys, test.labels)

    with pytest.raises(ConfigError, match="dataset.num_train=18"):
        build_datasets({**cfg, "num_train": 1281167}, seed=0)
    with pytest.raises(ConfigError, match="dataset.num_classes=3"):
        build_datasets({**cfg, "num_classes": 1000}, seed=0)


# ------------------------------------------------------------------ C4 (streaming json.gz)
def _write_c4(root: Path, docs_per_file=40, train_files=2) -> list[str]:
    """Files in C4's real layout: gzip-compressed JSON lines {"text", "timestamp", "url"}."""
    texts = []
    for split, n_files in (("train", train_files), ("validation", 1)):
        for i in range(n_files):
            with gzip.open(root / f"c4-{split}.{i:05d}-of-{n_files:05d}.json.gz", "wt", encoding="utf-8") as f:
                for j in range(docs_per_file):
                    text = f"{split} file {i} doc {j}: " + "lorem ipsum é dolor " * (1 + j % 7)
                    if split == "train":
                        texts.append(text)
                    f.write(json.dumps({"text": text, "timestamp": "2019-04-25T12:57:54Z", "url": f"https://x/{i}/{j}"}) + "\n")
    return texts


def _c4_cfg(root: Path, **kw) -> dict:
    return {
        "name": "c4",
        "root": str(root),
        "download": False,
        "data_files": {"train": "c4-train.*.json.gz", "validation": ["c4-validation.00000-of-00001.json.gz"]},
        "seq_len": 32,
        "eval_sequences": 10,
        "steps_per_epoch": 3,
        "shuffle_buffer": 16,
        **kw,
    }


def test_c4_streaming_from_local_json_gz(tmp_path):
    texts = _write_c4(tmp_path)
    cfg = _c4_cfg(tmp_path)
    check_available(cfg)
    info = dataset_info(cfg)
    assert (info.task, info.input_shape, info.num_classes, info.num_train) == ("lm", (32,), 257, None)
    train, test = build_datasets(cfg, seed=0)
    assert len(test) == 10

    loader = ShardedLoader(train, cfg, 0, 2, 4, seed=0)
    assert loader.steps_per_epoch == 3
    epoch0 = list(loader.batches(0))
    assert len(epoch0) == 3
    x, y = epoch0[0]
    assert x.shape == y.shape == (4, 32) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])  # next-token targets
    assert int(x.max()) < info.num_classes and (x == 256).any()  # eos between documents

    epoch1 = list(loader.batches(1))  # the stream continues
    assert not torch.equal(epoch1[0][0], epoch0[0][0])
    resumed = ShardedLoader(train, cfg, 0, 2, 4, seed=0)  # a new process resuming at step 1 of epoch 1
    _assert_same_batches(list(resumed.batches(1, start=1)), epoch1[1:])
    _assert_same_batches(list(loader.batches(0, start=2)), epoch0[2:])  # going back restarts the stream

    # the two ranks read disjoint documents that together are the whole training split
    docs = [list(train.documents(r, 2, epoch=0)) for r in range(2)]
    assert not set(docs[0]) & set(docs[1])
    assert sorted(docs[0] + docs[1]) == sorted(texts)
    assert docs[0] != list(train.documents(0, 2, epoch=1))  # reshuffled in the next pass

    evals = torch.cat([x for r in range(3) for x, _ in eval_batches(test, r, 3, 4)])
    assert torch.equal(evals, test.blocks[:, :-1])
    ids = test.blocks[:3].flatten().tolist()  # packed in file order: doc 0, eos, doc 1, ...
    eos = ids.index(256)
    assert train.tokenizer.decode(ids[:eos]) == "validation file 0 doc 0: lorem ipsum é dolor "
    assert train.tokenizer.decode(ids[eos + 1 :]).startswith("validation file 0 doc 1: ")


def test_c4_single_file_split_by_examples(tmp_path):
    """One train file (cannot be split by file across 3 ranks): every rank keeps every 3rd document."""
    _write_c4(tmp_path, docs_per_file=30, train_files=1)
    train, _ = build_datasets(_c4_cfg(tmp_path), seed=0)
    docs = [set(train.documents(r, 3)) for r in range(3)]
    assert [len(d) for d in docs] == [10, 10, 10] and not (docs[0] & docs[1] or docs[1] & docs[2])


def test_c4_missing_files_and_hub_without_download(tmp_path):
    with pytest.raises(ConfigError, match="dataset.data_files.train"):
        check_available(_c4_cfg(tmp_path))
    with pytest.raises(ConfigError, match="dataset.download"):
        check_available({"name": "c4", "download": False, "data_files": None})
    with pytest.raises(ConfigError, match="dataset.data_files"):
        check_available({"name": "c4", "data_files": "c4-train.json.gz"})
