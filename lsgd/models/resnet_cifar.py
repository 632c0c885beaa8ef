"""ResNet-20/32/44/56/110 for 32x32 images (He et al. 2016, "Deep Residual Learning for Image
Recognition", section 4.2).

Three stages of n basic blocks each (16, 32, 64 channels; depth = 6n + 2; resnet20: n=3,
resnet56: n=9), a 3x3 stem, global average pooling and one linear layer. Shortcuts where the
shape changes:

- option ``A`` (the paper's CIFAR choice, default): identity on the spatially subsampled input
  (stride 2) with zero-padded extra channels; adds no parameters. resnet20: 0.27M parameters
  (269,722 with 10 classes), resnet56: 0.85M (853,018).
- option ``B``: 1x1 convolution (stride 2) + BatchNorm projection.

Input (B, C, H, W) float (any H, W >= 8; C from the dataset); output (B, num_classes) logits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

SHORTCUTS = ("A", "B")


class _PadShortcut(nn.Module):
    """Option A: x[:, :, ::2, ::2] padded with zero channels to ``out_ch``."""

    def __init__(self, in_ch: int, out_ch: int, stride: int):
        super().__init__()
        self.stride, self.extra = stride, out_ch - in_ch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x[:, :, :: self.stride, :: self.stride]
        lo = self.extra // 2
        return F.pad(x, (0, 0, 0, 0, lo, self.extra - lo))


class BasicBlock(nn.Module):
    def __init__(self, in_ch: int, out_ch: int, stride: int, shortcut: str):
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_ch)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_ch)
        if stride == 1 and in_ch == out_ch:
            self.shortcut: nn.Module = nn.Identity()
        elif shortcut == "A":
            self.shortcut = _PadShortcut(in_ch, out_ch, stride)
        else:
            self.shortcut = nn.Sequential(nn.Conv2d(in_ch, out_ch, 1, stride, bias=False), nn.BatchNorm2d(out_ch))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class CifarResNet(nn.Module):
    """CIFAR ResNet of ``depth = 6n + 2`` layers (see module docstring).

    Raises:
        ValueError: ``depth`` is not 6n + 2 or ``shortcut`` not in ``A``/``B``.
    """

    def __init__(self, depth: int, num_classes: int, in_channels: int = 3, shortcut: str = "A"):
        super().__init__()
        if (depth - 2) % 6 or depth < 8:
            raise ValueError(f"depth must be 6n + 2 (20, 32, 44, 56, 110), got {depth}")
        if shortcut not in SHORTCUTS:
            raise ValueError(f"shortcut must be one of {SHORTCUTS}, got {shortcut!r}")
        n = (depth - 2) // 6
        self.conv = nn.Conv2d(in_channels, 16, 3, 1, 1, bias=False)
        self.bn = nn.BatchNorm2d(16)
        blocks, ch = [], 16
        for i, out in enumerate((16, 32, 64)):
            for j in range(n):
                blocks.append(BasicBlock(ch, out, 2 if (i > 0 and j == 0) else 1, shortcut))
                ch = out
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(64, num_classes)
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.kaiming_normal_(m.weight, nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(F.relu(self.bn(self.conv(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))
