"""GraVAC's gain rule, ``algo.gain`` (lsgd/algorithms/gradient_compression/gravac.py): ``paper`` (squared
norms with error feedback in numerator and denominator, multi-level candidate) and ``authors_code``
(the authors' public code, github.com/sahiltyagi4/GraVAC: unsquared per-layer norms summed, the raw
gradient in the denominator, the candidate a second compression of the same tensor), on one
hand-driven worker with a hand-made gradient and residual."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from lsgd.algorithms import ALGORITHMS
from lsgd.algorithms.gradient_compression.gravac import GraVAC
from lsgd.comm.communicator import Communicator
from lsgd.config.validation import compose_config
from lsgd.core.errors import ConfigError

# two tensors (layers): gradient g and residual r, so g_ef = g + r has distinct magnitudes
G = {"w": [3.0, -1.0, 0.5, 2.0, 0.0, -0.25], "b": [0.0, 2.0, -2.0, 1.0]}
R = {"w": [1.0, 0.0, -3.5, -2.0, 1.5, 0.25], "b": [0.5, -0.5, -1.0, 0.0]}
CF_MIN, CF_CAND = 2.0, 4.0  # theta_min and the first candidate, theta_min * scale_start (2)


class TwoLayers(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(2, 3))
        self.b = nn.Parameter(torch.zeros(4))


def one_step(gain: str, compressor: str = "topk") -> GraVAC:
    """GraVAC after one ``after_backward`` on G with residual R (no smoothing: ewma 0)."""
    algo = GraVAC({"name": "gravac", "compressor": compressor, "cf_min": CF_MIN, "ewma": 0.0, "epsilon": 0.5,
                   "gain": gain}, Communicator())
    model = TwoLayers()
    algo.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    for key, (name, p) in enumerate(model.named_parameters()):
        p.grad = torch.tensor(G[name]).reshape(p.shape)
    algo.memory.load_state_dict({"residuals": {key: torch.tensor(R[name]).reshape(p.shape)
                                               for key, (name, p) in enumerate(model.named_parameters())}})
    assert algo.controller.plan() == (CF_MIN, CF_CAND)
    algo.after_backward(0)
    return algo


def norm(xs) -> float:
    return math.sqrt(sum(x * x for x in xs))


def top(xs, cf: float) -> list[float]:
    """The ceil(n / cf) largest magnitudes of xs (the kept values of top-k at CF cf)."""
    return sorted(xs, key=abs, reverse=True)[: math.ceil(len(xs) / cf)]


def g_ef(name: str) -> list[float]:
    return [g + r for g, r in zip(G[name], R[name])]


@pytest.mark.parametrize("compressor", ["topk", "dgc"])  # dgc: a tensor below its sample size is exact top-k
def test_authors_code_gain_in_closed_form(compressor):
    """gain(cf) = sum_l ||top_k(g_l + r_l, cf)|| / sum_l ||g_l||: unsquared norms of each layer, summed,
    the residual only in the numerator (so a gain can exceed 1), for theta_min and the candidate."""
    last = one_step("authors_code", compressor).last
    den = norm(G["w"]) + norm(G["b"])  # sqrt(14.3125) + 3
    expected_min = (norm(top(g_ef("w"), CF_MIN)) + norm(top(g_ef("b"), CF_MIN))) / den  # (sqrt(27.25) + sqrt(11.25)) / den
    expected_cand = (norm(top(g_ef("w"), CF_CAND)) + norm(top(g_ef("b"), CF_CAND))) / den  # (5 + 3) / den
    assert expected_min == pytest.approx((math.sqrt(27.25) + math.sqrt(11.25)) / (math.sqrt(14.3125) + 3), rel=1e-15)
    assert expected_cand == pytest.approx(8 / (math.sqrt(14.3125) + 3), rel=1e-15)
    assert (last["cf_min"], last["cf_candidate"]) == (CF_MIN, CF_CAND)
    assert last["gain_min"] == pytest.approx(expected_min, rel=1e-12)  # 1.264: above 1
    assert last["gain_candidate"] == pytest.approx(expected_cand, rel=1e-12)  # 1.179


@pytest.mark.parametrize("compressor", ["topk", "dgc"])
def test_paper_gain_in_closed_form(compressor):
    """The default: gain(cf) = sum ||C(g_ef)||^2 / sum ||g_ef||^2 over all tensors."""
    last = one_step("paper", compressor).last
    den = sum(x * x for name in G for x in g_ef(name))  # 28.25 + 12.5
    assert last["gain_min"] == pytest.approx(sum(x * x for n in G for x in top(g_ef(n), CF_MIN)) / den, rel=1e-12)
    assert last["gain_candidate"] == pytest.approx(sum(x * x for n in G for x in top(g_ef(n), CF_CAND)) / den, rel=1e-12)
    assert (last["gain_min"], last["gain_candidate"]) == pytest.approx((38.5 / 40.75, 34 / 40.75), rel=1e-12)


def recording(algo: GraVAC) -> list[tuple]:
    """Record the compressor's calls: ("compress", tensor, cf) and ("further", payload, cf)."""
    calls: list[tuple] = []
    compress, further = algo.compressor.compress, algo.compressor.compress_further

    def spy_compress(tensor, **kw):
        calls.append(("compress", tensor, kw["cf"]))
        return compress(tensor, **kw)

    def spy_further(c, cf, **kw):
        calls.append(("further", c, cf))
        return further(c, cf, **kw)

    algo.compressor.compress, algo.compressor.compress_further = spy_compress, spy_further
    return calls


