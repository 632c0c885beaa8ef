"""Gradient compression: compressors with error feedback, their collectives, and adaptive control.

Public API (see the submodules for details):

* :func:`build` (``lsgd.compression.compressors``): ``build(name, **params)`` -> compressor with
  ``compress(tensor) -> Compressed``, ``decompress(compressed) -> tensor``; ``Compressed.nbytes``;
  :data:`COMPRESSORS`, the registry of every compressor (its class, label and options).
* each compressor's keys in the ``algo`` block as typed dataclasses (``lsgd.compression.options``).
* error-feedback memories (``lsgd.compression.memory``) and the exchange of compressed payloads
  across workers (``lsgd.compression.exchange``).
* adaptive controllers: GraVAC and Accordion (``lsgd.compression.adaptive``).
* torch's PowerSGD comm hook with exact byte accounting (``lsgd.compression.powersgd``).
* low-precision formats with a float32 scale per row (int8, fp8, fp4), simulated by a
  quantize-dequantize round trip, and their encoded size (``lsgd.compression.rowwise``: Streaming
  DiLoCo's outer gradients).
* top-k of each chunk with a statistical quantizer and the payload that carries it
  (``lsgd.compression.chunked_topk``: SparseLoCo's outer gradients).
"""

from lsgd.compression.adaptive import (
    AccordionController,
    GraVACController,
    GraVACDecision,
)
from lsgd.compression.compressors import (
    COMPRESSORS,
    DGC,
    FP16,
    QSGD,
    SPARSIFIERS,
    Compressed,
    Compressor,
    NoCompression,
    RandomK,
    RedSync,
    Sparsifier,
    TopK,
    build,
    num_kept,
    topk_indices,
)
from lsgd.compression.exchange import exchange
from lsgd.compression.memory import DGCMemory, ErrorFeedback, Memory, NoMemory
from lsgd.compression.powersgd import PowerSGD

__all__ = [
    "COMPRESSORS",
    "DGC",
    "FP16",
    "QSGD",
    "SPARSIFIERS",
    "AccordionController",
    "Compressed",
    "Compressor",
    "DGCMemory",
    "ErrorFeedback",
    "GraVACController",
    "GraVACDecision",
    "Memory",
    "NoCompression",
    "NoMemory",
    "PowerSGD",
    "RandomK",
    "RedSync",
    "Sparsifier",
    "TopK",
    "build",
    "exchange",
    "num_kept",
    "topk_indices",
]
