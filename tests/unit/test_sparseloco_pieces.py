"""SparseLoCo's pieces on one process (lsgd/compression/chunked_topk.py,
lsgd/algorithms/averaging/sparseloco.py): its config checks (before any worker starts), DeMo's
chunking, the top-k per chunk and the statistical quantizer against brute-force references written
element by element from the authors' code, and the payload's bytes against the closed form."""

from __future__ import annotations

import math

import pytest
import torch

from lsgd.compression.chunked_topk import compress, decode, encode, largest_divisor, payload_nbytes, quantize, tiling
from lsgd.config.validation import compose_config
from lsgd.core.errors import ConfigError


# -- config errors, before any worker starts ---------------------------------------------------
@pytest.mark.parametrize("overrides, keys", [
    (["algo.chunk=8", "algo.topk=65"], ("algo.topk", "algo.chunk")),
    (["algo.chunk=0"], ("algo.chunk",)),
    (["algo.chunk=512"], ("algo.chunk",)),
    (["algo.bits=9"], ("algo.bits",)),
    (["algo.error_decay=1.5"], ("algo.error_decay",)),
    (["algo.aggregate=median"], ("algo.aggregate",)),
    (["algo.outer_lr=0"], ("algo.outer_lr",)),
    (["algo.topk=0"], ("algo.topk",)),
])
def test_bad_settings_are_config_errors_naming_the_keys(overrides, keys):
    """More kept values per tile than a tile holds, and out-of-range values, stop the main
    process's validation (compose_config, what `lsgd train` runs before it spawns workers)."""
    with pytest.raises(ConfigError) as err:
        compose_config(["debug=default", "algo=sparseloco", *overrides])
    for key in keys:
        assert key in str(err.value)


def test_defaults_are_the_authors_and_select_adamw():
    cfg = compose_config(["debug=default", "algo=sparseloco"])
    algo = cfg["algo"]
    assert (algo["local_steps"], algo["outer_lr"], algo["error_decay"], algo["chunk"], algo["topk"], algo["bits"],
            algo["quantization_range"], algo["aggregate"]) == (15, 1.0, 0.95, 64, 128, 2, 6.0, "mean")
    assert cfg["optim"]["name"] == "adamw"


# -- chunks --------------------------------------------------------------------------------------
def test_largest_divisor_is_the_authors_smaller_split():
    """``_get_smaller_split`` of the authors' code: the largest divisor of n not above the target."""
    for n in range(1, 200):
        for target in (1, 7, 64):
            want = max(d for d in range(1, n + 1) if n % d == 0 and d <= target)
            assert largest_divisor(n, target) == want, (n, target)


