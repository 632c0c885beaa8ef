"""PowerSGD through torch's own DDP comm hook, with exact byte accounting.

PowerSGD (Vogels, Karimireddy and Jaggi, NeurIPS 2019, Algorithm 1) is not reimplemented here:
:class:`PowerSGD` builds torch's :class:`~torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook.PowerSGDState`
(rank, ``start_powerSGD_iter``, error feedback, warm start, ``min_compression_rate``) and runs
torch's ``powerSGD_hook`` on every DDP bucket. This module only wraps the hook to count what it
sends, following the hook's own rules (``torch/distributed/algorithms/ddp_comm_hooks/powerSGD_hook.py``):

* before ``start_powerSGD_iter`` iterations: one all-reduce of the whole bucket (vanilla DDP);
* on gloo each bucket's chain of all-reduces completes inside the hook (torch issues the P and Q
  all-reduces from future callbacks, which with several buckets in flight can reach gloo in a
  different order on different ranks, a collective mismatch); on NCCL it overlaps backward;
* afterwards, per bucket, three all-reduces: the concatenation of the tensors that are not worth
  compressing (vectors, and matrices failing ``(n + m) r min_compression_rate < n m``), the
  concatenated P factors (``n x r`` per compressed ``n x m`` matrix, ``r = min(n, m, rank)``),
  and the concatenated Q factors (``m x r``).

Payload bytes = elements x element size of the gradient dtype. The counted element total is
checked against the hook's own ``total_numel_after_compression`` counter on every call, so a change
of torch's rule cannot silently break the accounting.

PowerSGD has no per-tensor ``compress``/``decompress``: torch's hook works on DDP buckets (its
power iteration needs the all-reduce of P between the two matrix products), so ``powersgd`` is
selected through ``algo=compressed algo.compressor=powersgd`` (a DDP comm hook), not through
:func:`lsgd.compression.build`.
"""

from __future__ import annotations

import contextlib
import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as torch_powersgd

from lsgd.comm.communicator import Communicator


def bucket_payload(state: torch_powersgd.PowerSGDState, tensors: list[torch.Tensor]) -> tuple[int, int, int]:
    """Elements (uncompressed, P, Q) torch's ``powerSGD_hook`` all-reduces for a bucket of ``tensors``
    once compression has started (torch's ``_should_compress`` rule, see the module docstring)."""
    uncompressed = p_size = q_size = 0
    for tensor in tensors:
        n = tensor.shape[0] if tensor.dim() > 0 else 1
        m = tensor.numel() // max(n, 1)
        r = min(n, m, state.matrix_approximation_rank)
        if tensor.dim() > 1 and torch_powersgd._should_compress(n, m, r, state.min_compression_rate)[0]:
            p_size += n * r
            q_size += m * r
        else:
            uncompressed += tensor.numel()
    return uncompressed, p_size, q_size


def compression_flops(state: torch_powersgd.PowerSGDState, tensors: list[torch.Tensor]) -> float:
    """FLOPs torch's ``powerSGD_hook`` spends compressing and decompressing a bucket (after
    ``start_powerSGD_iter``): per compressed ``n x m`` matrix of rank ``r``, P = M Q, Q = M^T P and
    the decompression M = P Q^T (``2 n m r`` each) plus the Gram-Schmidt orthogonalization of P
    (``2 n r^2``); Vogels et al. 2019, Algorithm 1. Element-wise work (error feedback) is not counted."""
    flops = 0.0
    for tensor in tensors:
        n = tensor.shape[0] if tensor.dim() > 0 else 1
        m = tensor.numel() // max(n, 1)
        r = min(n, m, state.matrix_approximation_rank)
        if tensor.dim() > 1 and torch_powersgd._should_compress(n, m, r, state.min_compression_rate)[0]:
            flops += 6 * n * m * r + 2 * n * r * r
    return flops


