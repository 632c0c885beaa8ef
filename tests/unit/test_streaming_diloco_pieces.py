"""Streaming DiLoCo's pieces on one process: its config checks (before any worker starts), the
fragment split, the schedule (torchft 0.2.0's), the low-precision formats against brute-force
references, and peak_step_bytes' bookkeeping."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from lsgd.algorithms.averaging.streaming_diloco import StreamingDiLoCo, model_units, split_fragments
from lsgd.comm.communicator import Communicator
from lsgd.compression.rowwise import encoded_nbytes, quantize_dequantize
from lsgd.config.validation import compose_config
from lsgd.core.errors import ConfigError


# -- config errors, before any worker starts ---------------------------------------------------
@pytest.mark.parametrize("overrides, keys", [
    (["algo.local_steps=6", "algo.fragments=4"], ("algo.local_steps", "algo.fragments")),
    (["algo.local_steps=3", "algo.fragments=2"], ("algo.local_steps", "algo.fragments")),
    (["algo.local_steps=8", "algo.fragments=2", "algo.fragment_sync_delay=4"], ("algo.fragment_sync_delay",)),
    (["algo.local_steps=8", "algo.fragments=4", "algo.fragment_sync_delay=2"], ("algo.fragment_sync_delay",)),
    (["algo.fragment_update_alpha=1.5"], ("algo.fragment_update_alpha",)),
    (["algo.quantization=fp2"], ("algo.quantization",)),
    (["algo.fragments=0"], ("algo.fragments",)),
    (["algo.local_steps=8", "algo.fragments=2", "algo.fragment_sync_delay=1", "algo.eager=true"],
     ("algo.eager", "algo.fragment_sync_delay")),
])
def test_bad_settings_are_config_errors_naming_the_keys(overrides, keys):
    """H not a multiple of P, tau >= H / P (torchft's two checks), tau > 0 with eager outer steps
    and out-of-range values stop the main process's validation (compose_config, what `lsgd train` runs before it spawns workers)."""
    with pytest.raises(ConfigError) as err:
        compose_config(["debug=default", "algo=streaming_diloco", *overrides])
    for key in keys:
        assert key in str(err.value)


def test_good_settings_compose_with_adamw():
    cfg = compose_config(["debug=default", "algo=streaming_diloco", "algo.local_steps=8", "algo.fragments=4",
                          "algo.fragment_sync_delay=1", "algo.quantization=fp4"])
    assert cfg["algo"]["fragments"] == 4 and cfg["optim"]["name"] == "adamw"


# -- fragments -----------------------------------------------------------------------------------
def test_fragments_take_every_pth_unit_and_shared_parameters_once():
    torch.manual_seed(0)
    emb = nn.Embedding(5, 4)
    head = nn.Linear(4, 5, bias=False)
    head.weight = emb.weight  # tied: belongs to the embedding (the first module holding it)
    model = nn.Sequential(emb, nn.Linear(4, 4), nn.ReLU(), nn.BatchNorm1d(4), nn.Linear(4, 4), head)
    params = list(model.parameters())
    units = model_units(model)
    # embedding, linear, batchnorm (+ its running mean / var), linear; the tied head adds nothing
    assert [len(u[0]) for u in units] == [1, 2, 2, 2]
    assert [len(u[1]) for u in units] == [0, 0, 2, 0]
    frags = split_fragments(model, 2)
    assert frags[0][0] == [0, 3, 4]         # embedding.weight, batchnorm weight and bias
    assert frags[1][0] == [1, 2, 5, 6]      # the two linears
    assert sorted(i for f in frags for i in f[0]) == list(range(len(params)))
    assert frags[0][1][0] is model[3].running_mean and frags[1][1] == []
    with pytest.raises(ConfigError, match="algo.fragments"):
        split_fragments(model, 5)


# -- the schedule ----------------------------------------------------------------------------------
def _algo(**kw) -> StreamingDiLoCo:
    cfg = {"name": "streaming_diloco", "local_steps": 4, "fragments": 2, **kw}
    return StreamingDiLoCo(cfg, Communicator())


def test_schedule_is_torchfts():
    """torchft 0.2.0 with P = 2, sync_every = 4: fragment 0 lands at steps 2, 6, 10, fragment 1 at
    4, 8, 12; with delay 1 each starts one step earlier."""
    a = _algo(fragment_sync_delay=0)
    assert [(s, a.lands(s)) for s in range(1, 13) if a.lands(s) is not None] == \
        [(2, 0), (4, 1), (6, 0), (8, 1), (10, 0), (12, 1)]
    assert [s for s in range(1, 13) if a.starts(s) is not None] == [2, 4, 6, 8, 10, 12]
    d = _algo(fragment_sync_delay=1)
    assert [(s, d.starts(s)) for s in range(1, 13) if d.starts(s) is not None] == \
        [(1, 0), (3, 1), (5, 0), (7, 1), (9, 0), (11, 1)]
    assert (_algo().tau, _algo().alpha) == (1, 0.5)  # the paper's defaults: its Table 1 and Figure 10
    assert _algo(eager=True).tau == 0                 # null is 0 with eager outer steps
    one = _algo(fragments=1, local_steps=3)
    assert [s for s in range(1, 10) if one.lands(s) is not None] == [3, 6, 9]


# -- low-precision formats ---------------------------------------------------------------------------
def _representable(fmt: str) -> torch.Tensor:
    """Every finite value of the format, ascending (brute force over the bit patterns)."""
    if fmt == "fp8":
        v = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
        return torch.unique(v[torch.isfinite(v)])
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    return torch.unique(torch.cat([grid, -grid]))


def _even_code(fmt: str, value: float) -> bool:
    """Whether ``value``'s encoding has an even mantissa (the tie-break of round to nearest even)."""
    if fmt == "fp8":
        bits = torch.tensor([value]).to(torch.float8_e4m3fn).view(torch.uint8).item()
        return bits % 2 == 0
    return [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0].index(abs(value)) % 2 == 0


def _reference(t: torch.Tensor, fmt: str) -> torch.Tensor:
    """Row by row, element by element: scale = FMAX / max|row| in float32, the nearest
    representable value (ties to the even encoding; int8: truncation toward zero), / scale."""
    fmax = {"int8": 127.0, "fp8": 448.0, "fp4": 6.0}[fmt]
    rows = t.reshape(t.shape[0], -1) if t.dim() >= 2 else t.reshape(1, -1)
    out = torch.empty_like(rows, dtype=torch.float32)
    for r in range(rows.shape[0]):
        row = rows[r].float()
        m = row.abs().max()
        scale = torch.tensor(fmax, dtype=torch.float32) / m if m > 0 else torch.tensor(1.0)
        for c in range(row.numel()):
            y = row[c] * scale
            if fmt == "int8":
                q = float(math.trunc(y.item()))
            else:
                values = _representable(fmt)
                d = (values - y).abs()
                best = values[d == d.min()].tolist()
                q = best[0] if len(best) == 1 else next(v for v in best if _even_code(fmt, v))
            out[r, c] = torch.tensor(q, dtype=torch.float32) / scale
    return out.reshape(t.shape).to(t.dtype)


@pytest.mark.parametrize("fmt", ["int8", "fp8", "fp4"])
def test_formats_equal_a_brute_force_reference(fmt):
    g = torch.Generator().manual_seed(0)
    cases = [torch.randn(3, 7, generator=g), torch.randn(5, generator=g) * 1e-3,
             torch.randn(2, 2, 3, generator=g, dtype=torch.float64), torch.zeros(2, 4)]
    ties = torch.tensor([[6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.75, -5.0]])  # fp4's midpoints, scale 1
    for t in cases + ([ties] if fmt == "fp4" else []):
        got = quantize_dequantize(t, fmt)
        assert got.dtype == t.dtype and got.shape == t.shape
        torch.testing.assert_close(got, _reference(t, fmt), rtol=0, atol=0)
    assert quantize_dequantize(cases[0], "none") is cases[0]


def test_encoded_bytes_are_payload_bits_plus_a_scale_per_row():
    w = torch.zeros(16, 10)  # 16 rows of 10 elements
    assert encoded_nbytes(w, "fp8") == encoded_nbytes(w, "int8") == 16 * (4 + 10)
    assert encoded_nbytes(w, "fp4") == 16 * (4 + 5)
    assert encoded_nbytes(torch.zeros(7), "fp4") == 4 + 4          # a vector: one row, 28 bits -> 4 bytes
    assert encoded_nbytes(torch.zeros(8, 3, 5, 5), "fp4") == 8 * (4 + 38)  # 75 elements: 300 bits
    assert encoded_nbytes(torch.zeros(0), "fp8") == 0


# -- peak_step_bytes --------------------------------------------------------------------------------
def test_end_step_keeps_the_largest_step_and_resumes_from_a_checkpoint():
    comm = Communicator()
    for sent in (100.0, 0.0, 250.0, 30.0):
        comm.stats.wire_bytes += sent
        comm.end_step()
    assert comm.stats.peak_step_bytes == 250.0
    state = comm.state_dict()
    resumed = Communicator()
    resumed.load_state_dict(state)
    resumed.stats.wire_bytes += 40.0  # the resumed run's first step: 40 bytes, not 420
    resumed.end_step()
    assert resumed.stats.peak_step_bytes == 250.0
    resumed.stats.wire_bytes += 300.0
    resumed.end_step()
    assert resumed.stats.peak_step_bytes == 300.0
