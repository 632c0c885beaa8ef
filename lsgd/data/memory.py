"""In-memory datasets: the whole set is one tensor and a batch is one indexing operation.

Used for Fashion-MNIST, CIFAR-10/100 and the synthetic set, where a per-sample DataLoader would
cost more than the model on a few CPU cores. Images are kept as uint8 (4x less memory per
worker than float32: 47 MB instead of 188 MB for Fashion-MNIST, 154 MB instead of 614 MB for
CIFAR) and normalized per batch, which costs microseconds.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from lsgd.data.partition import generator


def random_crop_flip(x: Tensor, padding: int, g: torch.Generator) -> Tensor:
    """Per-sample random crop after zero padding, then random horizontal flip (p = 0.5).

    The batch version of torchvision's ``RandomCrop(H, padding)`` + ``RandomHorizontalFlip()``:
    each sample gets its own offsets in ``[0, 2 * padding]`` and flip bit, drawn from ``g``.

    Args:
        x: (B, C, H, W) tensor of any dtype (uint8 images are padded with 0, i.e. black).
        padding: pixels of zero padding on each side.
        g: generator; the same generator state gives the same crops and flips.
    Returns:
        (B, C, H, W) tensor of the same dtype.
    """
    b, c, h, w = x.shape
    xp = F.pad(x, (padding, padding, padding, padding))
    oy = torch.randint(0, 2 * padding + 1, (b,), generator=g)
    ox = torch.randint(0, 2 * padding + 1, (b,), generator=g)
    flip = torch.rand(b, generator=g) < 0.5
    rows = oy[:, None] + torch.arange(h)
    cols = ox[:, None] + torch.arange(w)
    cols = torch.where(flip[:, None], cols.flip(1), cols)
    return xp[
        torch.arange(b)[:, None, None, None],
        torch.arange(c)[None, :, None, None],
        rows[:, None, :, None],
        cols[:, None, None, :],
    ]


class TensorDataset(torch.utils.data.Dataset):
    """A classification set held as tensors.

    Args:
        data: (N, C, H, W) uint8 images (scaled by 1/255 then normalized) or float inputs
            (normalized as they are).
        targets: (N,) int64 labels.
        mean, std: per-channel normalization, length C.
        augment_padding: if not None, training batches get :func:`random_crop_flip` with this padding.
    """

    task = "classification"

    def __init__(
        self,
        data: Tensor,
        targets: Tensor,
        mean: Sequence[float],
        std: Sequence[float],
        augment_padding: int | None = None,
    ):
        if data.shape[0] != targets.shape[0]:
            raise ValueError(f"{data.shape[0]} inputs but {targets.shape[0]} targets")
        self.data = data
        self.targets = targets.long()
        self.mean = torch.tensor(mean, dtype=torch.float32).view(-1, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(-1, 1, 1)
        self.augment_padding = augment_padding

    @property
    def labels(self) -> Tensor:
        """(N,) int64 class labels (used by the Dirichlet split)."""
        return self.targets

    def __len__(self) -> int:
        return self.data.shape[0]

    def __getitem__(self, i: int) -> tuple[Tensor, int]:
        x, y = self.batch(torch.tensor([i]))
        return x[0], int(y[0])

    def batch(self, idx: Tensor, aug_seed: int | None = None) -> tuple[Tensor, Tensor]:
        """Samples ``idx`` as (x (B, C, H, W) in torch's default dtype (float32 unless the run's
        ``dtype`` says float64), y int64 (B,)); augmented when this set has augmentation and
        ``aug_seed`` is given (same seed, same augmentation)."""
        x = self.data[idx]
        if self.augment_padding is not None and aug_seed is not None:
            x = random_crop_flip(x, self.augment_padding, generator("augment", aug_seed))
        x = x.to(torch.get_default_dtype())
        if self.data.dtype == torch.uint8:
            x = x.div_(255.0)
        return (x - self.mean) / self.std, self.targets[idx]

    def iter_batches(
        self, index_batches: Iterable[Tensor], aug_seeds: Iterable[int] | None = None
    ) -> Iterator[tuple[Tensor, Tensor]]:
        """One (x, y) batch per index tensor; ``aug_seeds`` (one per batch) turns augmentation on."""
        if aug_seeds is None:
            for idx in index_batches:
                yield self.batch(idx)
        else:
            for idx, s in zip(index_batches, aug_seeds):
                yield self.batch(idx, s)


class TokenBlockDataset(torch.utils.data.Dataset):
    """A language-model set held as a (N, seq_len + 1) int64 tensor of token blocks.

    A batch of blocks ``b`` gives inputs ``b[:, :-1]`` and next-token targets ``b[:, 1:]``,
    both (B, seq_len) int64.
    """

    task = "lm"
    labels = None

    def __init__(self, blocks: Tensor):
        self.blocks = blocks.long()

    def __len__(self) -> int:
        return self.blocks.shape[0]

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        return self.blocks[i, :-1], self.blocks[i, 1:]

    def batch(self, idx: Tensor, aug_seed: int | None = None) -> tuple[Tensor, Tensor]:
        b = self.blocks[idx]
        return b[:, :-1], b[:, 1:]

    def iter_batches(self, index_batches: Iterable[Tensor], aug_seeds=None) -> Iterator[tuple[Tensor, Tensor]]:
        for idx in index_batches:
            yield self.batch(idx)
