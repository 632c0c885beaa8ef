"""The cluster clock's compute model against closed forms: FLOP counts, step times, speeds, checks."""

from __future__ import annotations

import importlib.resources
import json
import math
import time

import pytest
import torch
import torch.nn.functional as F
import yaml
from torch import nn

from lsgd.compute.calibration import read_cpu_profile, write_cpu_profile
from lsgd.compute.config import CLUSTER_DEFAULTS, COMPUTE_MODES
from lsgd.compute.model import ComputeModel, StepTime
from lsgd.compute.opcount import OpCounter, count_step, count_step_flops
from lsgd.compute.presets import DEVICE_MEMORY_BANDWIDTH, DEVICE_PEAK_FLOPS, DEVICES, GPU_LAUNCH_OVERHEAD_S
from lsgd.compute.stretch import stretch_step, stretch_target_s
from lsgd.compute.validation import validate_cluster
from lsgd.compute.workers import HETEROGENEITY, HETEROGENEITY_SPREAD, node_of, num_nodes, resolve_speeds
from lsgd.core.errors import ConfigError

B, IN, HID, OUT = 8, 5, 4, 3


def mse(pred, y):
    return F.mse_loss(pred, y)


def ce(pred, y):
    return F.cross_entropy(pred, y)


# ---------------------------------------------------------------- count_step_flops


def test_linear_flops_closed_form():
    # FlopCounterMode counts an (M x K) @ (K x N) product as 2 M N K FLOPs; the bias add of addmm,
    # the loss and the bias gradient (a sum over the batch) are not matrix products: not counted.
    torch.manual_seed(0)
    model = nn.Linear(IN, OUT)
    x, y = torch.randn(B, IN), torch.randn(B, OUT)
    fwd, bwd = count_step_flops(model, x, y, mse)
    # forward: x (B x IN) @ W^T (IN x OUT)
    assert fwd == 2 * B * IN * OUT
    # backward: x does not require grad, so only the weight gradient dL/dy^T (OUT x B) @ x (B x IN)
    assert bwd == 2 * OUT * B * IN
    # with an input that requires grad, the input gradient dL/dy (B x OUT) @ W (OUT x IN) is added
    fwd, bwd = count_step_flops(model, x.clone().requires_grad_(True), y, mse)
    assert (fwd, bwd) == (2 * B * IN * OUT, 2 * (2 * B * IN * OUT))
    # inputs with leading dims (T, B, IN) are flattened to (T*B, IN)
    fwd, _ = count_step_flops(model, torch.randn(2, B, IN), torch.randn(2, B, OUT), mse)
    assert fwd == 2 * (2 * B) * IN * OUT


def test_mlp_backward_is_twice_forward_except_the_first_layer():
    model = nn.Sequential(nn.Linear(IN, HID), nn.ReLU(), nn.Linear(HID, OUT))
    x, y = torch.randn(B, IN), torch.randint(0, OUT, (B,))
    fwd, bwd = count_step_flops(model, x, y, ce)
    assert fwd == 2 * B * IN * HID + 2 * B * HID * OUT
    # layer 1: weight grad only; layer 2: weight grad + input grad
    assert bwd == 2 * B * IN * HID + 2 * (2 * B * HID * OUT)


class SmallConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.drop = nn.Dropout(0.5)
        self.fc = nn.Linear(4 * 8 * 8, 10)

    def forward(self, x):
        return self.fc(self.drop(F.relu(self.bn(self.conv(x)))).flatten(1))


def test_conv_net_closed_form_and_state_untouched():
    torch.manual_seed(0)
    model = SmallConvNet().train()
    x, y = torch.randn(B, 1, 8, 8), torch.randint(0, 10, (B,))
    # give the model a history: gradients and BatchNorm statistics that must survive the count
    ce(model(x), y).backward()
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    grads = {k: v.grad.clone() for k, v in model.named_parameters()}
    grad_ids = {k: id(v.grad) for k, v in model.named_parameters()}
    buffers = {k: v.clone() for k, v in model.named_buffers()}
    assert int(buffers["bn.num_batches_tracked"]) == 1
    rng = torch.get_rng_state()

    fwd, bwd = count_step_flops(model, x, y, ce)

    conv = 2 * B * 4 * 8 * 8 * (1 * 3 * 3)  # 2 x batch x C_out x H_out x W_out x (C_in x k x k)
    fc = 2 * B * (4 * 8 * 8) * 10
    assert fwd == conv + fc
    # conv: weight grad only (x needs no grad); fc: weight grad + input grad
    assert bwd == conv + 2 * fc
    for k, v in model.named_parameters():
        assert torch.equal(v, params[k]), k
        assert torch.equal(v.grad, grads[k]) and id(v.grad) == grad_ids[k], k
    for k, v in model.named_buffers():
        assert torch.equal(v, buffers[k]), k  # running_mean, running_var, num_batches_tracked
    assert model.training
    assert torch.equal(torch.get_rng_state(), rng)  # dropout's draws were rolled back


@pytest.mark.cuda
def test_cuda_counts_the_same_and_restores_the_cuda_rng():
    model = SmallConvNet().cuda().train()
    x, y = torch.randn(B, 1, 8, 8, device="cuda"), torch.randint(0, 10, (B,), device="cuda")
    state = torch.cuda.get_rng_state()
    fwd, bwd = count_step_flops(model, x, y, ce)
    assert torch.equal(torch.cuda.get_rng_state(), state)
    assert (fwd, bwd) == count_step_flops(model.cpu(), x.cpu(), y.cpu(), ce)


def test_count_leaves_a_gradless_model_gradless():
    model = SmallConvNet()
    count_step_flops(model, torch.randn(2, 1, 8, 8), torch.randint(0, 10, (2,)), ce)
    assert all(p.grad is None for p in model.parameters())


# ---------------------------------------------------------------- ComputeModel


