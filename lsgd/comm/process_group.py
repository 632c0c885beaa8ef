"""The process group below the communicator, as this torch has it: whether torch.distributed is up
(:func:`initialized`; without it a communicator is a world of one) and the into-tensor collectives
under the name this torch version gives them (:data:`REDUCE_SCATTER`, :data:`ALL_GATHER_INTO`)."""

from __future__ import annotations

import torch.distributed as dist

# newer torch names them *_single (its *_tensor names warn of deprecation); older torch has only *_tensor
REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or getattr(dist, "reduce_scatter_tensor", None)
ALL_GATHER_INTO = getattr(dist, "all_gather_single", None) or getattr(dist, "all_gather_into_tensor", None)

#: Backends whose point-to-point calls go one by one (gloo; the in-process cluster's, which has gloo's
#: semantics, lsgd.comm.inprocess.backend); the others (NCCL) batch them, and need every rank of a
#: group in the group's first call.
UNBATCHED_BACKENDS = ("gloo", "lsgd_inprocess")


def initialized() -> bool:
    """Whether torch.distributed is available and its default process group initialized."""
    return dist.is_available() and dist.is_initialized()
