"""The compressors' keys in the ``algo`` block, declared once per compressor as typed config
dataclasses (:mod:`lsgd.core.typed_config`: defaults, types, allowed values).

The keys stay where users set them, in the ``algo`` block (``algo.cf``, ``algo.levels``,
``algo.rank``, ...); a compression algorithm's config inherits the options of the compressors it
takes (:class:`lsgd.algorithms.gradient_compression.compressed.CompressedConfig` all of them, GraVAC's
the sparsifiers' seed and DGC's sampling), and :data:`lsgd.compression.compressors.COMPRESSORS`
names each compressor's options dataclass.

==========  ==========================================================================
compressor  options
==========  ==========================================================================
none, fp16  (none)
topk        :class:`SparsifierOptions`: ``cf``
redsync     :class:`SparsifierOptions`: ``cf``
randomk     :class:`RandomKOptions`: ``cf``, ``seed``
dgc         :class:`DGCOptions`: ``cf``, ``seed``, ``sample_ratio``, ``warmup_epochs``,
            ``momentum_correction``, ``clip_norm``
qsgd        :class:`QSGDOptions`: ``levels``, ``seed``
lattice     :class:`LatticeOptions`: ``bits``, ``side``, ``seed``
powersgd    :class:`PowerSGDOptions`: ``rank``, ``start_iter``, ``warm_start``,
            ``min_compression_rate``, ``seed``
==========  ==========================================================================
"""

from __future__ import annotations

from dataclasses import dataclass

from lsgd.compression.lattice import BITS
from lsgd.core.typed_config import option


@dataclass
class CompressorSeed:
    """The seed of a compressor's randomness (random-k's indices, DGC's threshold sample, QSGD's and
    the lattice's rounding, PowerSGD's initial Q)."""

    seed: int | None = option(None, doc="randomk indices / dgc sampling / qsgd and lattice rounding / powersgd's "
                              "initial Q; the presets set the run's seed (null: compressed and accordion take "
                              "the run's seed, gravac 0)")


@dataclass
class SparsifierOptions:
    """``topk``, ``redsync`` (and the other sparsifiers): the compression factor."""

    cf: float = option(10, at_least=1, doc="theta: dense size / compressed size (sparsifiers keep ceil(n / cf))",
                       symbol="CF")


@dataclass
class RandomKOptions(SparsifierOptions, CompressorSeed):
    """``randomk``: the compression factor and the seed of the indices (shared by every worker)."""


@dataclass
class DGCSampling(CompressorSeed):
    """DGC's sampled threshold (Lin et al. 2018, Sec. 3): what its selection reads at any
    compression factor (GraVAC's ``dgc`` too)."""

    sample_ratio: float = option(0.01, above=0, at_most=1,
                                 doc="fraction of |g| sampled to estimate the top-k threshold")


@dataclass
class DGCOptions(SparsifierOptions, DGCSampling):
    """``dgc`` (Lin et al. 2018; lsgd/algorithms/gradient_compression/compressed.py): the sampled
    threshold, the density warm-up and, in the error-feedback memory, momentum correction and local
    gradient clipping."""

    warmup_epochs: int = option(0, at_least=0,
                                doc="W: density warm-up (Sec. 3.4): cf ** ((e + 1) / (W + 1)) in epoch e < W (0: off)")
    momentum_correction: bool = option(True, doc="with error_feedback: takes over optim.momentum, nesterov and "
                                       "weight_decay (u <- m u + g + wd w; v <- v + u)")
    clip_norm: float | None = option(None, above=0, doc="local gradient clipping (Sec. 3.3), threshold for the "
                                     "averaged gradient: each worker clips each tensor at clip_norm * sqrt(N) "
                                     "(null: off; dgc only)")


@dataclass
class QSGDOptions(CompressorSeed):
    """``qsgd`` (Alistarh et al. 2017)."""

    levels: int = option(127, at_least=1, at_most=127, doc="s: quantization levels (int8 payload)")


@dataclass
class LatticeOptions(CompressorSeed):
    """``lattice`` (Davies et al. 2021: decoded against each receiver's own gradient;
    lsgd/compression/lattice.py)."""

    bits: int = option(8, choices=BITS, doc="log2 q: colours per element")
    side: float = option(1.0e-4, above=0, doc="s: lattice side (safe radius q s / 2 between workers' gradients, "
                         "per coordinate)")


@dataclass
class PowerSGDHookOptions(CompressorSeed):
    """torch's PowerSGD hook and state (:mod:`lsgd.compression.powersgd`) but its rank: what
    Accordion's two states share."""

    start_iter: int = option(10, at_least=0, doc="start_powerSGD_iter: vanilla all-reduce before it (iterations)")
    warm_start: bool = option(True, doc="start each power iteration from the previous step's Q (torch's warm_start)")
    min_compression_rate: float = option(2.0, doc="compress an n x m matrix only when (n + m) r min_compression_rate "
                                         "< n m (torch's min_compression_rate)")


@dataclass
class PowerSGDOptions(PowerSGDHookOptions):
    """``powersgd`` (torch's PowerSGD comm hook and state)."""

    rank: int = option(2, at_least=1, doc="r: matrix_approximation_rank")