def linear_setup():
    torch.manual_seed(0)
    return nn.Linear(IN, OUT), torch.randn(B, IN), torch.randn(B, OUT)


A100_RATE = 312e12 * 0.4  # the a100 preset's peak x its default efficiency (cluster.mfu null)


def test_device_presets_are_the_datasheet_figures():
    """Dense FP16/BF16 tensor-core peaks and HBM bandwidths of the datasheets (the table in lsgd/compute/presets.py)."""
    assert DEVICE_PEAK_FLOPS == {"v100": 125e12, "a100": 312e12, "h100": 989.4e12, "h200": 989.4e12}
    assert DEVICE_MEMORY_BANDWIDTH == {"v100": 900e9, "a100": 2039e9, "h100": 3.35e12, "h200": 4.8e12}
    assert DEVICES == ("v100", "a100", "h100", "h200", "cpu") and GPU_LAUNCH_OVERHEAD_S == 5e-6


def test_profile_defaults_and_mfu_override():
    assert CLUSTER_DEFAULTS["mfu"] is None and ComputeModel({}).mfu == 0.4 and ComputeModel({"device": "cpu"}).mfu == 1.0
    cm = ComputeModel({"device": "h100", "mfu": 0.5})
    assert cm.roofline.flops_rate == 989.4e12 * 0.5
    assert cm.roofline.spec.memory_bandwidth == 3.35e12 and cm.roofline.spec.launch_s == 5e-6


def test_profile_is_the_roofline_sum_of_the_counted_ops():
    """The step time is the sum over the counted ops of max(flops / rate, bytes / bandwidth) +
    launch, per phase, recomputed here from the op records; the speed divides it."""
    model, x, y = linear_setup()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    cm = ComputeModel({"compute": "profile", "device": "h100", "mfu": 0.5}, speed=0.5)
    cm.calibrate(model, x, y, mse, optimizer=opt)
    counted = count_step(model, x, y, mse, opt, gpu=True)
    bw = 3.35e12
    for phase, got in zip(("forward", "backward", "optimizer"), (cm.step().forward_s, cm.step().backward_s,
                                                                   cm.step().optimizer_s)):
        ops = getattr(counted, phase)
        assert ops, phase
        expected = sum(max(op.flops / (989.4e12 * 0.5), op.bytes / bw) + op.launches * 5e-6 for op in ops)
        assert got == pytest.approx(expected / 0.5, rel=1e-12), phase
    assert cm.step().total_s == pytest.approx(cm.profile["step_time_s"] / 0.5, rel=1e-12)
    # the model FLOPs of FlopCounterMode: forward x W^T, backward the weight gradient only
    assert (cm.forward_flops, cm.backward_flops) == (2 * B * IN * OUT, 2 * B * IN * OUT)


def test_profile_is_constant_whatever_is_measured():
    model, x, y = linear_setup()
    cm = ComputeModel({"device": "a100"}, speed=0.8)
    with pytest.raises(RuntimeError, match="calibrate"):
        cm.step()
    cm.calibrate(model, x, y, mse)
    first = cm.step()
    assert cm.step(1.0, 2.0) == first == cm.step(123.0, 0.0) == cm.step()
    assert first.optimizer_s == 0.0  # no optimizer given


# ---------------------------------------------------------------- the roofline, op by op


def test_a_linear_op_is_priced_max_of_compute_and_memory_plus_launch():
    """F.linear is one addmm: 2 M N K FLOPs, bytes = x + W + b read + y written (float32)."""
    for m, k, n in ((8, 5, 3), (512, 512, 512), (4096, 4096, 16)):
        x, w, b = torch.randn(m, k), torch.randn(n, k), torch.randn(n)
        with OpCounter() as counter:
            F.linear(x, w, b)
        (op,) = counter.ops
        flops, nbytes = 2 * m * n * k, 4 * (m * k + n * k + n + m * n)
        assert (op.flops, op.bytes, op.launches, op.matmul_flops) == (flops, nbytes, 1, flops)
        roof = ComputeModel({"device": "a100"}).roofline
        expected = max(flops / A100_RATE, nbytes / 2039e9) + 5e-6
        assert roof.price(counter.ops).seconds == pytest.approx(expected, rel=1e-12)
        assert roof.op_seconds(flops, nbytes) == pytest.approx(expected, rel=1e-12)
    # 512^3: compute-bound on the a100 (2.15 us of FLOPs vs 2.06 us of bytes); 4096 x 4096 x 16: memory-bound
    assert 2 * 512**3 / A100_RATE > 4 * 4 * 512 * 512 / 2039e9
    assert 2 * 4096 * 4096 * 16 / A100_RATE < 4 * (4096 * 4096 + 16 * 4096 + 16 + 4096 * 16) / 2039e9


def test_an_elementwise_op_is_memory_bound():
    n = 1 << 20
    x, y = torch.randn(n), torch.randn(n)
    with OpCounter() as counter:
        x + y
    (op,) = counter.ops
    assert op.flops == n and op.bytes == 3 * 4 * n and op.matmul_flops == 0  # one FLOP per element
    phase = ComputeModel({"device": "h100"}).roofline.price(counter.ops)
    assert phase.seconds == pytest.approx(3 * 4 * n / 3.35e12 + 5e-6, rel=1e-12)
    assert phase.memory_bound_s == pytest.approx(3 * 4 * n / 3.35e12) and phase.compute_bound_s == 0.0


def test_views_launch_nothing():
    x = torch.randn(4, 6)
    with OpCounter() as counter:
        v = x.view(6, 4).t().reshape(4, 6).expand(2, 4, 6).detach()
        x.as_strided((2, 2), (1, 1))
        x.unsqueeze(0).split(2, dim=1)
        x.T.contiguous()  # a copy: one kernel
    assert [op.name for op in counter.ops] == ["aten.clone.default"] and v.shape == (2, 4, 6)


