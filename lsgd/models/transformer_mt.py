"""Encoder-decoder Transformer for translation (Vaswani et al. 2017, "Attention Is All You Need")
on ``torch.nn.Transformer``.

Input: one int64 tensor x (B, src_len + tgt_len) packed by :mod:`lsgd.data.translation`: the
source ids (padded with ``pad_id``) then the decoder input ids (BOS + target, padded). The model
splits it at ``src_len``. Output: logits (B, tgt_len, vocab_size); position j predicts target
token j from the source and decoder inputs 0..j.

- Embeddings: token embedding x sqrt(d_model) (Sec. 3.4) plus positions, then dropout (Sec. 5.4).
  ``positions=sinusoidal``: PE(p, 2i) = sin(p / 10000^(2i/d_model)), PE(p, 2i+1) = cos(...)
  (Sec. 3.5), computed in forward (no parameters, no buffer, so nothing extra is averaged or
  sent); ``learned``: one ``nn.Embedding`` per side (src_len and tgt_len positions).
- ``share_embeddings=true``: one matrix for source tokens, target tokens and the pre-softmax
  projection (Sec. 3.4, a shared source-target vocabulary); false: three separate matrices.
  Embeddings (tokens, learned positions) init N(0, d_model^-0.5) (as fairseq); ``nn.Transformer`` initializes its own
  weights with Xavier-uniform.
- Masks: causal target mask (position j attends to 0..j), key padding masks from ``pad_id`` on the
  source (encoder self-attention and cross-attention) and on the decoder input, all boolean
  (True = masked). Padded source positions therefore change no logit.
- ``norm_first=false``: post-norm layers as in the paper (``nn.Transformer`` adds a final
  LayerNorm after the encoder and the decoder stacks either way); ReLU feed-forward.
- Inference: :meth:`TransformerMT.greedy_decode` (argmax at each position, the source encoded once),
  at most source length + 50 tokens as in Vaswani et al. Sec. 6.1 (who use beam search, size 4, with
  length penalty 0.6; greedy decoding is the cheap evaluation-time stand-in), stopping at EOS.

Sizes (``model.size``; ``d_model``, ``nhead``, ``num_encoder_layers``, ``num_decoder_layers``,
``dim_feedforward``, ``dropout`` override them when set). Parameters with a shared 37,000-token
vocabulary (sinusoidal positions; Vaswani et al. Table 3 report 65M for base, 213M for big):

=======  =======  =====  ===========  =====  =======  ====================
size     d_model  heads  layers       ffn    dropout  params (vocab 37000)
=======  =======  =====  ===========  =====  =======  ====================
``tiny``  32      2      2 + 2        64     0.0      test size
``base``  512     8      6 + 6        2048   0.1      63.1M
``big``   1024    16     6 + 6        4096   0.3      214.2M
=======  =======  =====  ===========  =====  =======  ====================

(Big uses dropout 0.3 on EN-DE, 0.1 on EN-FR in the paper.)
"""

from __future__ import annotations

import math

import torch
from torch import nn

# size -> d_model, nhead, num_encoder_layers, num_decoder_layers, dim_feedforward, dropout
SIZES = {
    "tiny": {"d_model": 32, "nhead": 2, "num_encoder_layers": 2, "num_decoder_layers": 2, "dim_feedforward": 64, "dropout": 0.0},
    "base": {"d_model": 512, "nhead": 8, "num_encoder_layers": 6, "num_decoder_layers": 6, "dim_feedforward": 2048, "dropout": 0.1},
    "big": {"d_model": 1024, "nhead": 16, "num_encoder_layers": 6, "num_decoder_layers": 6, "dim_feedforward": 4096, "dropout": 0.3},
}
DIMS = tuple(SIZES["base"])
#: greedy decoding's output limit beyond the source length, in tokens (Vaswani et al. 2017, Sec. 6.1)
MAX_EXTRA = 50
POSITIONS = ("sinusoidal", "learned")