@pytest.mark.parametrize("gain", ["paper", "authors_code"])
def test_authors_code_compresses_the_same_tensor_twice_not_multi_level(gain):
    """authors_code: per tensor, two separate compressions of the same g_ef, at theta_min and at the
    candidate CF (the authors' two compressors); paper: compress at theta_min, then compress that
    payload further by theta_c / theta_min (multi-level)."""
    algo = GraVAC({"name": "gravac", "compressor": "randomk", "cf_min": CF_MIN, "ewma": 0.0, "gain": gain, "seed": 1},
                  Communicator())
    model = TwoLayers()
    algo.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    for name, p in model.named_parameters():
        p.grad = torch.tensor(G[name]).reshape(p.shape)
    algo.memory.load_state_dict({"residuals": {k: torch.tensor(R[name]).reshape(p.shape)
                                               for k, (name, p) in enumerate(model.named_parameters())}})
    calls = recording(algo)
    algo.after_backward(0)
    compressions = [c for c in calls if c[0] == "compress" and c[2] != 1.0]  # not the dense payloads
    for name in G:
        mine = [c for c in compressions if c[1].numel() == len(G[name])]
        if gain == "paper":
            assert [c[2] for c in mine] == [CF_MIN]
            assert [c[2] for c in calls if c[0] == "further" and c[1].numel == len(G[name])] == [CF_CAND / CF_MIN]
            continue
        assert [c[2] for c in mine] == [CF_MIN, CF_CAND]
        assert mine[0][1] is mine[1][1]  # one tensor, compressed twice
        assert mine[0][1].reshape(-1).tolist() == g_ef(name)
    if gain == "authors_code":
        assert not [c for c in calls if c[0] == "further"]


def test_bad_gain_is_a_config_error_naming_the_key_and_the_values():
    with pytest.raises(ConfigError, match=r"algo\.gain='authors'.*allowed: paper, authors_code"):
        compose_config(["debug=default", "algo=gravac", "algo.gain=authors"])
    cfg = compose_config(["debug=default", "algo=gravac", "algo.gain=authors_code"])
    assert cfg["algo"]["gain"] == "authors_code"
    assert compose_config(["debug=default", "algo=gravac"])["algo"]["gain"] == "paper"


def test_report_labels_name_the_gain_rule():
    facts = ALGORITHMS["gravac"].label_facts
    assert facts({"algo": {"name": "gravac", "gain": "authors_code"}})["values"]["algo.gain"] == "authors' code gain"
    assert facts({"algo": {"name": "gravac", "gain": "paper"}})["values"]["algo.gain"] == "paper's gain"
