"""A reference DeMo for the tests: the single-process semantics of the authors' optimizer, written
for the tests from github.com/bloc97/DeMo ``demo.py`` (commit cab4606, classes ``DeMo``,
``TransformDCT``, ``CompressDCT`` and the helpers ``_dct``, ``_idct``, ``_get_smaller_split``), step
by step in its order, independent of lsgd's implementation (:mod:`lsgd.compression.dct`,
:mod:`lsgd.algorithms.gradient_compression.demo`):

* ``ReferenceDeMo`` is a ``torch.optim.SGD`` with momentum, dampening and weight decay 0 whose
  ``step`` does, for each parameter of each group in order: ``p *= 1 - lr wd``;
  ``delta = beta delta + lr g``; DCT of ``delta`` per chunk; top-k magnitudes per chunk
  (``torch.topk(..., sorted=False)``, int64 indices); ``delta -= IDCT(selection)``; all-gather of
  indices and values (two collectives per parameter); the gathered selections concatenated in
  rank order along the last dimension and scattered with ``scatter_reduce_(reduce="mean",
  include_self=False)``; ``p.grad = sign(IDCT(...))``; then SGD's own step ``p -= lr p.grad``;
* the DCT basis as ``demo.py`` makes it: an FFT-based DCT-II / its inverse (Makhoul's algorithm,
  which ``demo.py`` takes from github.com/zh217/torch-dct) applied to the identity in torch's
  default dtype, ``norm="ortho"``, cast to the parameter's dtype, used through ``einsum`` with
  ``demo.py``'s index patterns (``"...ijkl, jb, ld -> ...ikbd"``, ``"...ijkl, kb, ld -> ...ibjd"``);
* chunk sizes by ``demo.py``'s divisor enumeration (largest divisor <= target, else n);
* ``einops.rearrange`` (not installed here) replaced by the equivalent ``reshape``s.

Like ``demo.py`` it handles 1-D and 2-D parameters only. ``gather(idx, val)`` replaces
``torch.distributed.all_gather`` (default: one worker, ``[idx], [val]``), so several instances can
run as the workers of one process (:class:`ThreadGather`).
"""

from __future__ import annotations

import math
import threading

import torch


def _dct_ortho(x: torch.Tensor) -> torch.Tensor:
    """DCT-II with ``norm="ortho"`` over the last dimension, through one FFT (Makhoul 1980)."""
    shape, n = x.shape, x.shape[-1]
    x = x.contiguous().view(-1, n)
    v = torch.cat([x[:, ::2], x[:, 1::2].flip([1])], dim=1)
    vc = torch.view_as_real(torch.fft.fft(v, dim=1))
    k = -torch.arange(n, dtype=x.dtype, device=x.device)[None, :] * math.pi / (2 * n)
    out = vc[:, :, 0] * torch.cos(k) - vc[:, :, 1] * torch.sin(k)
    out[:, 0] /= math.sqrt(n) * 2
    out[:, 1:] /= math.sqrt(n / 2) * 2
    return (2 * out).view(*shape)