def test_many_small_layers_are_launch_bound():
    """k tiny Linear layers: the forward is k addmm kernels plus the loss's, each far below a
    microsecond of FLOPs or bytes, so the forward time is its kernels x 5 us (within 0.1%)."""
    k = 12
    model = nn.Sequential(*[nn.Linear(4, 4) for _ in range(k)])
    cm = ComputeModel({"device": "a100"})
    cm.calibrate(model, torch.randn(2, 4), torch.randn(2, 4), mse)
    p = cm.profile
    assert p["forward_kernels"] >= k
    assert p["forward_s"] == pytest.approx(p["forward_kernels"] * GPU_LAUNCH_OVERHEAD_S, rel=1e-3)
    assert p["launch_bound_s"] / p["step_time_s"] > 0.999
    assert p["achieved_mfu"] < 1e-4


@pytest.mark.parametrize("gpu", [False, True])
def test_sgd_momentum_step_bytes_closed_form(gpu):
    """SGD with momentum m, steady state, per parameter of n float32 elements:
    buf.mul_(m) (read + write buf: 2n), buf.add_(grad) (3n), param.add_(buf, alpha=-lr) (3n):
    8n x 4 bytes. On cpu torch loops over parameters (3 ops each); on a GPU it runs foreach
    kernels (3 ops, one launch each for a few small tensors)."""
    model = nn.Sequential(nn.Linear(IN, HID), nn.ReLU(), nn.Linear(HID, OUT))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(B, IN), torch.randint(0, OUT, (B,))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    counted = count_step(model, x, y, ce, opt, gpu=gpu)
    numels = [p.numel() for p in model.parameters()]
    assert sum(op.bytes for op in counted.optimizer) == 8 * 4 * sum(numels)
    assert sum(op.launches for op in counted.optimizer) == (3 if gpu else 3 * len(numels))
    assert not opt.state  # the real optimizer is untouched
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_the_clock_of_a_run_includes_the_optimizer():
    model, x, y = linear_setup()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    cm = ComputeModel({"device": "v100"})
    cm.calibrate(model, x, y, mse, optimizer=opt)
    p = cm.profile
    assert p["optimizer_s"] > 0 and p["optimizer_kernels"] > 0 and p["optimizer_bytes"] > 0
    assert p["step_time_s"] == pytest.approx(p["forward_s"] + p["backward_s"] + p["optimizer_s"], rel=1e-12)
    assert p["peak_flops"] == 125e12 and p["memory_bandwidth"] == 900e9


def test_step_time_s_overrides_and_splits_one_to_two():
    model, x, y = linear_setup()
    cm = ComputeModel({"compute": "profile", "device": "v100", "mfu": 0.3, "step_time_s": 0.3})
    cm.calibrate(model, x, y, mse)  # no-op: nothing counted
    assert cm.forward_flops is None and cm.source == "step_time_s"
    st = cm.step()
    assert st.forward_s == pytest.approx(0.1) and st.backward_s == pytest.approx(0.2)
    assert st.backward_s == pytest.approx(2 * st.forward_s) and st.total_s == pytest.approx(0.3)
    quarter = ComputeModel({"step_time_s": 0.3}, speed=0.25).step(9.0, 9.0)
    assert quarter.total_s == pytest.approx(1.2)


def test_measured_mode_divides_by_speed():
    model, x, y = linear_setup()
    cm = ComputeModel({"compute": "measured", "step_time_s": 5.0}, speed=0.25)
    cm.calibrate(model, x, y, mse)  # no-op
    assert cm.step(0.1, 0.3) == StepTime(0.1 / 0.25, 0.3 / 0.25)
    assert cm.step(0.2, 0.0).total_s == pytest.approx(0.8)
    with pytest.raises(ValueError, match="measured"):
        cm.step()
    with pytest.raises(ValueError):
        cm.step(-1.0, 0.1)
    assert ComputeModel({"compute": "measured"}).step(0.1, 0.2) == StepTime(0.1, 0.2)


def test_profile_summary():
    model, x, y = linear_setup()
    cm = ComputeModel({"compute": "profile", "device": "a100", "mfu": 0.4}, speed=0.5)
    assert cm.profile["step_time_s"] is None
    cm.calibrate(model, x, y, mse)
    p = cm.profile
    flops = 2 * B * IN * OUT
    assert p["mode"] == "profile" and p["source"] == "roofline" and p["device"] == "a100"
    assert p["peak_flops"] == 312e12 and p["mfu"] == 0.4 and p["speed"] == 0.5
    assert p["memory_bandwidth"] == 2039e9 and p["launch_s"] == 5e-6
    assert p["forward_flops"] == p["backward_flops"] == flops
    assert p["step_time_s"] == p["forward_s"] + p["backward_s"] + p["optimizer_s"]
    assert p["compute_bound_s"] + p["memory_bound_s"] + p["launch_bound_s"] == pytest.approx(p["step_time_s"])
    assert p["worker_step_time_s"] == pytest.approx(2 * p["step_time_s"])
    m = ComputeModel({"compute": "measured"}).profile
    assert m["mode"] == "measured" and m["device"] is None and m["step_time_s"] is None


def test_compute_model_rejects_bad_config_and_speed():
    with pytest.raises(ConfigError, match="cluster.mfu"):
        ComputeModel({"mfu": 0})
    for speed in (0, -1.0, math.inf, True):
        with pytest.raises(ValueError, match="speed"):
            ComputeModel({}, speed=speed)


# ---------------------------------------------------------------- resolve_speeds


@pytest.mark.parametrize("preset", HETEROGENEITY)
@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 8, 16])
def test_presets_closed_form(preset, world_size):
    speeds = resolve_speeds(preset, world_size, seed=7)
    assert speeds == resolve_speeds(preset, world_size, seed=7)  # deterministic
    assert len(speeds) == world_size
    assert all(0 < s <= 1 for s in speeds) and max(speeds) == 1.0
    spread = HETEROGENEITY_SPREAD[preset]
    n = world_size
    expected = [1.0] * n if n == 1 else [spread ** (-k / (n - 1)) for k in range(n)]
    assert sorted(speeds, reverse=True) == pytest.approx(expected, rel=1e-12)
    if n > 1:
        assert max(speeds) / min(speeds) == pytest.approx(spread)