class PowerSGD:
    """torch's PowerSGD hook with its state, counting every all-reduce on a :class:`Communicator`.

    Args:
        comm: the accounting communicator (its ``group`` is the hook's process group).
        rank: ``matrix_approximation_rank`` r >= 1.
        start_iter: ``start_powerSGD_iter``: vanilla all-reduce before it (torch requires > 1
            with error feedback or warm start; we pass max(start_iter, 2) in that case).
        error_feedback: ``use_error_feedback`` (per-bucket residual memory).
        warm_start: ``warm_start`` (reuse Q across iterations).
        min_compression_rate: torch's threshold below which a matrix is sent uncompressed.
        seed: ``random_seed`` of the initial Q.

    Raises:
        ValueError: ``rank < 1``.
    """

    def __init__(
        self,
        comm: Communicator,
        rank: int = 1,
        start_iter: int = 10,
        error_feedback: bool = True,
        warm_start: bool = True,
        min_compression_rate: float = 2.0,
        seed: int = 0,
    ):
        if int(rank) < 1:
            raise ValueError(f"powersgd rank must be an integer >= 1, got {rank!r}")
        self.comm = comm
        start = int(start_iter)
        if error_feedback or warm_start:
            start = max(start, 2)  # torch asserts start_powerSGD_iter > 1 with EF / warm start
        self.state = torch_powersgd.PowerSGDState(
            process_group=comm.group,
            matrix_approximation_rank=int(rank),
            start_powerSGD_iter=start,
            min_compression_rate=float(min_compression_rate),
            use_error_feedback=bool(error_feedback),
            warm_start=bool(warm_start),
            random_seed=int(seed),
        )
        # torch's hook issues the P and Q all-reduces from future callbacks; with several buckets in
        # flight on gloo the ranks can issue them in different orders (a collective mismatch that
        # aborts gloo), so on gloo each bucket's chain completes inside the hook.
        self.overlap = dist.is_initialized() and dist.get_backend(comm.group) == "nccl"
        self.step_flops = 0.0  # compression FLOPs since pop_flops() (compute, not communication)
        self.dense_bytes = 0  # bytes of the buckets handed to the hook (what plain DDP would send)
        self.sent_bytes = 0   # bytes the hook all-reduced

    @property
    def rank(self) -> int:
        return self.state.matrix_approximation_rank

    def hook(self, _unused_state, bucket):  # no return annotation: DDP inspects it
        """DDP comm hook: run torch's ``powerSGD_hook`` on ``bucket`` and count its all-reduces."""
        state = self.state
        buf = bucket.buffer()
        esize = buf.element_size()
        t0 = time.perf_counter()
        if state.iter < state.start_powerSGD_iter:
            sizes = [buf.numel()]
            with self._blocking():
                fut = torch_powersgd.powerSGD_hook(state, bucket)
        else:
            u, p, q = bucket_payload(state, bucket.gradients())
            self.step_flops += compression_flops(state, bucket.gradients())
            before = state.total_numel_after_compression
            with self._blocking():
                fut = torch_powersgd.powerSGD_hook(state, bucket)
            sent = state.total_numel_after_compression - before
            if sent != u + p + q:  # torch counts uncompressed + (n + m) r per matrix
                raise RuntimeError(
                    f"PowerSGD byte accounting out of step with torch's hook: counted {u + p + q} "
                    f"elements, torch reports {sent}"
                )
            sizes = [u, p, q]
        self.dense_bytes += buf.numel() * esize
        self.sent_bytes += sum(sizes) * esize
        for n in sizes:  # clocked from the enclosing Communicator.overlap (the bucket's ready time)
            self.comm.issued("all_reduce", n * esize)

        def _done(f):
            # the chain's compression compute is compute: never subtracted from the measured step
            self.comm.add_time(time.perf_counter() - t0, overlapped=True)
            return f.value()

        fut = fut.then(_done)
        if not self.overlap:
            with self._blocking():
                fut.wait()
        return fut

    def _blocking(self):
        """On gloo the main thread runs or waits for the whole chain (its callbacks run inline in
        torch's hook when an all-reduce is already done, else on gloo's threads while the hook waits):
        all of it is communication for measured compute (:mod:`lsgd.comm.blocked_time`), the chain's
        compression matmuls included (a limit: ``cluster.compute=measured`` leaves them out). On
        NCCL the hook only issues: nothing is timed here."""
        return self.comm.blocking() if not self.overlap else contextlib.nullcontext()

    def pop_flops(self) -> float:
        """Compression FLOPs since the previous call."""
        flops, self.step_flops = self.step_flops, 0.0
        return flops

    def state_dict(self) -> dict:
        """torch's PowerSGD state without the process group (error, P and Q memories, iter, RNG)."""
        return {k: getattr(self.state, k) for k in self.state.__slots__ if k != "process_group"}

    def load_state_dict(self, saved: dict) -> None:
        group = self.comm.group
        for key, value in saved.items():
            setattr(self.state, key, value)
        self.state.process_group = group
