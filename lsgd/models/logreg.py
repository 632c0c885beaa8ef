"""Multinomial logistic regression: the convex model of the local-vs-minibatch SGD study.

Model (``model=logreg``): ``logits = W vec(x) + c`` with ``W`` of shape (num_classes, C*H*W) and
``c`` of shape (num_classes,), one :class:`torch.nn.Linear` on the flattened image. With the
trainer's cross-entropy loss (softmax over the logits) the training objective
``F(W, c) = E_(x,y) [ -log softmax(W vec(x) + c)_y ]`` is convex in ``(W, c)``: the logits are
linear in the parameters and log-sum-exp is convex. L2 regularization is the optimizer's
``optim.weight_decay`` = lambda: torch's SGD adds ``lambda * theta`` to the gradient of every
parameter (bias included), i.e. it minimizes ``F + (lambda / 2) ||(W, c)||^2``, which is then
lambda-strongly convex.

Parameters: ``(C*H*W + 1) * num_classes``; on Fashion-MNIST (1x28x28, 10 classes) 7,850, and one
forward pass costs C*H*W*num_classes = 7,840 multiply-adds per sample.

``model.init``: ``zeros`` (default) starts at ``W = 0, c = 0`` (the usual x_0 = 0 of convex
optimization analyses; every arm of a study starts at the same point with loss log(num_classes));
``torch`` keeps :class:`torch.nn.Linear`'s default initialization (uniform in +-1/sqrt(C*H*W)).

Input (B, C, H, W) float; output (B, num_classes) logits.

Study: Woodworth, Patel, Stich, Dai, Bullins, McMahan, Shamir, Srebro. *Is Local SGD Better than
Minibatch SGD?* ICML 2020 (conf/experiment/local_vs_minibatch.yaml).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

INITS = ("zeros", "torch")


class LogisticRegression(nn.Module):
    """``Flatten -> Linear(C*H*W, num_classes)``; see the module docstring.

    Args:
        input_shape: one sample's (C, H, W).
        num_classes: number of classes (logits per sample).
        init: ``zeros`` or ``torch`` (see the module docstring).
    Raises:
        ValueError: ``init`` not in :data:`INITS`.
    """

    def __init__(self, input_shape: Sequence[int], num_classes: int, init: str = "zeros"):
        super().__init__()
        if init not in INITS:
            raise ValueError(f"init must be one of {', '.join(INITS)}; got {init!r}")
        self.flatten = nn.Flatten()
        self.linear = nn.Linear(math.prod(int(s) for s in input_shape), num_classes)
        if init == "zeros":
            nn.init.zeros_(self.linear.weight)
            nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(self.flatten(x))