def test_preset_levels_and_seeds():
    assert [HETEROGENEITY_SPREAD[p] for p in HETEROGENEITY] == [1.0, 1.5, 3.0, 6.0]
    assert resolve_speeds("none", 5) == resolve_speeds(None, 5) == [1.0] * 5
    # the seed permutes which rank gets which speed, the same way for every level
    by_seed = {tuple(resolve_speeds("very", 8, seed=s)) for s in range(10)}
    assert len(by_seed) > 1 and all(sorted(t) == sorted(next(iter(by_seed))) for t in by_seed)
    slowest = lambda p, s: min(range(8), key=lambda r: resolve_speeds(p, 8, s)[r])
    assert slowest("slight", 3) == slowest("moderate", 3) == slowest("very", 3)
    # the global RNGs are not consumed
    state = torch.get_rng_state()
    resolve_speeds("moderate", 16, seed=1)
    assert torch.equal(torch.get_rng_state(), state)


def test_explicit_speeds_as_given():
    assert resolve_speeds([1, 0.5, 2.0], 3) == [1.0, 0.5, 2.0]
    assert resolve_speeds((0.25, 0.75), 2) == [0.25, 0.75]


@pytest.mark.parametrize(
    "bad", ["fast", "None", [1.0, 0.5], [1.0, 0.0, 1.0, 1.0], [1, -1, 1, 1], [1, True, 1, 1], [1, math.nan, 1, 1], {"a": 1}, 3]
)
def test_bad_speeds_name_the_key_and_the_presets(bad):
    with pytest.raises(ConfigError) as err:
        resolve_speeds(bad, 4)
    message = str(err.value)
    assert "cluster.speeds" in message and all(p in message for p in HETEROGENEITY) and "4 positive numbers" in message


# ---------------------------------------------------------------- validate_cluster and nodes


def test_config_yaml_block_is_valid_and_matches_defaults():
    text = (importlib.resources.files("lsgd.conf") / "config.yaml").read_text()
    cluster = yaml.safe_load(text)["cluster"]
    assert cluster == CLUSTER_DEFAULTS
    validate_cluster(cluster, world_size=4)
    validate_cluster({}, world_size=1)  # every key defaults


def test_valid_variants():
    validate_cluster({"compute": "measured", "device": "h200", "mfu": 1, "step_time_s": 0.05, "speeds": "very"}, 8)
    validate_cluster({"speeds": [1.0, 0.5, 0.5], "gpus_per_node": 2}, 3)  # last node partial
    validate_cluster({"gpus_per_node": 8}, 2)  # one partial node


@pytest.mark.parametrize(
    "key, value, allowed",
    [
        ("compute", "fast", COMPUTE_MODES),
        ("device", "tpu", DEVICES),
        ("device", "A100", DEVICES),
        ("device", "CPU", ("cpu",)),
        ("mfu", 0, ("(0, 1]",)),
        ("mfu", 1.5, ("(0, 1]",)),
        ("mfu", -0.1, ("(0, 1]",)),
        ("mfu", "0.4", ("(0, 1]",)),
        ("mfu", True, ("(0, 1]",)),
        ("step_time_s", 0, ("null", "> 0")),
        ("step_time_s", -1.0, ("null", "> 0")),
        ("step_time_s", "1", ("null", "> 0")),
        ("step_time_s", math.inf, ("null", "> 0")),
        ("speeds", "extreme", HETEROGENEITY),
        ("speeds", [1.0, 0.5], HETEROGENEITY + ("4 positive numbers",)),
        ("speeds", [1.0, 0.5, 0.5, -0.5], HETEROGENEITY + ("4 positive numbers",)),
        ("gpus_per_node", 0, (">= 1",)),
        ("gpus_per_node", 1.5, (">= 1",)),
        ("gpus_per_node", True, (">= 1",)),
        ("gpus_per_node", None, (">= 1",)),
        ("stretch", "yes", ("true", "false")),
        ("stretch", 1, ("true", "false")),
        ("time_scale", 0, ("> 0",)),
        ("time_scale", -1.0, ("> 0",)),
        ("time_scale", "1", ("> 0",)),
        ("nodes", 2, tuple(CLUSTER_DEFAULTS)),  # unknown key
    ],
)
def test_bad_values_name_the_key_and_the_allowed_values(key, value, allowed):
    cluster = dict(CLUSTER_DEFAULTS, **{key: value})
    with pytest.raises(ConfigError) as err:
        validate_cluster(cluster, world_size=4)
    message = str(err.value)
    assert f"cluster.{key}" in message
    assert all(a in message for a in allowed), message


def test_stretch_needs_profile_mode():
    validate_cluster({"stretch": True, "time_scale": 0.5, "speeds": "very"}, 4)  # profile is the default
    with pytest.raises(ConfigError, match=r"cluster.stretch=true needs cluster.compute=profile.*'measured'"):
        validate_cluster({"stretch": True, "compute": "measured"}, 4)
    validate_cluster({"stretch": False, "compute": "measured"}, 4)


def test_stretch_target_is_the_modeled_step_time_times_the_scale():
    step_s = (0.05, 0.1)  # speeds 1.0 and 0.5 of a 0.05 s step
    assert stretch_target_s(step_s, 1, 2.0) == pytest.approx(0.2)
    assert stretch_target_s(step_s, None, 1.0) is None  # a server has no local step
    with pytest.raises(ConfigError, match="cluster.compute=profile"):
        stretch_target_s(None, 0, 1.0)


