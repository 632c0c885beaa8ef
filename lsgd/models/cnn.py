"""A small convolutional net for small grayscale or color images (Fashion-MNIST, synthetic)."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn


class SmallCNN(nn.Sequential):
    """Two conv blocks ``conv 5x5 (padding 2) -> BatchNorm -> ReLU -> max-pool 2`` then
    ``Linear(hidden) -> ReLU -> Linear(num_classes)``.

    With the defaults (channels 16, 32; hidden 128) on 1x28x28 input: 215,418 parameters,
    ~3 MFLOP-pairs (multiply-adds) per sample. BatchNorm's running statistics are buffers, so
    buffer averaging across workers matters.

    Input (B, C, H, W) float; output (B, num_classes) logits.
    """

    def __init__(self, input_shape: Sequence[int], num_classes: int, channels: Sequence[int] = (16, 32), hidden: int = 128):
        c, h, w = input_shape
        layers: list[nn.Module] = []
        for out in channels:
            layers += [nn.Conv2d(c, out, 5, padding=2, bias=False), nn.BatchNorm2d(out), nn.ReLU(inplace=True), nn.MaxPool2d(2)]
            c, h, w = out, h // 2, w // 2
        layers += [nn.Flatten(), nn.Linear(c * h * w, hidden), nn.ReLU(inplace=True), nn.Linear(hidden, num_classes)]
        super().__init__(*layers)
