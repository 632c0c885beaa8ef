"""Image datasets: Fashion-MNIST, CIFAR-10/100, the synthetic set (in memory) and ImageNet
(torchvision ``ImageFolder`` read through a DataLoader)."""

from __future__ import annotations

import gzip
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from lsgd.data.memory import TensorDataset
from lsgd.data.partition import derive_seed, generator

# Debian's dataset-fashion-mnist package installs the four original .gz files here.
DEBIAN_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_FILES = {
    True: ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    False: ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
FASHION_MNIST_MEAN, FASHION_MNIST_STD = (0.2860,), (0.3530,)
CIFAR_STATS = {
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


# ---------------------------------------------------------------- Fashion-MNIST
def fashion_mnist_dirs(root: str | os.PathLike) -> list[Path]:
    """Folders searched, in order, for the four IDX files (plain or ``.gz``): ``root`` itself,
    torchvision's layout ``root/FashionMNIST/raw``, then Debian's ``/usr/share/datasets/fashion-mnist``."""
    return [Path(root), Path(root) / "FashionMNIST" / "raw", DEBIAN_FASHION_MNIST]


def _idx_file(folder: Path, stem: str) -> Path | None:
    for name in (stem, stem + ".gz"):
        if (folder / name).is_file():
            return folder / name
    return None


def find_fashion_mnist(root: str | os.PathLike) -> Path | None:
    """The first of :func:`fashion_mnist_dirs` holding all four files, or None."""
    stems = FASHION_MNIST_FILES[True] + FASHION_MNIST_FILES[False]
    for folder in fashion_mnist_dirs(root):
        if all(_idx_file(folder, s) for s in stems):
            return folder
    return None


def read_idx(path: str | os.PathLike) -> Tensor:
    """Read a uint8 IDX file (LeCun's MNIST format), plain or gzip-compressed.

    Format: two zero bytes, type code 0x08 (uint8), number of dimensions d, d big-endian uint32
    sizes, then the data in C order. (torchvision's ``read_sn3_pascalvincent_tensor`` reads the
    same format but only from uncompressed files.)

    Returns:
        uint8 tensor of the stored shape, e.g. (60000, 28, 28) images or (60000,) labels.
    Raises:
        ValueError: not a uint8 IDX file, or truncated.
    """
    path = Path(path)
    raw = path.read_bytes()
    if path.suffix == ".gz":
        raw = gzip.decompress(raw)
    if len(raw) < 4 or raw[0:2] != b"\x00\x00" or raw[2] != 0x08:
        raise ValueError(f"{path} is not a uint8 IDX file")
    nd = raw[3]
    shape = tuple(int(s) for s in np.frombuffer(raw, dtype=">u4", count=nd, offset=4))
    data = torch.frombuffer(bytearray(raw[4 + 4 * nd :]), dtype=torch.uint8)
    if data.numel() != int(np.prod(shape)):
        raise ValueError(f"{path}: header says shape {shape} but holds {data.numel()} values")
    return data.view(shape)


def load_fashion_mnist(root: str | os.PathLike, train: bool) -> TensorDataset:
    """Fashion-MNIST split as an in-memory set: 60000 (train) or 10000 (test) samples,
    x (1, 28, 28) normalized with mean 0.2860 / std 0.3530, 10 classes.

    Raises:
        FileNotFoundError: no folder of :func:`fashion_mnist_dirs` holds the files.
    """
    folder = find_fashion_mnist(root)
    if folder is None:
        raise FileNotFoundError(f"Fashion-MNIST IDX files not found in {[str(d) for d in fashion_mnist_dirs(root)]}")
    images, labels = (read_idx(_idx_file(folder, s)) for s in FASHION_MNIST_FILES[train])
    return TensorDataset(images.unsqueeze(1), labels.long(), FASHION_MNIST_MEAN, FASHION_MNIST_STD)


def download_fashion_mnist(root: str | os.PathLike) -> None:
    """Download into ``root/FashionMNIST/raw`` with torchvision (network needed)."""
    import torchvision

    torchvision.datasets.FashionMNIST(str(root), train=True, download=True)


# ---------------------------------------------------------------- CIFAR
def _cifar_class(name: str):
    import torchvision

    return {"cifar10": torchvision.datasets.CIFAR10, "cifar100": torchvision.datasets.CIFAR100}[name]


def cifar_files(name: str, root: str | os.PathLike) -> list[Path]:
    """The batch and meta files torchvision's loader reads (``root/cifar-10-batches-py/...`` or
    ``root/cifar-100-python/...``)."""
    cls = _cifar_class(name)
    names = [f for f, _ in cls.train_list + cls.test_list] + [cls.meta["filename"]]
    return [Path(root) / cls.base_folder / f for f in names]


def load_cifar(name: str, root: str | os.PathLike, train: bool, augment: bool) -> TensorDataset:
    """CIFAR-10/100 split read with torchvision (which verifies each file's md5), kept in memory:
    x (3, 32, 32) normalized per channel; training batches get random crop (padding 4) + flip
    when ``augment``.

    Raises:
        RuntimeError: from torchvision, files missing or corrupted.
    """
    ds = _cifar_class(name)(str(root), train=train, download=False)
    data = torch.from_numpy(np.ascontiguousarray(ds.data.transpose(0, 3, 1, 2)))
    mean, std = CIFAR_STATS[name]
    return TensorDataset(data, torch.tensor(ds.targets), mean, std, augment_padding=4 if (train and augment) else None)


def download_cifar(name: str, root: str | os.PathLike) -> None:
    """Download and extract into ``root`` with torchvision (network needed)."""
    _cifar_class(name)(str(root), train=True, download=True)


# ---------------------------------------------------------------- synthetic
def make_synthetic(cfg: dict) -> tuple[TensorDataset, TensorDataset]:
    """A learnable classification set: ``num_classes`` Gaussian prototypes ``mu_k ~ N(0, I)`` of
    shape ``input_shape``; a sample of class k is ``mu_k + noise * N(0, I)``; classes balanced.
    Depends only on ``cfg["seed"]`` (not the run seed), so every run sees the same data.

    Returns:
        (train, test) in-memory sets with ``num_train`` / ``num_test`` samples, float inputs
        of shape ``input_shape`` (already roughly standardized; no further normalization).
    """
    shape = tuple(int(s) for s in cfg["input_shape"])
    k = int(cfg["num_classes"])
    protos = torch.randn((k, *shape), generator=generator("synthetic-prototypes", cfg["seed"]))

    def split(n: int, tag: str) -> TensorDataset:
        g = generator("synthetic", tag, cfg["seed"])
        y = (torch.arange(n) % k)[torch.randperm(n, generator=g)]
        x = protos[y] + float(cfg["noise"]) * torch.randn((n, *shape), generator=g)
        c = shape[0]
        return TensorDataset(x, y, (0.0,) * c, (1.0,) * c)

    return split(int(cfg["num_train"]), "train"), split(int(cfg["num_test"]), "test")


# ---------------------------------------------------------------- ImageNet
class _SeededItems(torch.utils.data.Dataset):
    """Fetches ``(index, seed)`` items: the transform runs under ``torch.manual_seed(seed)``
    inside ``fork_rng`` so random augmentations depend on the seed only (exact resume) and the
    caller's RNG state is untouched."""

    def __init__(self, folder):
        self.folder = folder

    def __len__(self) -> int:
        return len(self.folder)

    def __getitem__(self, item: tuple[int, int | None]):
        i, seed = item
        if seed is None:
            return self.folder[i]
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return self.folder[i]


class ImageFolderSet(torch.utils.data.Dataset):
    """One split of an ImageFolder tree (``root/train`` or ``root/val``, one sub-folder per class)
    with torchvision's standard ImageNet transforms: train ``RandomResizedCrop(image_size)`` +
    flip, val ``Resize(image_size * 256 / 224)`` + ``CenterCrop(image_size)``; both normalized with
    the ImageNet mean/std. Samples are decoded by a DataLoader with ``num_workers`` processes.

    x: float32 (3, image_size, image_size); y: int64 class index (sorted folder names).
    """

    task = "classification"

    def __init__(self, split_dir: str | os.PathLike, image_size: int, train: bool, num_workers: int = 0):
        import torchvision.transforms as T
        from torchvision.datasets import ImageFolder

        norm = [T.ToTensor(), T.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
        if train:
            tf = T.Compose([T.RandomResizedCrop(image_size), T.RandomHorizontalFlip(), *norm])
        else:
            tf = T.Compose([T.Resize(int(round(image_size * 256 / 224))), T.CenterCrop(image_size), *norm])
        self.folder = ImageFolder(str(split_dir), transform=tf)
        self.train = train
        self.num_workers = int(num_workers)

    @property
    def labels(self) -> Tensor:
        return torch.tensor(self.folder.targets, dtype=torch.int64)

    @property
    def classes(self) -> list[str]:
        return self.folder.classes

    def __len__(self) -> int:
        return len(self.folder)

    def __getitem__(self, i: int):
        return self.folder[i]

    def batch(self, idx: Tensor, aug_seed: int | None = None) -> tuple[Tensor, Tensor]:
        """Decode and collate the samples ``idx`` in this process: x float32 (B, 3, image_size,
        image_size), y int64 (B,). Training split with ``aug_seed``: sample j is augmented under
        seed ``derive_seed(aug_seed, j)`` (the same batch in any process; the caller's RNG is
        untouched). The training input pipeline (:mod:`lsgd.data.pipeline`) calls it in its
        DataLoader processes: JPEG decoding happens there."""
        items = _SeededItems(self.folder)
        seed = aug_seed if self.train else None
        got = [items[(int(i), None if seed is None else derive_seed(seed, j))] for j, i in enumerate(idx.tolist())]
        return torch.stack([x for x, _ in got]), torch.tensor([y for _, y in got], dtype=torch.int64)

    def iter_batches(
        self, index_batches: Iterable[Tensor], aug_seeds: Iterable[int] | None = None
    ) -> Iterator[tuple[Tensor, Tensor]]:
        """Decode and collate the given batches (``dataset.num_workers`` DataLoader processes:
        evaluation's path; training goes through :mod:`lsgd.data.pipeline`); sample j of a batch
        with seed s is augmented under seed ``derive_seed(s, j)``."""
        index_batches = list(index_batches)
        seeds = list(aug_seeds) if (aug_seeds is not None and self.train) else [None] * len(index_batches)
        batch_sampler = [
            [(int(i), None if s is None else derive_seed(s, j)) for j, i in enumerate(idx.tolist())]
            for idx, s in zip(index_batches, seeds)
        ]
        loader = torch.utils.data.DataLoader(
            _SeededItems(self.folder), batch_sampler=batch_sampler, num_workers=self.num_workers,
            generator=torch.Generator().manual_seed(0),  # its base seed not drawn from this process's RNG
        )
        for x, y in loader:
            yield x, y.long()