def test_stretch_step_sleeps_the_rest_less_the_blocked_time():
    """The sleep is target - (elapsed - blocked), none when the step already took the target."""
    slept = []
    start = time.perf_counter() - 0.03  # 30 ms of the step already elapsed
    rest = stretch_step(0.1, start, blocked_s=0.01, sleep=slept.append)  # 20 ms of compute so far
    assert slept == [rest] and 0.075 <= rest <= 0.08  # 80 ms less the microseconds since `start`
    assert stretch_step(0.01, start, sleep=slept.append) == 0.0 and len(slept) == 1
    t0 = time.perf_counter()  # the real sleep
    stretch_step(0.02, t0)
    assert time.perf_counter() - t0 >= 0.02


def test_nodes():
    assert [node_of(r, 4) for r in range(6)] == [0, 0, 0, 0, 1, 1]
    assert num_nodes(6, 4) == 2 and num_nodes(8, 4) == 2 and num_nodes(2, 8) == 1 and num_nodes(5, 1) == 5


def test_extra_compute_seconds():
    """Compression FLOPs on the clock: flops / (peak x mfu) / speed in profile mode; measured mode
    already contains them in the measured step."""
    model = ComputeModel({"compute": "profile", "device": "a100", "mfu": 0.5, "step_time_s": 1.0}, speed=0.5)
    assert model.seconds(312e12) == pytest.approx(312e12 / (312e12 * 0.5) / 0.5)
    assert ComputeModel({"compute": "measured"}).seconds(1e15) == 0.0


# ---------------------------------------------------------------- when gradients are final (DDP buckets)
def test_grad_ready_fractions_follow_backward_flops_in_reverse_layer_order():
    """Closed form for an MLP: backward runs layer 2 first (its weight-grad and input-grad matmuls,
    2 x 2 B HID OUT), then layer 1 (weight grad only, 2 B IN HID: x needs no gradient). Layer 2's
    parameters are final after layer 2's share of the backward FLOPs; layer 1's at the end."""
    model = nn.Sequential(nn.Linear(IN, HID), nn.ReLU(), nn.Linear(HID, OUT))
    x, y = torch.randn(B, IN), torch.randint(0, OUT, (B,))
    cm = ComputeModel({"compute": "measured"})  # any mode counts them
    ready = cm.count_grad_ready(model, x, y, ce)
    layer2, layer1 = 2 * (2 * B * HID * OUT), 2 * B * IN * HID
    total = layer2 + layer1
    assert ready == {"0.weight": 1.0, "0.bias": 1.0, "2.weight": layer2 / total, "2.bias": layer2 / total}
    # by parameter share layer 2 would be ready after (HID * OUT + OUT) / all parameters
    assert cm.forward_flops is None  # the profile is untouched outside flops mode


def test_ddp_bucket_fractions_by_flops_and_the_parameter_share_fallback():
    from lsgd.algorithms.averaging.ddp import ready_fractions

    model = nn.Sequential(nn.Linear(IN, HID), nn.ReLU(), nn.Linear(HID, OUT))
    ids = {n: id(p) for n, p in model.named_parameters()}
    by_flops = ready_fractions(model, {"0.weight": 1.0, "0.bias": 1.0, "2.weight": 0.25, "2.bias": 0.25})
    assert by_flops[ids["2.weight"]] == 0.25 and by_flops[ids["0.bias"]] == 1.0
    share = ready_fractions(model, None)
    n = [p.numel() for p in model.parameters()]
    assert share[ids["2.bias"]] == n[3] / sum(n) and share[ids["0.weight"]] == 1.0


# ---------------------------------------------------------------- the cpu preset and `lsgd calibrate`
def test_calibrate_writes_a_readable_file_that_the_cpu_preset_uses(tmp_path, monkeypatch, capsys):
    from lsgd.cli import main

    import lsgd.compute.calibration as calibration
    from lsgd.compute.opcount import ELEMENT_RATE_OPS

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(calibration, "MATMUL_CURVE_K", (8, 32))
    monkeypatch.setattr(calibration, "MATMUL_CURVE_N", 256)
    monkeypatch.setattr(calibration, "CONV_CURVE_C", (2, 8))
    monkeypatch.setattr(calibration, "CONV_CURVE_PIXELS", 64)
    threads = torch.get_num_threads()
    try:
        assert main(["calibrate", "--threads", "1"]) == 0
    finally:
        torch.set_num_threads(threads)
    path = tmp_path / "lsgd" / "cpu.json"
    assert str(path) in capsys.readouterr().out
    record = json.loads(path.read_text())["by_threads"]["1"]
    assert record == read_cpu_profile(1)
    assert record["threads"] == 1 and record["torch"] == torch.__version__
    for key in ("peak_flops", "memory_bandwidth", "special_rate", "launch_s", "first_touch_bandwidth"):
        assert math.isfinite(record[key]) and record[key] > 0, key
    # the matmul curve: the thin matmuls' k (here made cheap), then the square matmul's point
    assert [k for k, _ in record["matmul_curve"]] == [8.0, 32.0, 1024.0]
    assert record["matmul_curve"][-1][1] == record["peak_flops"]
    assert all(math.isfinite(r) and r > 0 for _, r in record["matmul_curve"])
    # the convolution curve at the (patched) channel counts, the element rates of every key
    assert [c for c, _ in record["conv_curve"]] == [2.0, 8.0]
    assert all(math.isfinite(r) and r > 0 for _, r in record["conv_curve"])
    assert set(record["element_rates"]) == {key for key, _ in ELEMENT_RATE_OPS.values()}
    assert all(math.isfinite(r) and r > 0 for r in record["element_rates"].values())
    spec = calibration.cpu_spec_from_record(record)
    assert spec.conv_curve == tuple((c, r) for c, r in record["conv_curve"])
    assert spec.element_rates == record["element_rates"]
    # the cpu preset prices ops with the file's figures (here a record written by hand)
    write_cpu_profile({**record, "threads": 3, "peak_flops": 1e9, "memory_bandwidth": 1e9, "launch_s": 1e-6,
                       "special_rate": 1e8})
    assert read_cpu_profile(1) == record  # the other thread count's record is kept
    torch.set_num_threads(3)
    try:
        cm = ComputeModel({"device": "cpu"})
        spec = cm.roofline.spec
    finally:
        torch.set_num_threads(threads)
    assert (spec.peak_flops, spec.memory_bandwidth, spec.launch_s, spec.special_rate) == (1e9, 1e9, 1e-6, 1e8)
    assert cm.roofline.op_seconds(2e6, 4e6) == pytest.approx(4e-3 + 1e-6)
    assert cm.roofline.op_seconds(1e6, 4, special=1e6) == pytest.approx(1e-3 + 1e-2 + 1e-6)


