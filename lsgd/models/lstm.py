"""An LSTM language model (Zaremba et al. 2014 style; Merity et al. 2017 weight tying)."""

from __future__ import annotations

import torch
from torch import nn


class LSTMLM(nn.Module):
    """``Embedding(vocab, embed_dim) -> dropout -> LSTM(num_layers, hidden_dim, dropout between
    layers) -> dropout -> Linear(hidden_dim, vocab)``; with ``tie_weights`` the output layer shares
    the embedding matrix (needs ``embed_dim == hidden_dim``; Press & Wolf 2017).

    Each batch starts from a zero hidden state (packed blocks are independent sequences).
    Input (B, T) int64 token ids; output (B, T, vocab) logits.

    Raises:
        ValueError: ``tie_weights`` with ``embed_dim != hidden_dim``.
    """

    def __init__(
        self,
        vocab_size: int,
        embed_dim: int = 256,
        hidden_dim: int = 256,
        num_layers: int = 2,
        dropout: float = 0.2,
        tie_weights: bool = True,
    ):
        super().__init__()
        if tie_weights and embed_dim != hidden_dim:
            raise ValueError(f"tie_weights needs embed_dim == hidden_dim, got {embed_dim} and {hidden_dim}")
        self.embed = nn.Embedding(vocab_size, embed_dim)
        self.drop = nn.Dropout(dropout)
        self.lstm = nn.LSTM(embed_dim, hidden_dim, num_layers, dropout=dropout if num_layers > 1 else 0.0, batch_first=True)
        self.decoder = nn.Linear(hidden_dim, vocab_size)
        nn.init.uniform_(self.embed.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)
        if tie_weights:
            self.decoder.weight = self.embed.weight
        else:
            nn.init.uniform_(self.decoder.weight, -0.1, 0.1)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.drop(self.embed(idx)))
        return self.decoder(self.drop(out))
