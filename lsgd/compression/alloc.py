"""Fresh CPU tensors of many megabytes without a page fault per 4 KiB: the compressors' outputs
(dense decompressions, payloads) are allocated through numpy, whose allocator asks the kernel for
transparent huge pages (``madvise(MADV_HUGEPAGE)`` on arrays of 4 MiB and more, numpy >= 1.20 on
Linux), and wrapped with ``torch.from_numpy`` (the tensor owns a reference to the array).

Why: torch's CPU allocator hands multi-megabyte requests to glibc, which maps them afresh each time
(same-size requests stay above its adaptive mmap threshold) and frees them back, so every call pays
one page fault per 4 KiB page plus the kernel's zeroing. Measured on this project's 2-core machine
(25 Nov 2026, torch 2.14.1, numpy 2.4, one thread, load average 12): a fresh 100 MB float32 tensor
filled once took 87 ms from ``torch.empty`` and 18.5 ms from here; an already-mapped one 8.6 ms. With
``THP_MEM_ALLOC_ENABLE=1`` torch does the same itself, but that is a process-wide setting a library
should not make. Elsewhere (other devices, small sizes, dtypes numpy lacks) this is plain
``torch.empty`` / ``torch.zeros``.
"""

from __future__ import annotations

import numpy as np
import torch

#: requests from this many bytes go through numpy (its huge-page threshold)
LARGE_BYTES = 1 << 22

_NUMPY = {torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16,
          torch.int8: np.int8, torch.uint8: np.uint8, torch.int16: np.int16, torch.int32: np.int32,
          torch.int64: np.int64, torch.bool: np.bool_}


def _numpy_dtype(n: int, dtype: torch.dtype, device: torch.device | str):
    if torch.device(device).type != "cpu" or dtype not in _NUMPY:
        return None
    return _NUMPY[dtype] if n * torch.empty((), dtype=dtype).element_size() >= LARGE_BYTES else None


def empty(n: int, dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    """An uninitialized 1-D tensor of ``n`` elements (``torch.empty(n, dtype=, device=)``)."""
    np_dtype = _numpy_dtype(n, dtype, device)
    if np_dtype is None:
        return torch.empty(n, dtype=dtype, device=device)
    return torch.from_numpy(np.empty(n, dtype=np_dtype))


def zeros(n: int, dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    """A 1-D tensor of ``n`` zeros (``torch.zeros(n, dtype=, device=)``); from numpy it is
    ``calloc``'s lazily zeroed memory, so no pass writes the zeros."""
    np_dtype = _numpy_dtype(n, dtype, device)
    if np_dtype is None:
        return torch.zeros(n, dtype=dtype, device=device)
    return torch.from_numpy(np.zeros(n, dtype=np_dtype))
