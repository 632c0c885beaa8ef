"""lsgd.training.accel on CPU: the precision / compile / channels_last keys are validated before any worker
starts, fp16's scale rule on one process, channels_last layouts and outputs, the compile fallback,
the optimizer kernels chosen per device. (The 2-rank skip agreement: tests/distributed/
test_mixed_precision.py.)"""

from __future__ import annotations

import logging
import math

import pytest
import torch
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from lsgd.training import accel
from lsgd.training.accel import Precision, batch_to_channels_last, compile_module, compile_problem, optimizer_kernels
from lsgd.cli import _register_resolvers
from lsgd.config.validation import validate
from lsgd.core.errors import ConfigError
from lsgd.models.cnn import SmallCNN
from lsgd.models.resnet_cifar import CifarResNet
from lsgd.training.optim import build_optimizer


def load(overrides: list[str]) -> dict:
    _register_resolvers()
    with initialize_config_module(config_module="lsgd.conf", version_base="1.3"):
        return OmegaConf.to_container(compose("config", overrides=["debug=default", *overrides]), resolve=True)


@pytest.mark.parametrize("overrides, message", [
    (["precision=fp8"], r"precision='fp8' is not allowed; allowed: fp32, bf16, fp16"),
    (["precision=bf16", "dtype=float64"], r"dtype=float64 is not allowed with it; allowed: dtype=float32"),
    (["precision=fp16", "algo=compressed"], r"precision=fp16 is not supported with algo.name=compressed.*"
                                            r"allowed with fp16: ddp, demo, diloco, local_sgd, post_local_sgd, slowmo"),
    (["precision=fp16", "algo=dpsgd", "algo.topology=complete"], r"algo.name=dpsgd"),
    (["precision=fp16", "grad_scaler.backoff_factor=1.5"], r"grad_scaler.backoff_factor must be in \(0, 1\)"),
    (["precision=fp16", "grad_scaler.growth_interval=0"], r"grad_scaler.growth_interval must be an integer >= 1"),
    (["compile=maybe"], r"compile='maybe' is not allowed; allowed: true, false"),
    (["algo=local_sgd", "algo.comm_dtype=int8"], r"algo.comm_dtype='int8' is not allowed; allowed: fp32, bf16, fp16"),
    (["model.channels_last=1"], r"model.channels_last must be true or false"),
    (["model=gpt", "dataset=text", "+model.channels_last=true"], r"model.channels_last"),
])
def test_bad_values_are_refused_naming_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate(load(overrides))


@pytest.mark.parametrize("overrides", [["precision=bf16", "algo=compressed"], ["precision=fp16", "algo=local_sgd"],
                                       ["precision=fp16"], ["compile=true", "model.channels_last=true"]])
def test_good_values_validate(overrides):
    validate(load(overrides))


def test_fp32_is_the_default_and_changes_nothing():
    cfg = load([])
    assert cfg["precision"] == "fp32" and cfg["compile"] is False and cfg["model"]["channels_last"] is False
    p = Precision("fp32")
    assert p.scaler is None and p.metrics() == {} and p.state_dict() == {}
    with p.autocast():
        assert not torch.is_autocast_enabled("cpu")