def _ref_chunks(t: torch.Tensor, chunk: int) -> list[list[tuple[int, ...]]]:
    """Each chunk's elements as index tuples into ``t`` (a matrix, or ``[shape[0], rest]``, in
    tiles of h x w read row by row; a vector in pieces), written with loops."""
    if t.dim() >= 2:
        rows, cols = t.shape[0], t.numel() // t.shape[0]
        h = max(d for d in range(1, chunk + 1) if rows % d == 0)
        w = max(d for d in range(1, chunk + 1) if cols % d == 0)
        out = []
        for y in range(rows // h):
            for x in range(cols // w):
                out.append([(y * h + i, x * w + j) for i in range(h) for j in range(w)])
        return out
    n = t.numel()
    s = max(d for d in range(1, chunk + 1) if n % d == 0)
    return [[(c * s + i,) for i in range(s)] for c in range(n // s)]


@pytest.mark.parametrize("shape", [(16, 24), (12, 10), (24,), (10,), (4, 3, 5, 5), (7,), ()])
def test_tiles_and_kept_counts(shape):
    """Tiles of the largest divisors not above chunk = 8; a chunk of L keeps max(1, round(L topk /
    64)) (round half to even) values with topk = 20: 20 of a full tile, 2 of a piece of 8 (2.5)."""
    chunk, topk = 8, 20
    t = torch.arange(math.prod(shape), dtype=torch.float64).reshape(shape)
    til = tiling(t.shape, chunk, topk)
    want = _ref_chunks(t, chunk)
    flat2d = t.reshape(t.shape[0], -1) if t.dim() >= 2 else t.reshape(-1)
    got = til.split(t)
    assert got.shape == (len(want), len(want[0]))
    for c, idx in enumerate(want):
        assert got[c].tolist() == [flat2d[i].item() for i in idx]
    assert torch.equal(til.join(got), t)
    length = len(want[0])
    assert til.k == min(length, max(1, round(length * topk / chunk**2)))
    assert til.index_bits == max(1, math.ceil(math.log2(length)))
    if shape == (24,):
        assert (length, til.k) == (8, 2)  # 2.5 rounds to 2


# -- top-k and the quantizer ---------------------------------------------------------------------------
def _ref_quantize(values: list[float], bits: int, span: float) -> list[float]:
    """The authors' ``TopKCompressor._quantize`` / ``_dequantize`` element by element, in float64
    (bins) and float32 (what travels: the shift and each bin's mean)."""
    bins = 2**bits
    m = len(values)
    shift = sum(values) / m
    c = [v - shift for v in values]
    sigma = math.sqrt(sum(x * x for x in c) / (m - 1)) if m > 1 else 0.0
    s = span * sigma / bins
    if not (s > 0 and math.isfinite(s)):
        s = 1.0
    codes = []
    for x in c:
        codes.append(min(max(round(x / s + bins // 2), 0), bins - 1))  # Python's round: half to even
    means = []
    for b in range(bins):
        mine = [x for x, code in zip(c, codes) if code == b]
        means.append(sum(mine) / len(mine) if mine else 0.0)
    f32 = lambda v: torch.tensor(v, dtype=torch.float32)  # noqa: E731
    return [(f32(means[code]) + f32(shift)).item() for code in codes]


@pytest.mark.parametrize("bits", [1, 2, 3])
def test_quantizer_equals_the_authors_element_by_element(bits):
    g = torch.Generator().manual_seed(bits)
    for v in (torch.randn(50, generator=g, dtype=torch.float64), torch.randn(9, generator=g, dtype=torch.float64) * 1e-3,
              torch.full((5,), 0.25, dtype=torch.float64), torch.tensor([3.0], dtype=torch.float64)):
        q = quantize(v, bits, 6.0)
        got = q.values(torch.float64)
        want = torch.tensor(_ref_quantize(v.tolist(), bits, 6.0), dtype=torch.float64)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-12)
        assert q.lookup.dtype == q.shift.dtype == torch.float32 and q.lookup.numel() == 2**bits


def test_topk_keeps_the_largest_magnitudes_ties_to_the_lower_index():
    t = torch.tensor([[0.5, -3.0, 1.0, 3.0, -0.1, 2.0, -2.0, 0.0]], dtype=torch.float64)  # a vector: one piece
    til = tiling(t.reshape(-1).shape, 8, 20)  # keeps 2 of 8
    s = compress(t.reshape(-1), til, 0, 6.0)
    assert s.indices.tolist() == [[1, 3]]  # |-3| = |3|: both; then nothing else
    til3 = tiling((8,), 8, 24)  # round(8 * 24 / 64) = 3
    s3 = compress(t.reshape(-1), til3, 0, 6.0)
    assert s3.indices.tolist() == [[1, 3, 5]]  # 2.0 at 5 before -2.0 at 6
    assert s3.dense().tolist() == [0.0, -3.0, 0.0, 3.0, 0.0, 2.0, 0.0, 0.0]


# -- the payload -----------------------------------------------------------------------------------
@pytest.mark.parametrize("bits", [0, 2])
def test_payload_round_trips_and_takes_the_closed_form_bytes(bits):
    """Per tensor: ceil(K w / 8) index bytes (w = ceil(log2 L)), then ceil(K b / 8) code bytes and
    4 (1 + 2^b) scale bytes, or K x 8 value bytes (float64) at bits = 0."""
    g = torch.Generator().manual_seed(0)
    tensors = [torch.randn(16, 24, generator=g, dtype=torch.float64), torch.randn(24, generator=g, dtype=torch.float64),
               torch.randn(4, 3, 5, 5, generator=g, dtype=torch.float64)]
    tilings = [tiling(t.shape, 8, 20) for t in tensors]
    items = [compress(t, til, bits, 6.0) for t, til in zip(tensors, tilings)]
    payload = encode(items, bits)
    # by hand: (16, 24): 2 x 3 tiles of 8 x 8, 20 kept each, 6-bit indices; (24,): 3 pieces of 8, 2
    # kept each, 3-bit indices; (4, 75): tiles of 4 x 5 = 20 (L), k = round(20 * 20 / 64) = 6, 15 tiles
    kept = [6 * 20, 3 * 2, 15 * 6]
    width = [6, 3, 5]
    want = 0
    for k, w in zip(kept, width):
        want += -(-k * w // 8) + (k * 8 if bits == 0 else -(-k * bits // 8) + 4 * (1 + 2**bits))
    assert payload.numel() == want == payload_nbytes(tilings, bits, [8, 8, 8])
    decoded = decode(payload, tilings, bits, [torch.float64] * 3)
    for s, (idx, vals) in zip(items, decoded):
        assert torch.equal(idx, s.indices) and torch.equal(vals, s.values)
    if bits == 0:  # full precision: the kept values are the tensor's own
        for t, s in zip(tensors, items):
            dense = s.dense()
            kept_mask = dense != 0
            assert torch.equal(dense[kept_mask], t[kept_mask])