def sinusoidal_positions(length: int, d_model: int, device=None, dtype=torch.float32) -> torch.Tensor:
    """Vaswani et al. Sec. 3.5: (length, d_model) with PE(p, 2i) = sin(p / 10000^(2i/d_model)),
    PE(p, 2i+1) = cos(p / 10000^(2i/d_model))."""
    pos = torch.arange(length, device=device, dtype=torch.float32)[:, None]
    inv = torch.exp(torch.arange(0, d_model, 2, device=device, dtype=torch.float32) * (-math.log(10000.0) / d_model))
    pe = torch.zeros(length, d_model, device=device, dtype=torch.float32)
    pe[:, 0::2] = torch.sin(pos * inv)
    pe[:, 1::2] = torch.cos(pos * inv)
    return pe.to(dtype)


class TransformerMT(nn.Module):
    """Encoder-decoder Transformer over packed inputs (module docstring).

    Args:
        vocab_size: shared source/target vocabulary, special ids included.
        src_len, tgt_len: the split of the input: x[:, :src_len] is the source, the rest
            (tgt_len positions) the decoder input. ``src_len`` is a plain attribute.
        pad_id: padding id in both parts (masked as keys).
        d_model, nhead, num_encoder_layers, num_decoder_layers, dim_feedforward, dropout:
            ``torch.nn.Transformer``'s.
        positions: ``sinusoidal`` or ``learned``.
        norm_first: pre-norm layers (false: post-norm, the paper's).
        share_embeddings: one matrix for source, target and output projection.
    Raises:
        ValueError: ``d_model`` not divisible by ``nhead``, odd ``d_model`` with sinusoidal
            positions, unknown ``positions`` (constructor); an input wider than
            src_len + tgt_len or with no target positions (forward).
    """

    def __init__(
        self,
        vocab_size: int,
        src_len: int,
        tgt_len: int,
        pad_id: int,
        d_model: int = 512,
        nhead: int = 8,
        num_encoder_layers: int = 6,
        num_decoder_layers: int = 6,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        positions: str = "sinusoidal",
        norm_first: bool = False,
        share_embeddings: bool = True,
    ):
        super().__init__()
        if d_model % nhead:
            raise ValueError(f"d_model ({d_model}) must be divisible by nhead ({nhead})")
        if positions not in POSITIONS:
            raise ValueError(f"positions must be one of {', '.join(POSITIONS)}; got {positions!r}")
        if positions == "sinusoidal" and d_model % 2:
            raise ValueError(f"sinusoidal positions need an even d_model; got {d_model}")
        self.src_len, self.tgt_len, self.pad_id = src_len, tgt_len, pad_id
        self.d_model, self.positions = d_model, positions
        self.src_embed = nn.Embedding(vocab_size, d_model)
        self.tgt_embed = self.src_embed if share_embeddings else nn.Embedding(vocab_size, d_model)
        if positions == "learned":
            self.src_pos = nn.Embedding(src_len, d_model)
            self.tgt_pos = nn.Embedding(tgt_len, d_model)
        self.drop = nn.Dropout(dropout)
        # the encoder as nn.Transformer builds it, but without the prototype nested-tensor fast
        # path (inference only; it warns and returns zeros at padded positions)
        layer = nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout, batch_first=True, norm_first=norm_first)
        encoder = nn.TransformerEncoder(layer, num_encoder_layers, nn.LayerNorm(d_model), enable_nested_tensor=False)
        self.transformer = nn.Transformer(
            d_model, nhead, num_encoder_layers, num_decoder_layers, dim_feedforward, dropout,
            custom_encoder=encoder, batch_first=True, norm_first=norm_first,
        )
        self.out = nn.Linear(d_model, vocab_size, bias=False)
        init = [self.src_embed] if share_embeddings else [self.src_embed, self.tgt_embed, self.out]
        if positions == "learned":
            init += [self.src_pos, self.tgt_pos]
        for m in init:  # a fixed order: every rank draws the same initial weights from the same seed
            nn.init.normal_(m.weight, 0.0, d_model**-0.5)
        if share_embeddings:
            self.out.weight = self.src_embed.weight

    def _embed(self, ids: torch.Tensor, embed: nn.Embedding, pos: str) -> torch.Tensor:
        h = embed(ids) * math.sqrt(self.d_model)
        t = ids.shape[1]
        if self.positions == "learned":
            table = getattr(self, pos)
            if t > table.num_embeddings:
                raise ValueError(f"{t} positions exceed the learned table's {table.num_embeddings}")
            h = h + table(torch.arange(t, device=ids.device))
        else:
            h = h + sinusoidal_positions(t, self.d_model, ids.device, h.dtype)
        return self.drop(h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x int64 (B, src_len + T), T <= tgt_len -> logits (B, T, vocab_size)."""
        src, tgt = x[:, : self.src_len], x[:, self.src_len :]
        t = tgt.shape[1]
        if t < 1 or t > self.tgt_len:
            raise ValueError(
                f"input width {x.shape[1]}: need src_len ({self.src_len}) + 1 .. src_len + tgt_len ({self.tgt_len})"
            )
        src_pad = src == self.pad_id
        tgt_pad = tgt == self.pad_id
        causal = torch.triu(torch.ones(t, t, dtype=torch.bool, device=x.device), diagonal=1)
        h = self.transformer(
            self._embed(src, self.src_embed, "src_pos"),
            self._embed(tgt, self.tgt_embed, "tgt_pos"),
            tgt_mask=causal,
            src_key_padding_mask=src_pad,
            tgt_key_padding_mask=tgt_pad,
            memory_key_padding_mask=src_pad,
            tgt_is_causal=True,
        )
        return self.out(h)

    @torch.no_grad()
    def greedy_decode(
        self, src: torch.Tensor, bos_id: int, eos_id: int, max_extra: int = MAX_EXTRA, max_len: int | None = None
    ) -> torch.Tensor:
        """Greedy (argmax) translation of each source row, one target token at a time.

        The source is encoded once; step t runs the decoder on BOS + the t tokens chosen so far
        (the same masks and positions as :meth:`forward`, so the chosen token is the argmax of
        :meth:`forward`'s logits at that position given that prefix). A row stops after it emits
        ``eos_id`` or after L_i = min(n_i + ``max_extra``, ``max_len``) tokens, n_i its source
        length in tokens (its positions that are not ``pad_id``, less the EOS that ends every
        packed source): Vaswani et al. 2017,
        Sec. 6.1, "maximum output length ... input length + 50, but terminate early when
        possible". Call it in eval mode (dropout off).

        Args:
            src: int64 (B, S), S <= src_len: source ids + EOS, padded with ``pad_id`` (the
                first ``src_len`` columns of the packed input).
            bos_id, eos_id: the decoder's start token and the end token.
            max_extra: tokens allowed beyond the source length (>= 0).
            max_len: cap on the tokens of a row (None: ``tgt_len``, the decoder positions trained).
        Returns:
            int64 (B, T), T <= max L_i: row i holds its tokens, then ``eos_id`` if it emitted one,
            then ``pad_id``.
        Raises:
            ValueError: ``max_len`` outside 1..tgt_len, ``max_extra`` < 0, or a source wider than
                src_len.
        """
        cap = self.tgt_len if max_len is None else int(max_len)
        if not 1 <= cap <= self.tgt_len:
            raise ValueError(f"max_len must be in 1..tgt_len ({self.tgt_len}); got {max_len}")
        if max_extra < 0:
            raise ValueError(f"max_extra must be >= 0; got {max_extra}")
        if src.shape[1] > self.src_len:
            raise ValueError(f"source width {src.shape[1]} exceeds src_len ({self.src_len})")
        b, device = src.shape[0], src.device
        src_pad = src == self.pad_id
        n = torch.clamp((~src_pad).sum(1) - 1, min=0)
        limit = torch.clamp(n + int(max_extra), max=cap)
        memory = self.transformer.encoder(self._embed(src, self.src_embed, "src_pos"), src_key_padding_mask=src_pad)
        ys = torch.full((b, 1), bos_id, dtype=torch.long, device=device)
        done = limit <= 0
        for t in range(int(limit.max()) if b else 0):
            causal = torch.triu(torch.ones(t + 1, t + 1, dtype=torch.bool, device=device), diagonal=1)
            h = self.transformer.decoder(
                self._embed(ys, self.tgt_embed, "tgt_pos"), memory, tgt_mask=causal,
                tgt_key_padding_mask=ys == self.pad_id, memory_key_padding_mask=src_pad, tgt_is_causal=True,
            )
            nxt = self.out(h[:, -1]).argmax(-1)
            nxt = torch.where(done, torch.full_like(nxt, self.pad_id), nxt)
            ys = torch.cat([ys, nxt[:, None]], dim=1)
            done = done | (nxt == eos_id) | (t + 1 >= limit)
            if bool(done.all()):
                break
        return ys[:, 1:]
