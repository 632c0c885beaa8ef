"""A GPT-2-style decoder-only transformer (after karpathy/nanoGPT).

Pre-norm blocks ``x + attn(LN(x))``, ``x + mlp(LN(x))``; causal multi-head self-attention through
``F.scaled_dot_product_attention(is_causal=True)``; MLP ``Linear(d, 4d) -> GELU -> Linear(4d, d)``;
learned position embeddings; final LayerNorm; the LM head shares the token embedding matrix.
Init: N(0, 0.02), residual output projections N(0, 0.02 / sqrt(2 n_layer)) (GPT-2).

Sizes (``model.size``), parameter counts with the byte tokenizer (vocab 257) and seq_len 256
(tied embeddings counted once; "non-embedding" excludes token and position embeddings):

============  =======  ======  ======  ===============  ===========================
size          n_layer  n_head  n_embd  non-embedding    total (vocab 257, T 256)
============  =======  ======  ======  ===============  ===========================
``tiny``      2        2       64      0.10M (100,096)  0.13M (132,928)
``20m``       6        8       512     18.9M            19.2M
``60m``       12       10      640     59.1M            59.4M
``150m``      12       16      1024    151.2M           151.7M
============  =======  ======  ======  ===============  ===========================

With GPT-2's tokenizer (vocab 50,257) add 50257 x n_embd embedding parameters (e.g. 25.7M for 20m).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

# size -> (n_layer, n_head, n_embd)
SIZES = {"tiny": (2, 2, 64), "20m": (6, 8, 512), "60m": (12, 10, 640), "150m": (12, 16, 1024)}


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float, bias: bool):
        super().__init__()
        self.n_head, self.dropout = n_head, dropout
        self.qkv = nn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.resid_drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in self.qkv(x).split(c, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        return self.resid_drop(self.proj(y.transpose(1, 2).reshape(b, t, c)))


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float, bias: bool):
        super().__init__()
        self.ln1 = nn.LayerNorm(n_embd, bias=bias)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout, bias)
        self.ln2 = nn.LayerNorm(n_embd, bias=bias)
        self.mlp = nn.Sequential(
            nn.Linear(n_embd, 4 * n_embd, bias=bias),
            nn.GELU(),
            nn.Linear(4 * n_embd, n_embd, bias=bias),
            nn.Dropout(dropout),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Decoder-only transformer (see module docstring).

    Input (B, T) int64 token ids with T <= block_size; output (B, T, vocab_size) logits.
    ``vocab_multiple``: the embedding's rows are vocab_size rounded up to a multiple of it (padding
    rows are never used; the logits are cut back to vocab_size).

    Raises:
        ValueError: ``n_embd`` not divisible by ``n_head``, ``vocab_multiple`` < 1 (constructor);
            T > block_size (forward).
    """

    def __init__(
        self,
        vocab_size: int,
        block_size: int,
        n_layer: int,
        n_head: int,
        n_embd: int,
        dropout: float = 0.0,
        bias: bool = True,
        vocab_multiple: int = 1,
    ):
        super().__init__()
        if n_embd % n_head:
            raise ValueError(f"n_embd ({n_embd}) must be divisible by n_head ({n_head})")
        if vocab_multiple < 1:
            raise ValueError(f"vocab_multiple must be >= 1, got {vocab_multiple}")
        self.block_size = block_size
        self.vocab_size = vocab_size
        # rows of the tied embedding: the vocabulary padded up to a multiple of vocab_multiple (nanoGPT's
        # 50257 -> 50304, OLMo's 50280 -> 50304), so chunked compressors (DeMo, SparseLoCo) tile the matrix in
        # full chunks; the padded rows are never looked up and their logits are cut off in forward
        rows = -(-vocab_size // vocab_multiple) * vocab_multiple
        self.wte = nn.Embedding(rows, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(n_embd, n_head, dropout, bias) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd, bias=bias)
        self.lm_head = nn.Linear(n_embd, rows, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith("attn.proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * n_layer))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, 0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def num_params(self, non_embedding: bool = False) -> int:
        """Parameters (tied embedding counted once); ``non_embedding`` excludes wte and wpe."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.wte.weight.numel() - self.wpe.weight.numel() if non_embedding else n

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        if t > self.block_size:
            raise ValueError(f"sequence length {t} exceeds block_size {self.block_size}")
        pos = torch.arange(t, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return logits if logits.shape[-1] == self.vocab_size else logits[..., : self.vocab_size]