def test_cpu_without_a_calibration_refuses_a_joined_launch(tmp_path, monkeypatch):
    from lsgd.compute.calibration import ensure_cpu_profile

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with pytest.raises(ConfigError, match="lsgd calibrate --threads 7"):
        ensure_cpu_profile(7, calibrate=False)


def test_compressor_compute_is_counted_live_and_bit_identical():
    """ComputeModel.counted_seconds: the result equals an uncounted call's, bit for bit, and its
    seconds are the roofline price of the ops it ran (0 in measured mode)."""
    from lsgd.compression.compressors import build

    g = torch.randn(1000)
    topk = build("topk", cf=10.0)
    plain = topk.decompress(topk.compress(g))
    cm = ComputeModel({"device": "a100"}, speed=0.5)
    out, seconds = cm.counted_seconds(lambda: topk.decompress(topk.compress(g)))
    assert torch.equal(out, plain)
    with OpCounter() as counter:
        topk.decompress(topk.compress(g))
    assert counter.ops and seconds == pytest.approx(cm.roofline.price(counter.ops).seconds / 0.5, rel=1e-12)
    assert seconds >= len(counter.ops) * 5e-6 / 0.5
    assert ComputeModel({"compute": "measured"}).counted_seconds(lambda: 3) == (3, 0.0)


def test_a_local_launch_calibrates_cpu_before_the_workers_and_a_joined_one_refuses(tmp_path, monkeypatch):
    """launch._ensure_cpu_calibration: cluster.device=cpu without a record measures once (here a
    stand-in measurement) at the workers' thread count and stores it; a joined launch gets a
    ConfigError naming `lsgd calibrate`; other devices touch nothing."""
    import lsgd.compute.calibration as calibration
    from lsgd.launch.environment import LaunchEnv
    from lsgd.launch.launcher import _ensure_cpu_calibration

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    seen = []

    def fake_calibrate():
        seen.append(torch.get_num_threads())
        return {"peak_flops": 1e9, "memory_bandwidth": 1e9, "special_rate": 1e8, "launch_s": 1e-6,
                "threads": torch.get_num_threads(), "cpu": "test", "torch": torch.__version__, "measured_at": "now"}

    monkeypatch.setattr(calibration, "calibrate_cpu", fake_calibrate)
    threads = torch.get_num_threads()
    cfg = {"cluster": {"device": "a100"}, "launcher": {"nproc_per_node": 2, "threads_per_worker": 3}}
    _ensure_cpu_calibration(cfg, None)
    assert not seen and not (tmp_path / "lsgd").exists()
    cfg["cluster"]["device"] = "cpu"
    _ensure_cpu_calibration(cfg, None)
    assert seen == [3] and read_cpu_profile(3)["cpu"] == "test" and torch.get_num_threads() == threads
    _ensure_cpu_calibration(cfg, None)  # found: not measured again
    assert seen == [3]
    cfg["launcher"]["threads_per_worker"] = 5
    joined = LaunchEnv(rank=0, world_size=2, local_rank=0, local_world_size=2, master_addr="h", master_port=1,
                       source="torchrun")
    with pytest.raises(ConfigError, match="lsgd calibrate --threads 5"):
        _ensure_cpu_calibration(cfg, joined)


# ---------------------------------------------------------------- matmul shape efficiency, first touch (cpu)
def _curve_spec(**kw):
    from lsgd.compute.roofline import DeviceSpec

    return DeviceSpec("cpu", 16e9, 1e15, 1e-6, matmul_curve=((16.0, 1e9), (64.0, 4e9), (1024.0, 16e9)), **kw)


def test_a_matmul_is_priced_at_the_curve_rate_of_its_smallest_dimension():
    """Closed form: on a grid point exactly that point's rate; between points the log-log line
    (k = 32, halfway in log between 16 and 64: sqrt(1e9 x 4e9) = 2e9; k = 256 between 64 and 1024:
    sqrt(4e9 x 16e9) = 8e9); outside the grid the end points; not a matmul or no curve: the peak."""
    from lsgd.compute.calibration import cpu_spec_from_record
    from lsgd.compute.roofline import DeviceSpec, Roofline

    spec = _curve_spec()
    assert spec.matmul_rate(64) == 4e9 and spec.matmul_rate(16) == 1e9 and spec.matmul_rate(1024) == 16e9
    assert spec.matmul_rate(32) == pytest.approx(2e9, rel=1e-12)
    assert spec.matmul_rate(256) == pytest.approx(8e9, rel=1e-12)
    assert spec.matmul_rate(4) == 1e9 and spec.matmul_rate(4096) == 16e9 and spec.matmul_rate(0) == 16e9
    roof = Roofline(spec, 1.0)
    a, b = torch.randn(512, 64), torch.randn(64, 256)  # (M, K, N) = (512, 64, 256): smallest 64
    bias, batched = torch.randn(256), (torch.randn(3, 40, 32), torch.randn(3, 32, 100))
    with OpCounter() as counter:
        torch.mm(a, b)
        torch.addmm(bias, a, b)
        torch.bmm(*batched)  # batch 3 is not a GEMM dimension: (40, 32, 100) -> 32
        torch.relu(a)
    mm, addmm, bmm, relu = counter.ops
    assert (mm.min_dim, addmm.min_dim, bmm.min_dim, relu.min_dim) == (64, 64, 32, 0)
    flops = 2 * 512 * 64 * 256
    assert roof.price([mm]).seconds == pytest.approx(flops / 4e9 + 1e-6, rel=1e-12)
    assert roof.price([bmm]).seconds == pytest.approx(2 * 3 * 40 * 32 * 100 / 2e9 + 1e-6, rel=1e-12)
    assert roof.price([relu]).seconds == pytest.approx(512 * 64 / 16e9 + 1e-6, rel=1e-12)
    # no curve (GPU presets, an old calibration file): every matmul at the peak
    flat = Roofline(DeviceSpec("cpu", 16e9, 1e15, 1e-6), 1.0)
    assert flat.price([mm]).seconds == pytest.approx(flops / 16e9 + 1e-6, rel=1e-12)
    old = cpu_spec_from_record({"peak_flops": 16e9, "memory_bandwidth": 1e15, "launch_s": 1e-6})
    assert old.matmul_curve is None and old.first_touch_bandwidth is None and old.matmul_rate(64) == 16e9
    assert ComputeModel({"device": "a100"}).roofline.spec.matmul_rate(64) == DEVICE_PEAK_FLOPS["a100"]