def test_fp16_scale_rule_on_one_process():
    """Micikevicius et al. 2018 Sec. 3.2: an inf gradient skips the step and multiplies S by the
    backoff factor; ``growth_interval`` clean steps in a row multiply it by the growth factor; the
    gradients the step sees are the true ones (scaled loss / S)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    p = Precision("fp16", "cpu", scaler={"init_scale": 8.0, "growth_interval": 2})
    x = torch.randn(3, 4)
    scales, skips = [], []
    for step in range(5):
        opt.zero_grad(set_to_none=True)
        with p.autocast():
            loss = model(x).float().pow(2).mean()
        p.backward(loss)
        if step == 2:
            model.weight.grad[0, 0] = math.inf
        else:  # unscaled: the fp32 gradient of the same loss (fp16 forward rounding aside)
            ref = torch.autograd.grad(model(x).pow(2).mean(), model.weight)[0]
            unscaled = model.weight.grad / p.scale
            torch.testing.assert_close(unscaled, ref, rtol=2e-2, atol=1e-3)
        before = model.weight.detach().clone()
        skip = p.unscale_(opt)
        if not skip:
            opt.step()
        p.update()
        skips.append(skip)
        scales.append(p.scale)
        if skip:
            assert torch.equal(model.weight, before)
    assert skips == [False, False, True, False, False]
    assert scales == [8.0, 16.0, 8.0, 8.0, 16.0]
    assert p.metrics() == {"grad_scale": 16.0, "skipped_steps": 1}
    q = Precision("fp16", "cpu")
    q.load_state_dict(p.state_dict())
    assert q.scale == 16.0 and q.skipped == 1


def test_bf16_autocast_on_cpu():
    p = Precision("bf16", "cpu")
    with p.autocast():
        y = torch.nn.Linear(4, 2)(torch.randn(3, 4))
    assert y.dtype == torch.bfloat16 and p.scaler is None


@pytest.mark.parametrize("make", [lambda: SmallCNN((3, 16, 16), 10, [8, 16], 32),
                                  lambda: CifarResNet(20, 10, 3, "A")])
def test_channels_last_layout_and_outputs(make):
    torch.manual_seed(0)
    ref = make().eval()
    model = make().eval()
    model.load_state_dict(ref.state_dict())
    accel.to_channels_last(model)
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    assert convs and all(c.weight.is_contiguous(memory_format=torch.channels_last) for c in convs)
    seen = []
    convs[-1].register_forward_hook(lambda m, i, o: seen.append(o.is_contiguous(memory_format=torch.channels_last)))
    x = torch.randn(4, 3, 16, 16)
    xl = batch_to_channels_last(x)
    assert xl.is_contiguous(memory_format=torch.channels_last) and torch.equal(xl, x)
    with torch.no_grad():
        torch.testing.assert_close(model(xl), ref(x), rtol=1e-5, atol=1e-5)
    assert seen == [True]  # activations stay NHWC
    assert batch_to_channels_last(torch.ones(2, 3)).shape == (2, 3)  # not an image batch: unchanged


def test_compile_falls_back_with_the_reason(monkeypatch, caplog):
    monkeypatch.setattr(accel.shutil, "which", lambda name: None)
    monkeypatch.delenv("CXX", raising=False)
    assert "no C++ compiler" in compile_problem("cpu")
    model = torch.nn.Linear(2, 2)
    with caplog.at_level(logging.WARNING, logger="lsgd"):
        assert compile_module(model, "cpu") is model
    assert "compile=true but no C++ compiler" in caplog.text


def test_compile_wraps_the_module():
    """torch.compile's graph capture (dynamo; the ``eager`` backend runs the captured graph without
    Inductor's code generation, which takes tens of seconds on this machine) gives the module's
    output."""
    torch.manual_seed(0)
    model = SmallCNN((1, 12, 12), 4, [4], 8)
    compiled = compile_module(model, "cpu", backend="eager")
    assert compiled is not model
    x = torch.randn(2, 1, 12, 12)
    torch.testing.assert_close(compiled(x), model(x))


def test_optimizer_kernels_per_device():
    assert optimizer_kernels("sgd", "cuda") == {"fused": True}
    assert optimizer_kernels("adamw", torch.device("cuda", 0)) == {"fused": True}
    assert optimizer_kernels("lamb", "cuda") == {}
    assert optimizer_kernels("sgd", "cpu") == optimizer_kernels("adamw", "cpu") == {}
    params = [torch.nn.Parameter(torch.zeros(2))]
    assert not build_optimizer(params, {"name": "sgd", "lr": 0.1}, "cpu").defaults["fused"]
    assert build_optimizer(params, {"name": "adamw", "lr": 0.1}, "cuda").defaults["fused"] is True