def _idct_ortho(X: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`_dct_ortho` over the last dimension, through one inverse real FFT."""
    shape, n = X.shape, X.shape[-1]
    xv = X.contiguous().view(-1, n) / 2
    xv[:, 0] *= math.sqrt(n) * 2
    xv[:, 1:] *= math.sqrt(n / 2) * 2
    k = torch.arange(n, dtype=X.dtype, device=X.device)[None, :] * math.pi / (2 * n)
    wr, wi = torch.cos(k), torch.sin(k)
    vtr = xv
    vti = torch.cat([xv[:, :1] * 0, -xv.flip([1])[:, :-1]], dim=1)
    vr = vtr * wr - vti * wi
    vi = vtr * wi + vti * wr
    v = torch.fft.irfft(torch.view_as_complex(torch.stack([vr, vi], dim=2)), n=n, dim=1)
    x = v.new_zeros(v.shape)
    x[:, ::2] += v[:, : n - (n // 2)]
    x[:, 1::2] += v.flip([1])[:, : n // 2]
    return x.view(*shape)


def divisors(n: int) -> list[int]:
    """All divisors of ``n``, ascending."""
    return sorted({d for i in range(1, math.isqrt(n) + 1) if n % i == 0 for d in (i, n // i)})


def smaller_split(n: int, close_to: int) -> int:
    """``demo.py``'s ``_get_smaller_split``: walk the divisors upwards; the target itself if it
    divides ``n``, else the last one below the first divisor above the target, else ``n``."""
    all_divisors = divisors(n)
    for ix, val in enumerate(all_divisors):
        if val == close_to:
            return val
        if val > close_to:
            return val if ix == 0 else all_divisors[ix - 1]
    return n


class Transform:
    """``demo.py``'s ``TransformDCT``: a chunk size per dimension size, the basis matrices per chunk
    size (``f = dct(I)``, ``b = idct(I)``)."""

    def __init__(self, param_groups, target_chunk: int):
        self.shape_dict, self.f_dict, self.b_dict = {}, {}, {}
        for group in param_groups:
            for p in group["params"]:
                if not p.requires_grad:
                    continue
                for s in p.shape:
                    sc = smaller_split(s, target_chunk)
                    self.shape_dict[s] = sc
                    if sc not in self.f_dict:
                        eye = torch.eye(sc)  # torch's default dtype, as demo.py
                        self.f_dict[sc] = _dct_ortho(eye).to(p.dtype)
                        self.b_dict[sc] = _idct_ortho(eye).to(p.dtype)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() > 1:  # "(y h) (x w) -> y h x w", then "...ijkl, jb, ld -> ...ikbd"
            n1, n2 = self.shape_dict[x.shape[0]], self.shape_dict[x.shape[1]]
            x = x.reshape(x.shape[0] // n1, n1, x.shape[1] // n2, n2)
            return torch.einsum("...ijkl, jb, ld -> ...ikbd", x, self.f_dict[n1], self.f_dict[n2])
        n1 = self.shape_dict[x.shape[0]]  # "(x w) -> x w", then "...ij, jb -> ...ib"
        return torch.einsum("...ij, jb -> ...ib", x.reshape(-1, n1), self.f_dict[n1])

    def decode(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() > 2:  # "...ijkl, kb, ld -> ...ibjd", then "y h x w -> (y h) (x w)"
            n1, n2 = x.shape[2], x.shape[3]
            x = torch.einsum("...ijkl, kb, ld -> ...ibjd", x, self.b_dict[n1], self.b_dict[n2])
            return x.reshape(x.shape[0] * x.shape[1], x.shape[2] * x.shape[3])
        n1 = x.shape[1]  # "...ij, jb -> ...ib", then "x w -> (x w)"
        return torch.einsum("...ij, jb -> ...ib", x, self.b_dict[n1]).reshape(-1)


class Compress:
    """``demo.py``'s ``CompressDCT``."""

    def compress(self, x: torch.Tensor, topk: int):
        xshape = x.shape
        if x.dim() > 2:  # "y x h w -> y x (h w)"
            x = x.reshape(xshape[0], xshape[1], xshape[2] * xshape[3])
        totalk = x.shape[-1]
        topk = max(1, min(topk, x.shape[-1]))
        idx = torch.topk(x.abs(), k=topk, dim=-1, largest=True, sorted=False).indices
        return idx, torch.gather(x, dim=-1, index=idx), xshape, totalk

    def decompress(self, p, idx, val, xshape, totalk):
        x = torch.zeros(xshape, device=p.device, dtype=p.dtype)
        if len(xshape) > 2:  # "y x h w -> y x (h w)" (a view: the scatter writes into x)
            x = x.reshape(xshape[0], xshape[1], xshape[2] * xshape[3])
        x.scatter_reduce_(dim=-1, index=idx, src=val, reduce="mean", include_self=False)
        if len(x.shape) > 2:  # "y x (h w) -> y x h w"
            x = x.reshape(xshape)
        return x

    def batch_decompress(self, p, idx, val, xshape, totalk):
        return self.decompress(p, torch.cat(idx, dim=-1), torch.cat(val, dim=-1), xshape, totalk)


def single_gather(idx: torch.Tensor, val: torch.Tensor):
    """One worker's all-gather: its own lists."""
    return [idx], [val]


class ReferenceDeMo(torch.optim.SGD):
    """``demo.py``'s ``DeMo`` (module docstring); ``gather`` stands for its ``_demo_all_gather``."""

    def __init__(self, params, compression_decay: float = 0.999, compression_topk: int = 32,
                 compression_chunk: int = 64, weight_decay: float = 0.0, gather=single_gather, **kwargs):
        super().__init__(params, foreach=False, momentum=0.0, dampening=0.0, nesterov=False, maximize=False,
                         weight_decay=0.0, **kwargs)
        self.compression_decay, self.compression_topk = compression_decay, compression_topk
        self.weight_decay, self.gather = weight_decay, gather
        self.demo_state = {p: {"step": 0, "delta": torch.zeros_like(p)}
                           for group in self.param_groups for p in group["params"] if p.requires_grad}
        self.transform = Transform(self.param_groups, compression_chunk)
        self.compress = Compress()
        self.data_transmit = 0

    @torch.no_grad()
    def step(self, closure=None):
        self.data_transmit = 0
        for group in self.param_groups:
            lr = group["lr"]
            for p in group["params"]:
                if not p.requires_grad:
                    continue
                state = self.demo_state[p]
                state["step"] += 1
                if self.weight_decay != 0.0:
                    p.data.mul_(1.0 - lr * self.weight_decay)
                if self.compression_decay != 1:
                    state["delta"].mul_(self.compression_decay)
                state["delta"].add_(p.grad, alpha=lr)
                idx, val, xshape, totalk = self.compress.compress(self.transform.encode(state["delta"]),
                                                                  self.compression_topk)
                state["delta"].sub_(self.transform.decode(self.compress.decompress(p, idx, val, xshape, totalk)))
                idx_list, val_list = self.gather(idx, val)
                self.data_transmit += idx.nbytes + val.nbytes
                new_grad = self.transform.decode(self.compress.batch_decompress(p, idx_list, val_list, xshape, totalk))
                p.grad.copy_(new_grad)
                p.grad.sign_()
        return super().step(closure)


class ThreadGather:
    """The all-gather of ``n`` reference workers run as threads of one process: each worker's
    ``gather(idx, val)`` (its rank bound by :meth:`for_rank`) returns every worker's tensors in rank
    order once all have posted theirs."""

    def __init__(self, n: int):
        self.slots: list = [None] * n
        self.barrier = threading.Barrier(n)

    def for_rank(self, rank: int):
        def gather(idx, val):
            self.slots[rank] = (idx.clone(), val.clone())
            self.barrier.wait()
            out = list(self.slots)
            self.barrier.wait()  # nobody posts the next tensor before everyone has read this one
            return [o[0] for o in out], [o[1] for o in out]
        return gather