def test_fresh_large_outputs_pay_first_touch_and_in_place_writes_do_not():
    """An out-of-place op whose output is >= 32 MiB (glibc's largest mmap threshold) adds
    output bytes / first_touch_bandwidth; the same op in place, or a small output, adds nothing."""
    from lsgd.compute.opcount import FRESH_ALLOCATION_BYTES
    from lsgd.compute.roofline import Roofline

    n = FRESH_ALLOCATION_BYTES // 4
    x = torch.zeros(n)
    with OpCounter() as counter:
        y = x.add(1.0)
        y.add_(1.0)
        x[:1000].add(1.0)
    fresh, in_place, small = counter.ops
    assert (fresh.fresh_bytes, in_place.fresh_bytes, small.fresh_bytes) == (4.0 * n, 0.0, 0.0)
    roof = Roofline(_curve_spec(first_touch_bandwidth=2e9), 1.0)
    plain = Roofline(_curve_spec(), 1.0)
    assert roof.price([fresh]).seconds - plain.price([fresh]).seconds == pytest.approx(4.0 * n / 2e9, rel=1e-9)
    assert roof.price([fresh]).first_touch_s == pytest.approx(4.0 * n / 2e9, rel=1e-12)
    assert roof.price([in_place, small]).seconds == plain.price([in_place, small]).seconds


def test_cpu_attention_counts_torchs_sdpa_flops():
    """F.scaled_dot_product_attention on a CPU host runs aten's _for_cpu kernels: counted as
    4 b h s^2 d forward (QK^T and PV, 2 FLOPs per multiply-accumulate) and 2.5x that backward."""
    b, h, s, d = 2, 3, 16, 8
    q, k, v = (torch.randn(b, h, s, d, requires_grad=True) for _ in range(3))
    with OpCounter(decompose=True, gpu=False) as fwd:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    with OpCounter(decompose=True, gpu=False) as bwd:
        out.sum().backward()
    assert fwd.matmul_flops == 4 * b * h * s * s * d
    assert bwd.matmul_flops == 10 * b * h * s * s * d


# ---------------------------------------------------------------- convolutions, batch-norm, max-pool (cpu)
def test_a_convolution_counts_its_closed_form_flops_and_gemm_dimension():
    """FLOPs of a convolution = 2 x N x C_out x H_out x W_out x (C_in / groups) x k_h x k_w (2 per
    multiply-accumulate); its backward to input and weight twice that; the GEMM's smallest
    dimension min(C_in / groups x k_h x k_w, C_out / groups)."""
    n, c_in, c_out, h, w, kh, kw, groups, stride = 4, 6, 8, 11, 9, 3, 5, 2, 2
    x = torch.randn(n, c_in, h, w, requires_grad=True)
    conv = nn.Conv2d(c_in, c_out, (kh, kw), stride=stride, padding=1, groups=groups, bias=False)
    with OpCounter(gpu=False) as fwd:
        out = conv(x)
    h_out, w_out = (h + 2 - kh) // stride + 1, (w + 2 - kw) // stride + 1
    assert out.shape == (n, c_out, h_out, w_out)
    flops = 2 * n * c_out * h_out * w_out * (c_in // groups) * kh * kw
    (op,) = [o for o in fwd.ops if "convolution" in o.name]
    assert op.matmul_flops == flops and op.conv_dim == min((c_in // groups) * kh * kw, c_out // groups) == 4
    # the backward (ungrouped: torch's FLOP formula counts a grouped weight gradient groups times)
    conv = nn.Conv2d(c_in, c_out, (kh, kw), stride=stride, padding=1, bias=False)
    out = conv(x)
    with OpCounter(gpu=False) as bwd:
        out.sum().backward()
    (back,) = [o for o in bwd.ops if "convolution_backward" in o.name]
    assert back.matmul_flops == 2 * 2 * n * c_out * h_out * w_out * c_in * kh * kw
    assert back.conv_dim == min(c_in * kh * kw, c_out) == 8
    # a 1-channel 5 x 5 stem (the demo CNN's first layer): K = 25, N = 16 -> 16
    with OpCounter(gpu=False) as stem:
        nn.Conv2d(1, 16, 5, padding=2, bias=False)(torch.randn(2, 1, 8, 8))
    assert [o.conv_dim for o in stem.ops if "convolution" in o.name] == [16]


def test_a_convolution_is_priced_at_the_conv_curve_and_without_one_at_the_peak():
    """Closed form: a conv with GEMM dimension 4, on a curve ((2, 1e9), (8, 4e9)), runs at
    sqrt(1e9 x 4e9) = 2e9 FLOP/s (halfway in log); a matmul on the same device keeps the matmul
    curve; no conv curve (GPU presets, an old calibration file): the peak."""
    from lsgd.compute.roofline import DeviceSpec, Roofline

    spec = DeviceSpec("cpu", 16e9, 1e15, 1e-6, matmul_curve=((16.0, 1e9), (1024.0, 16e9)),
                      conv_curve=((2.0, 1e9), (8.0, 4e9)))
    assert spec.conv_rate(4) == pytest.approx(2e9, rel=1e-12) and spec.conv_rate(0) == 16e9
    assert spec.conv_rate(1) == 1e9 and spec.conv_rate(100) == 4e9
    x = torch.randn(4, 6, 11, 9)
    with OpCounter(gpu=False) as counter:
        F.conv2d(x, torch.randn(8, 3, 3, 5), stride=2, padding=1, groups=2)
    (op,) = [o for o in counter.ops if "convolution" in o.name]
    assert op.conv_dim == 4 and op.min_dim == 0
    assert Roofline(spec, 1.0).price([op]).seconds == pytest.approx(op.matmul_flops / 2e9 + 1e-6, rel=1e-12)
    assert Roofline(spec, 0.5).price([op]).seconds == pytest.approx(op.matmul_flops / 1e9 + 1e-6, rel=1e-12)
    flat = Roofline(DeviceSpec("cpu", 16e9, 1e15, 1e-6), 1.0)
    assert flat.price([op]).seconds == pytest.approx(op.matmul_flops / 16e9 + 1e-6, rel=1e-12)
    assert ComputeModel({"device": "a100"}).roofline.spec.conv_rate(4) == DEVICE_PEAK_FLOPS["a100"]


def test_batch_norm_and_max_pool_are_priced_at_their_element_rates():
    """Training-mode batch-norm forward: elements of its input / the batch_norm_train rate;
    evaluation mode: the plain roofline. Max-pool: output elements x window / the max_pool2d rate
    (2 x 2 stride 2: the input's elements; 3 x 3 stride 2: 9 per output). Without the rates (GPU
    presets, an old calibration file): the plain roofline."""
    from lsgd.compute.roofline import DeviceSpec, Roofline

    rates = {"batch_norm_train": 1e8, "max_pool2d": 2e7}
    spec = DeviceSpec("cpu", 1e15, 1e15, 0.0, element_rates=rates)
    roof, plain = Roofline(spec, 1.0), Roofline(DeviceSpec("cpu", 1e15, 1e15, 0.0), 1.0)
    x = torch.randn(4, 3, 10, 12)
    bn = nn.BatchNorm2d(3)
    with OpCounter(gpu=False) as train:
        bn(x)
    bn.eval()
    with OpCounter(gpu=False) as evaluate:
        bn(x)
    with OpCounter(gpu=False) as pools:
        F.max_pool2d(x, 2)
        F.max_pool2d(x, 3, stride=2)
    (bn_train,) = [o for o in train.ops if "batch_norm" in o.name]
    (bn_eval,) = [o for o in evaluate.ops if "batch_norm" in o.name]
    assert (bn_train.rate_key, bn_train.rate_elements) == ("batch_norm_train", x.numel())
    assert bn_eval.rate_key == "" and roof.price([bn_eval]).seconds == plain.price([bn_eval]).seconds
    assert roof.price([bn_train]).seconds == pytest.approx(x.numel() / 1e8, rel=1e-12)
    pool2, pool3 = pools.ops
    assert pool2.rate_elements == x.numel() == (5 * 6 * 4 * 3) * 4
    assert pool3.rate_elements == (4 * 3 * 4 * 5) * 9  # (10 - 3) // 2 + 1 = 4, (12 - 3) // 2 + 1 = 5
    assert roof.price([pool3]).seconds == pytest.approx(4 * 3 * 4 * 5 * 9 / 2e7, rel=1e-12)
    assert plain.price([pool2]).seconds < 1e-9


def test_batch_norm_backward_reads_its_inputs_twice_on_cpu_only():
    """On cpu the training batch-norm backward moves 2 x (grad_out + input) more bytes than
    "every operand once" (ATen's CPU kernel makes two passes); a GPU count keeps the plain bytes."""
    x = torch.randn(4, 3, 10, 12, requires_grad=True)
    counts = {}
    for gpu in (False, True):
        bn = nn.BatchNorm2d(3)
        out = bn(x)
        with OpCounter(gpu=gpu) as counter:
            out.backward(torch.ones_like(out))
        (op,) = [o for o in counter.ops if "batch_norm_backward" in o.name]
        counts[gpu] = op.bytes
    assert counts[False] - counts[True] == 2 * x.numel() * 4


def test_calibration_times_are_this_threads_cpu_time():
    """_cpu_seconds counts the calling thread's CPU time (one torch thread): time the thread
    spends off the CPU (here asleep, as when another process holds the core) is not counted."""
    import time

    from lsgd.compute.calibration import _cpu_seconds

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert _cpu_seconds(lambda: time.sleep(0.05), 2) < 0.01
    finally:
        torch.set_num_threads(threads)


def test_a_calibration_file_of_the_old_format_is_not_read(tmp_path):
    """A format-1 file (before the conv curve, the element rates and thread-CPU timings) reads as
    no record, so the preset measures anew (or a joined launch asks for `lsgd calibrate`)."""
    from lsgd.compute.calibration import CPU_PROFILE_FORMAT

    path = tmp_path / "cpu.json"
    record = {"peak_flops": 1e9, "memory_bandwidth": 1e9, "launch_s": 1e-6, "threads": 1}
    path.write_text(json.dumps({"format": 1, "by_threads": {"1": record}}))
    assert CPU_PROFILE_FORMAT == 2 and read_cpu_profile(1, path) is None
    path.write_text(json.dumps({"format": CPU_PROFILE_FORMAT, "by_threads": {"1": record}}))
    assert read_cpu_profile(1, path) == record
