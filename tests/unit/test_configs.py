"""Every config group option and experiment bundle composes; validation rejects bad values."""

from __future__ import annotations

import importlib.resources
import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from lsgd.cli import _register_resolvers
from lsgd.config.validation import compose_config, validate
from lsgd.core.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
CONF = REPO / "conf" / "config.yaml"
GROUPS = ("algo", "model", "dataset", "optim", "schedule", "launcher", "logger", "network", "experiment", "variant", "debug")


def options(group: str) -> list[str]:
    folder = importlib.resources.files("lsgd.conf") / group
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))


#: Hydra's compositions of this module, by (config name, overrides, options): many tests compose the
#: same selections (each group option, each experiment, a study's arms), ~70 ms a time. The nodes are
#: only read (resolved into new containers).
_COMPOSED: dict = {}


def compose_once(config_name=None, overrides=None, **kwargs):
    """``hydra.compose`` (inside an initialized Hydra), each distinct composition once for the module."""
    key = (config_name, tuple(overrides or ()), tuple(sorted((k, v) for k, v in kwargs.items() if v)))  # False: the default
    if key not in _COMPOSED:
        _COMPOSED[key] = compose(config_name, overrides=overrides, **kwargs)
    return _COMPOSED[key]


def load(overrides: list[str], hydra: bool = False) -> dict:
    _register_resolvers()
    with initialize_config_module(config_module="lsgd.conf", version_base="1.3"):
        cfg = compose_once("config", overrides=overrides, return_hydra_config=hydra)
    if hydra:
        return OmegaConf.to_container(cfg.hydra, resolve=False)
    return OmegaConf.to_container(cfg, resolve=True)


def test_groups_are_shipped_with_the_package():
    for group in GROUPS:
        assert options(group), group
    assert set(options("algo")) == {
        "ddp", "local_sgd", "post_local_sgd", "slowmo", "diloco", "streaming_diloco", "sparseloco", "compressed",
        "gravac", "accordion", "demo", "adasum", "param_server", "swarm_sgd", "dpsgd", "decentlam", "sgp",
        "overlap_local_sgd", "ad_psgd", "lead", "async_local_sgd", "adsaga",
    }
    assert {"cnn", "resnet20", "resnet56", "resnet18", "resnet50", "resnet101", "vgg16", "lstm_lm", "gpt"} <= set(options("model"))
    assert {"fashion_mnist", "cifar10", "cifar100", "imagenet", "c4", "synthetic"} <= set(options("dataset"))
    assert {"1gbps", "10gbps", "100gbps"} <= set(options("network"))


@pytest.mark.parametrize("group", [g for g in GROUPS if g not in ("experiment", "variant", "debug")])
def test_every_group_option_composes(group):
    for option in options(group):
        cfg = load([f"{group}={option}"])
        assert cfg[group]["name"] == option


@pytest.mark.parametrize("experiment", options("experiment"))
def test_every_experiment_composes(experiment):
    cfg = load([f"experiment={experiment}"])
    # a bundle may name one experiment per study cell (async_text_<level>, async_c4_<size>_w<W>_<level>)
    assert cfg["experiment_name"] == experiment or cfg["experiment_name"].startswith(f"{experiment}_")
    # the model must fit the dataset in every bundle
    from lsgd.data import dataset_info
    from lsgd.models import check_compatible

    check_compatible(cfg["model"], dataset_info(cfg["dataset"]))


def test_demo_and_debug_validate():
    validate(load(["experiment=fmnist_demo"]))
    cfg = load(["debug=default", "algo=slowmo"])
    validate(cfg)
    assert cfg["dataset"]["name"] == "synthetic" and cfg["launcher"]["nproc_per_node"] == 2


def test_nproc_auto_is_four_on_cpu():
    cfg = load(["device=cpu"])
    assert cfg["launcher"]["nproc_per_node"] == "auto"
    validate(cfg)
    assert cfg["launcher"]["nproc_per_node"] == 4


def test_slurm_launcher_composes():
    hydra = load(["hydra/launcher=slurm", "hydra.launcher.nodes=4"], hydra=True)
    launcher = hydra["launcher"]
    assert launcher["_target_"].endswith("SlurmLauncher")
    assert launcher["nodes"] == 4 and launcher["tasks_per_node"] == 8


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["algo=local_sgd", "algo.local_steps=0"], "algo.local_steps"),
        (["algo=slowmo", "algo.slow_momentum=1.5"], "algo.slow_momentum"),
        (["algo=diloco", "algo.outer_optimizer=adam"], "algo.outer_optimizer"),
        (["algo=local_sgd", "algo.buffer_policy=keep"], "algo.buffer_policy"),
        (["batch_size=0"], "batch_size"),
        (["launcher.nproc_per_node=0"], "launcher.nproc_per_node"),
        (["launcher.backend=nccl", "device=cpu"], "launcher.backend"),
        pytest.param(["device=cuda"], "device", marks=pytest.mark.skipif(
            __import__("torch").cuda.is_available(), reason="CUDA present: device=cuda is valid")),
        (["eval_unit=hour"], "eval_unit"),
        (["dtype=float16"], "dtype"),
        (["target_acc=1.5"], "target_acc"),
        (["label_smoothing=1.0"], "label_smoothing"),
        (["eval_bleu_samples=-1"], "eval_bleu_samples"),
        (["label_smoothing=-0.1"], "label_smoothing"),
        (["model=gpt"], "model"),
        (["batch_size=4096"], "batch_size"),
        (["algo=compressed", "algo.cf=0.5"], "algo.cf"),
        (["algo=compressed", "algo.compressor=zip"], "algo.compressor"),
        (["algo=compressed", "algo.compressor=powersgd", "algo.rank=0"], "algo.rank"),
        (["algo=compressed", "algo.compressor=qsgd", "algo.levels=300"], "algo.levels"),
        (["algo=gravac", "algo.epsilon=0"], "algo.epsilon"),
        (["algo=gravac", "algo.epsilon=1.2"], "algo.epsilon"),
        (["algo=gravac", "algo.cf_min=0.5"], "algo.cf_min"),
        (["algo=gravac", "algo.cf_max=5"], "algo.cf_max"),
        (["algo=gravac", "algo.compressor=qsgd"], "algo.compressor"),
        (["algo=gravac", "algo.policy=linear"], "algo.policy"),
        (["algo=accordion", "algo.compressor=dgc"], "algo.compressor"),
        (["algo=accordion", "algo.compressor=powersgd", "algo.rank_high=0"], "algo.rank_high"),
        (["algo=adasum", "algo.target=weights"], "algo.target"),
        (["algo=compressed", "algo.compressor=dgc", "optim=adamw"], "algo.momentum_correction"),
        # hierarchical Adasum: one node (local launch, no local_size) or nodes that do not divide
        (["algo=adasum", "algo.hierarchical=true", "launcher.nproc_per_node=4"], "algo.hierarchical"),
        (["algo=adasum", "algo.hierarchical=true", "algo.local_size=4", "launcher.nproc_per_node=4"],
         "algo.hierarchical"),
        (["algo=adasum", "algo.hierarchical=true", "algo.local_size=2", "launcher.nproc_per_node=3"],
         "algo.hierarchical"),
        (["algo=param_server", "launcher.nproc_per_node=1"], "launcher.nproc_per_node"),
        (["cluster.compute=simulated"], "cluster.compute"),
        (["cluster.speeds=[1.0]"], "cluster.speeds"),
        (["network.report_gbps=[0]"], "network.report_gbps"),
        (["network.ports=0"], "network.ports"),
        (["network.ports=1.5"], "network.ports"),
        (["network.overhead_us=-1"], "network.overhead_us"),
        (["network.overhead_us=fast"], "network.overhead_us"),
        (["network.intra_node.overhead_us=-0.5"], "network.intra_node.overhead_us"),
        (["optim.lr_scaling=cubic"], "optim.lr_scaling"),
        (["schedule=inverse_sqrt", "schedule.warmup_steps=0"], "schedule.warmup_steps"),
        (["schedule=step", "schedule.warmup_epochs=-1"], "schedule.warmup_epochs"),
        (["schedule=step", "schedule.warmup_start_factor=1.5"], "schedule.warmup_start_factor"),
        (["schedule=cosine", "schedule.warmup_start_factor=-0.1"], "schedule.warmup_start_factor"),
        (["model=transformer_mt"], "model"),
        (["dataset=wmt17", "model=transformer_mt", "dataset.src_len=1"], "dataset.src_len"),
        (["algo=swarm_sgd", "algo.topology=star"], "algo.topology"),
        (["algo=swarm_sgd", "algo.topology=torus", "launcher.nproc_per_node=4"], "algo.topology"),
        (["algo=swarm_sgd", "algo.topology=hypercube", "launcher.nproc_per_node=3"], "algo.topology"),
        (["algo=swarm_sgd", "algo.weights=metropolis", "algo.topology=exponential"], "algo.weights"),
        (["algo=swarm_sgd", "algo.local_steps_dist=poisson"], "algo.local_steps_dist"),
        (["algo=swarm_sgd", "algo.quantizer=lattice", "algo.bits=3"], "algo.bits"),
        (["algo=swarm_sgd", "algo.quantizer=lattice", "algo.side=0"], "algo.side"),
        (["algo=swarm_sgd", "algo.blocking=maybe"], "algo.blocking"),
        (["algo=dpsgd", "algo.variant=push", "launcher.nproc_per_node=4"], "algo.variant"),
        (["algo=dpsgd", "algo.topology=ring", "launcher.nproc_per_node=2"], "algo.topology"),
        (["algo=decentlam", "algo.momentum=1.0", "optim.momentum=0", "launcher.nproc_per_node=4"], "algo.momentum"),
        (["algo=decentlam", "launcher.nproc_per_node=4"], "optim.momentum"),
        (["algo=sgp", "algo.weights=metropolis"], "algo.weights"),
        (["algo=sgp", "algo.overlap=sometimes"], "algo.overlap"),
        (["algo=overlap_local_sgd", "algo.pull=0"], "algo.pull"),
        (["algo=overlap_local_sgd", "algo.anchor_momentum=1.5"], "algo.anchor_momentum"),
        (["algo=overlap_local_sgd", "algo.local_steps=0"], "algo.local_steps"),
        (["algo=ad_psgd", "algo.topology=matching", "launcher.nproc_per_node=4"], "algo.topology"),
        (["algo=lead", "algo.topology=exponential", "launcher.nproc_per_node=4"], "algo.topology"),
        (["algo=lead", "algo.topology=matching", "launcher.nproc_per_node=4"], "algo.topology"),
        (["algo=lead", "algo.alpha=0", "launcher.nproc_per_node=4"], "algo.alpha"),
        (["algo=lead", "algo.bits=16", "launcher.nproc_per_node=4"], "algo.bits"),
        (["algo=lead", "algo.compressor=topk", "launcher.nproc_per_node=4"], "algo.compressor"),
        (["optim.clip_grad_norm=0"], "optim.clip_grad_norm"),
        (["optim=adamw", "optim.clip_grad_norm=-1"], "optim.clip_grad_norm"),
        (["optim.clip_grad_norm=big"], "optim.clip_grad_norm"),
        (["algo=ddp", "algo.carry_settlement=sometimes"], "algo.carry_settlement"),
    ],
)
def test_validation_names_the_key(overrides, key):
    """A wrong key or value is a ConfigError naming the key: from validation, or (a value of the wrong
    type for a typed config's field) already while the config is composed."""
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        compose_config(["debug=default", *overrides])


LOCAL_VS_MINIBATCH = ("minibatch_kb", "local_sgd_k", "minibatch_b")
ADSAGA_LOGREG = ("adsaga", "adsaga_async_sgd", "adsaga_sync_saga")


def study_of(variant: str) -> str:
    if variant in LOCAL_VS_MINIBATCH:
        return "local_vs_minibatch"
    if variant in ADSAGA_LOGREG:
        return "adsaga_logreg"
    return "adasum_scaling" if variant.startswith(("adasum", "avg")) else "gravac_fmnist"


@pytest.mark.parametrize("variant", options("variant"))
def test_every_variant_composes_with_its_study(variant):
    swarm = {"local_sgd_h4": "local_sgd", "dpsgd_ring": "dpsgd", "sgp": "sgp", "osgp": "sgp", "decentlam": "decentlam",
             "overlap_local_sgd": "overlap_local_sgd", "swarm_h1": "swarm_sgd", "swarm_h1_nonblocking": "swarm_sgd",
             "swarm_h4": "swarm_sgd", "swarm_h4_nonblocking": "swarm_sgd", "swarm_h1_async": "swarm_sgd",
             "ad_psgd_lockstep": "ad_psgd", "ad_psgd_async": "ad_psgd"}
    if variant.startswith("async_"):  # async_text's arms (and async_c4's: test_async_bundles_...)
        cfg = load(["experiment=async_text", f"variant={variant}"])
        assert cfg["algo"]["name"] == ("diloco" if variant == "async_sync_diloco" else "async_local_sgd")
        assert cfg["experiment_name"] == "async_text_none"
        validate(cfg)
        return
    if variant.startswith("family_"):  # diloco_family's arms
        family = {"family_ddp": "ddp", "family_diloco": "diloco", "family_streaming": "streaming_diloco",
                  "family_eager": "streaming_diloco", "family_demo": "demo", "family_sparseloco": "sparseloco"}
        cfg = load(["experiment=diloco_family", f"variant={variant}"])
        assert cfg["algo"]["name"] == family[variant] and cfg["experiment_name"] == "diloco_family"
        assert cfg["algo"].get("local_steps", 48) == 48  # every DiLoCo-like arm at the same H
        validate(cfg)
        return
    experiment = "swarm_fmnist" if variant in swarm else study_of(variant)
    cfg = load([f"experiment={experiment}", f"variant={variant}"])
    expected = swarm.get(variant) or ("adsaga" if variant in ADSAGA_LOGREG else None) or {"dense": "ddp", "avg": "ddp", "topk": "compressed", "dgc": "compressed",
                                      "randomk": "compressed", "gravac": "gravac", "accordion": "accordion",
                                      "adasum": "adasum", "minibatch": "ddp", "local": "local_sgd"}[variant.split("_")[0]]
    assert cfg["algo"]["name"] == expected
    assert cfg["experiment_name"] == experiment
    validate(cfg)


GRAVAC_ARMS = ("dense", "topk_10x", "topk_1000x", "dgc_10x", "dgc_1000x", "gravac_eps0.5", "gravac_eps0.7",
               "gravac_eps0.9", "accordion")


def test_gravac_lstm_text_arms_compose_with_the_studys_keys():
    """Every arm of gravac_lstm_text validates with the bundle's window, switch period, no DGC
    warm-up and the clipping every arm shares; gravac_fmnist keeps the variants' own values."""
    for arm in GRAVAC_ARMS:
        cfg = load(["experiment=gravac_lstm_text", f"variant={arm}"])
        validate(cfg)
        assert cfg["experiment_name"] == "gravac_lstm_text"
        assert (cfg["model"]["name"], cfg["dataset"]["name"], cfg["dataset"]["tokenizer"]) == ("lstm_lm", "text", "byte")
        assert cfg["optim"]["clip_grad_norm"] == 0.25 and cfg["optim"]["momentum"] == 0.0
        assert cfg["algo"].get("clip_norm") is None  # DGC's local clipping stays off: one rule for every arm
        tuned = {"gravac": ("window", "gravac_window", 100), "dgc": ("warmup_epochs", "dgc_warmup_epochs", 4),
                 "accordion": ("switch_period", "accordion_switch_period", 0.5)}.get(arm.split("_")[0])
        if tuned is not None:
            key, study_key, fmnist_value = tuned
            assert cfg["algo"][key] == cfg["study"][study_key], arm
            assert load(["experiment=gravac_fmnist", f"variant={arm}"])["algo"][key] == fmnist_value, arm


def _rounds_and_samples(cfg: dict) -> dict:
    """What one arm of local_vs_minibatch will do, from its composed config alone: rounds (a ddp
    step is a round, local_sgd averages every algo.local_steps steps), samples of all workers,
    and the record / evaluation periods in rounds."""
    steps_per_round = cfg["algo"]["local_steps"] if cfg["algo"]["name"] == "local_sgd" else 1
    workers = cfg["launcher"]["nproc_per_node"]
    assert cfg["max_steps"] % steps_per_round == 0
    return {
        "rounds": cfg["max_steps"] // steps_per_round,
        "samples": cfg["max_steps"] * cfg["batch_size"] * workers,
        "samples_per_round": steps_per_round * cfg["batch_size"] * workers,
        "log_rounds": cfg["log_every"] / steps_per_round,
        "eval_rounds": cfg["eval_every"] / steps_per_round,
    }


@pytest.mark.parametrize("overrides", [[], ["study.rounds=37", "study.local_steps=4", "study.local_batch=3",
                                            "study.eval_rounds=5", "study.log_rounds=2"]])
def test_local_vs_minibatch_arms_have_equal_rounds_and_samples(overrides):
    """Woodworth et al. 2020's comparison: minibatch SGD with batch K b and local SGD with K steps of
    batch b take the same R rounds and the same R K b M samples; minibatch SGD with batch b the
    same rounds and K times fewer samples. Every arm records and evaluates at the same rounds, runs
    plain SGD on logreg, and R K b M fits in the epochs cap. The study keys drive all arms."""
    arms = {}
    for variant in LOCAL_VS_MINIBATCH:
        cfg = load(["experiment=local_vs_minibatch", f"variant={variant}", *overrides])
        validate(cfg)
        assert cfg["study"]["arm"] == variant
        assert cfg["model"]["name"] == "logreg" and cfg["dataset"]["name"] == "fashion_mnist"
        assert cfg["optim"]["momentum"] == 0 and cfg["schedule"]["name"] == "constant"
        assert cfg["launcher"]["nproc_per_node"] == 4
        steps_per_epoch = 60000 // (cfg["batch_size"] * 4)
        assert cfg["epochs"] * steps_per_epoch >= cfg["max_steps"]  # max_steps, not epochs, ends the arm
        arms[variant] = _rounds_and_samples(cfg)
    study = load(["experiment=local_vs_minibatch", *overrides])["study"]
    k, b, r = study["local_steps"], study["local_batch"], study["rounds"]
    kb, local, mb = (arms[v] for v in LOCAL_VS_MINIBATCH)
    assert kb["rounds"] == local["rounds"] == mb["rounds"] == r
    assert kb["samples"] == local["samples"] == r * k * b * 4
    assert mb["samples"] * k == kb["samples"]
    assert kb["samples_per_round"] == local["samples_per_round"] == k * mb["samples_per_round"]
    for key in ("log_rounds", "eval_rounds"):
        assert kb[key] == local[key] == mb[key] == study[key]
    cfg = load(["experiment=local_vs_minibatch", "variant=local_sgd_k", *overrides])
    assert cfg["algo"]["local_steps"] == k and cfg["batch_size"] == b


ASYNC_ARMS = ("async_sync_diloco", "async_naive", "async_dn", "async_dn_dylu", "async_poly", "async_fedbuff")


@pytest.mark.parametrize("experiment, cells", [
    ("async_text", [[f"study.heterogeneity={h}"] for h in ("none", "slight", "moderate", "very")]),
    ("async_c4", [[f"model.size={m}", f"study.workers={w}", f"study.heterogeneity={h}"]
                  for m, w, h in [("20m", 4, "none"), ("60m", 4, "moderate"), ("150m", 4, "very"),
                                  ("20m", 8, "slight"), ("20m", 16, "very")]]),
])
def test_async_bundles_compose_and_validate_every_arm(experiment, cells):
    """issue 13's studies: every arm at every cell composes and validates; the synchronous arm runs
    W ranks, the asynchronous arms 1 + W (rank 0 the server), and every arm's W workers get the same
    speeds (the level's preset for W workers: fastest 1, slowest 1 / spread); each arm is the
    algorithm and outer optimizer it names; H = 50 and the inner AdamW everywhere."""
    from lsgd.compute.workers import HETEROGENEITY_SPREAD

    for cell in cells:
        workers_speeds = {}
        for arm in ASYNC_ARMS:
            cfg = load([f"experiment={experiment}", f"variant={arm}", *cell])
            validate(cfg)
            w, level = cfg["study"]["workers"], cfg["study"]["heterogeneity"]
            assert cfg["experiment_name"].startswith(f"{experiment}_") and cfg["experiment_name"].endswith(f"_{level}")
            assert cfg["study"]["arm"] == arm.removeprefix("async_") or cfg["study"]["arm"] == arm
            servers = 0 if arm == "async_sync_diloco" else 1
            assert cfg["launcher"]["nproc_per_node"] == w + servers
            speeds = cfg["cluster"]["speeds"]
            assert len(speeds) == w + servers and speeds[:servers] == [1.0] * servers
            workers_speeds[arm] = speeds[servers:]
            assert max(speeds[servers:]) == 1.0
            assert max(speeds) / min(speeds) == pytest.approx(HETEROGENEITY_SPREAD[level])
            assert cfg["algo"]["local_steps"] == 50 and cfg["optim"]["name"] == "adamw"
            algo = cfg["algo"]
            assert algo["name"] == ("diloco" if servers == 0 else "async_local_sgd")
            if arm in ("async_dn", "async_dn_dylu"):
                assert algo["outer_optimizer"] == "delayed_nesterov" and algo["dn_buffer"] == w
            else:
                assert algo["outer_optimizer"] == "nesterov"
            per_arrival = arm in ("async_naive", "async_poly")
            assert algo["outer_lr"] == (cfg["study"]["per_arrival_outer_lr"] if per_arrival else 0.7)
            if servers:
                assert algo["dylu"] == (arm == "async_dn_dylu")
                assert algo["fedbuff"] == (w if arm == "async_fedbuff" else None)
                assert (algo["staleness_exponent"] > 0) == (arm in ("async_poly", "async_fedbuff"))
        assert len({tuple(s) for s in workers_speeds.values()}) == 1, workers_speeds
    if experiment == "async_c4":
        cfg = load(["experiment=async_c4", "model.size=150m", "study.workers=16", "study.heterogeneity=very"])
        assert cfg["dataset"]["name"] == "c4" and cfg["dataset"]["seq_len"] == 256
        assert cfg["experiment_name"] == "async_c4_150m_w16_very"


@pytest.mark.parametrize("experiment", ["async_text", "async_c4"])
def test_async_bundles_take_the_least_visited_shard(experiment):
    """issue 22 item 6: the paper's data protocol (docs/papers.md#asynchronous-local-sgd, Liu et al. 2024: each new task
    takes the least-visited shard) in both async studies: every asynchronous arm composes with
    algo.shard_policy=least_visited at every level; the synchronous DiLoCo arm (its own algorithm,
    every worker the same steps) carries no such key."""
    for level in ("none", "very"):
        for arm in ASYNC_ARMS:
            cfg = load([f"experiment={experiment}", f"variant={arm}", f"study.heterogeneity={level}"])
            validate(cfg)
            if arm == "async_sync_diloco":
                assert cfg["algo"]["name"] == "diloco" and "shard_policy" not in cfg["algo"]
            else:
                assert cfg["algo"]["shard_policy"] == "least_visited", (arm, level)


def test_lsgd_add_and_speeds_resolvers():
    from lsgd.compute.workers import resolve_speeds
    from lsgd.config.resolvers import add, speeds

    assert add(4, 1) == 5 and add("4", -1) == 3 and add(7) == 7
    for bad in [(2.5,), (True, 3), ("x",), ()]:
        with pytest.raises(ValueError):
            add(*bad)
    assert speeds("very", 4, 1) == [1.0, *resolve_speeds("very", 4, 0)]
    assert speeds("none", 3) == [1.0, 1.0, 1.0]
    assert speeds("moderate", "8", "0") == resolve_speeds("moderate", 8, 0)
    for bad in [("fast", 4, 1), ("very", 0, 1), ("very", 4, -1), ("very", 2.5, 0)]:
        with pytest.raises(ValueError):
            speeds(*bad)


def test_lsgd_mul_resolver():
    from lsgd.config.resolvers import mul

    assert mul(8, 16) == 128 and mul("3", 5, 2) == 30 and mul(7) == 7
    for bad in [(2.5,), (True, 3), ("x",), ()]:
        with pytest.raises(ValueError):
            mul(*bad)


def test_lsgd_div_resolver():
    """An exact quotient; a remainder, a divisor < 1 or a non-integer is an error naming the numbers."""
    from lsgd.config.resolvers import div

    assert div(1024, 16) == 64 and div("1024", "256") == 4 and div(7, 7) == 1
    with pytest.raises(ValueError, match="1024 is not divisible by 48"):
        div(1024, 48)
    for bad in [(8, 0), (8, -2), (2.5, 1), (True, 1), ("x", 2)]:
        with pytest.raises(ValueError):
            div(*bad)


def test_lsgd_ratio_resolver():
    """A real quotient (0.7 / 4 = 0.175 exactly as Python divides); a zero denominator or a non-number
    is an error."""
    from lsgd.config.resolvers import ratio

    assert ratio(0.7, 4) == 0.175 and ratio("0.7", "64") == 0.7 / 64 and ratio(3, 2) == 1.5
    for bad in [(1, 0), (1, "0.0"), (True, 1), ("x", 2), (1, float("nan")), (float("inf"), 2)]:
        with pytest.raises(ValueError):
            ratio(*bad)


def test_async_at_scale_scales_the_per_arrival_outer_lr_with_workers():
    """async_at_scale: the naive arm's outer lr is 0.7 / W (the async_text calibration at W = 4, kept
    per worker), DN's buffer is W, the ranks are W + 1 (server) or W (sync DiLoCo), and the warm-up is
    44 steps at every W (0.05 of async_text's W = 4 epoch of 878 steps; an epoch is 4 / W of that)."""
    from lsgd.training.optim import warmup_steps

    for w in (4, 16, 64):
        naive = load(["experiment=async_at_scale", "variant=async_naive", f"study.workers={w}"])
        assert naive["algo"]["outer_lr"] == pytest.approx(0.7 / w)
        assert warmup_steps(naive["schedule"], 878 * 4 / w) == 44 and naive["max_steps"] == 300
        assert naive["launcher"]["nproc_per_node"] == w + 1 and len(naive["cluster"]["speeds"]) == w + 1
        dn = load(["experiment=async_at_scale", "variant=async_dn_dylu", f"study.workers={w}"])
        assert dn["algo"]["dn_buffer"] == w and dn["algo"]["outer_lr"] == 0.7
        sync = load(["experiment=async_at_scale", "variant=async_sync_diloco", f"study.workers={w}"])
        assert sync["launcher"]["nproc_per_node"] == w and sync["cluster"]["speeds"] == dn["cluster"]["speeds"][1:]


def test_hierarchical_adasum_with_two_nodes_validates():
    validate(load(["debug=default", "algo=adasum", "algo.hierarchical=true", "algo.local_size=2",
                   "launcher.nproc_per_node=4"]))


def test_diloco_selects_adamw_unless_optim_is_given():
    """algo=diloco picks the paper's inner optimizer (AdamW, lr 4e-4, wd 0.1, betas 0.9/0.95,
    Douillard et al. 2023) through its defaults list; an explicit optim= still wins."""
    cfg = load(["algo=diloco"])
    assert cfg["optim"]["name"] == "adamw"
    assert (cfg["optim"]["lr"], cfg["optim"]["weight_decay"], list(cfg["optim"]["betas"])) == (4e-4, 0.1, [0.9, 0.95])
    assert load(["algo=diloco", "optim=sgd"])["optim"]["name"] == "sgd"
    assert load(["optim=lamb", "algo=diloco"])["optim"]["name"] == "lamb"
    assert load(["algo=slowmo"])["optim"]["name"] == "sgd"


def test_resolvers_come_with_the_config_package():
    """A process that composes lsgd's configs without the CLI (submitit's jobs on SLURM nodes
    recompose them) resolves ``${lsgd_run_id:}`` in hydra.sweep.subdir: importing lsgd.conf
    registers it."""
    import subprocess
    import sys

    code = (
        "from hydra import compose, initialize_config_module\n"
        "from omegaconf import OmegaConf\n"
        "with initialize_config_module(config_module='lsgd.conf', version_base='1.3'):\n"
        "    cfg = compose('config', overrides=['debug=default'], return_hydra_config=True)\n"
        "print(OmegaConf.to_container(cfg.hydra.sweep, resolve=True)['subdir'])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert len(out.stdout.strip()) > 10  # a run id such as 20261122-101502-123456-a3f9


@pytest.mark.parametrize("experiment", ["imagenet_resnet50_swarm", "imagenet_resnet50_local_sgd"])
def test_imagenet_bundles_warm_up_as_goyal_et_al(experiment):
    """Goyal et al. 2017: 5 epochs of linear warm-up from the batch-256 rate 0.1 to the linearly
    scaled rate optim.lr, under the step schedule's milestones."""
    cfg = load([f"experiment={experiment}"])
    sched = cfg["schedule"]
    assert sched["name"] == "step" and sched["warmup_epochs"] == 5 and sched["milestones"] == [30, 60, 80]
    assert cfg["optim"]["lr"] * sched["warmup_start_factor"] == pytest.approx(0.1, rel=1e-12)


# ------------------------------------------------------------------ documented commands
def _train_commands(text: str, comments: bool) -> list[str]:
    """The ``lsgd train ...`` commands of a README's code blocks (``comments``: of a YAML file's
    comment lines), continuation lines joined, trailing comments and prose backticks dropped."""
    lines, out, cur, fenced = text.splitlines(), [], "", False
    for raw in lines:
        if comments:
            line = raw.lstrip("#").strip() if raw.startswith("#") else ""
        else:
            if raw.strip().startswith("```"):
                fenced = not fenced
                continue
            line = raw.strip() if fenced else ""
        if cur:
            cur += " " + line.rstrip("\\").strip()
        elif "lsgd train " in line:
            cur = line[line.index("lsgd train "):].rstrip("\\").strip()
        else:
            continue
        if not line.endswith("\\"):
            out.append(re.split(r"\s#\s|\s{2,}#", cur)[0].replace("`", ""))
            cur = ""
    return out


def test_documented_train_commands_name_only_existing_keys(monkeypatch):
    """Every `lsgd train` command in README.md, the docs and the comments of conf/ composes with keys that
    exist (lsgd.config.validation.check_override_keys), so the docs never teach a typo that would now be
    rejected (or, before, silently ignored).

    Hydra is initialized once for all commands, and each distinct group selection is composed once
    (many commands select the same groups; a composition depends on its overrides alone and
    check_override_keys only reads it): the same checks at a fraction of the cost."""
    import shlex

    import hydra

    from lsgd.config.validation import check_override_keys

    _register_resolvers()
    monkeypatch.setattr(hydra, "compose", compose_once)
    sources = [(REPO / "README.md", False)] + [(p, False) for p in sorted((REPO / "docs").rglob("*.md"))]
    sources += [(p, True) for p in sorted(CONF.parent.rglob("*.yaml"))]
    checked, bad = 0, []
    with initialize_config_module(config_module="lsgd.conf", version_base="1.3"):
        for path, comments in sources:
            for command in _train_commands(path.read_text(), comments):
                if " -sc " in command:  # the shell-completion line: no overrides
                    continue
                args = [a for a in shlex.split(command)[2:] if not re.search(r"[$<]|\.\.\.", a)]
                try:
                    check_override_keys(args)
                except ConfigError as exc:
                    bad.append(f"{path.name}: {command}\n    {exc}")
                checked += 1
    assert checked >= 100 and not bad, "\n".join(bad)


def test_wire_overhead_resolves_and_rejects_bad_values():
    """network.wire_overhead: null is 1.0, or 1514/1448 (lsgd.launch.emulate.WIRE_FACTOR) under
    launcher.emulate=true; an explicit number stays; < 1 or not a number is a ConfigError naming the key."""
    from lsgd.config.validation import resolve_wire_overhead

    cfg = load(["debug=default"])
    assert cfg["network"]["wire_overhead"] is None
    assert resolve_wire_overhead(cfg) == 1.0 and cfg["network"]["wire_overhead"] == 1.0
    cfg = load(["debug=default", "launcher.emulate=true"])
    assert resolve_wire_overhead(cfg) == pytest.approx(1514 / 1448, rel=1e-15)
    cfg = load(["debug=default", "launcher.emulate=true", "network.wire_overhead=1.0622"])
    assert resolve_wire_overhead(cfg) == 1.0622
    for bad in ("0.9", "fast"):
        cfg = load(["debug=default", f"network.wire_overhead={bad}"])
        with pytest.raises(ConfigError, match="network.wire_overhead"):
            validate(cfg)


def test_overhead_defaults_to_zero_and_measured_reads_the_calibration(tmp_path, monkeypatch):
    """network.overhead_us (LogGP's o): 0 in every network preset (no modeled time moves), a number
    stays; ``measured`` is this host's median from ``lsgd calibrate --network``'s file, resolved in
    place (the run's config.yaml then holds the number), intra_node's too; without the file a
    ConfigError says to run the calibration."""
    from lsgd.comm.calibration import network_profile_path, write_network_profile
    from lsgd.config.validation import resolve_overhead

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    for name in options("network"):
        cfg = load([f"network={name}"])
        assert cfg["network"]["overhead_us"] == 0 and cfg["network"]["intra_node"]["overhead_us"] is None, name
    cfg = load(["debug=default", "network.overhead_us=250"])
    assert resolve_overhead(cfg) == 250.0
    cfg = load(["debug=default", "network.overhead_us=measured", "network.intra_node.overhead_us=measured"])
    with pytest.raises(ConfigError, match="lsgd calibrate --network"):
        validate(cfg)
    path = write_network_profile({"overhead_us": 41.5, "overhead_us_p90": 60.0})
    assert path == network_profile_path() == tmp_path / "lsgd" / "network.json"
    cfg = load(["debug=default", "network.overhead_us=measured", "network.intra_node.overhead_us=measured"])
    validate(cfg)
    assert cfg["network"]["overhead_us"] == 41.5 and cfg["network"]["intra_node"]["overhead_us"] == 41.5
    # a launch over several nodes: each rank would read its own host's figure
    cfg = load(["debug=default", "network.overhead_us=measured"])
    with pytest.raises(ConfigError, match="several nodes"):
        resolve_overhead(cfg, several_nodes=True)


def test_a_measured_overhead_of_another_rank_count_warns(tmp_path, monkeypatch, caplog):
    """A figure measured with 2 ranks (``lsgd calibrate --network``'s default) read by a run of 4
    ranks on this host: used, with a warning naming ``--nproc 4``; none when the counts agree."""
    import logging

    from lsgd.comm.calibration import write_network_profile
    from lsgd.config.validation import resolve_overhead

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    write_network_profile({"overhead_us": 63.0, "nproc": 2})
    with caplog.at_level(logging.WARNING, logger="lsgd"):
        assert resolve_overhead(load(["debug=default", "network.overhead_us=measured"]), ranks=4) == 63.0
    assert "--nproc 4" in caplog.text and "measured with 2 ranks" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="lsgd"):
        resolve_overhead(load(["debug=default", "network.overhead_us=measured"]), ranks=2)
    assert "--nproc" not in caplog.text


# --------------------------------------------------------------------------------------------
# issue 42: debug=default adapts to the algorithm; unknown group options; study-keyed ranks
# --------------------------------------------------------------------------------------------
def _adapted(overrides: list[str]) -> list[str]:
    """The overrides ``lsgd train debug=default OVERRIDES`` adds (lsgd.config.adapt), and the adapted
    config validates."""
    from lsgd.config.adapt import adapt_overrides, explicit_keys

    cfg = load(["debug=default", *overrides])
    added = [o for o, _ in adapt_overrides(cfg, explicit_keys(overrides))]
    validate(load(["debug=default", *overrides, *added]))
    return added


def test_debug_adapts_the_workers_and_model_to_the_algorithm():
    """Two workers unless the method needs more ranks (a ring: 3 nodes; a server rank on top of the
    two workers) or another config (ADSAGA's logreg, DecentLaM's plain SGD); every method then
    validates."""
    from lsgd.algorithms import ALGORITHMS

    assert _adapted(["algo=dpsgd"]) == ["launcher.nproc_per_node=3"]
    assert _adapted(["algo=param_server"]) == ["launcher.nproc_per_node=3"]
    assert _adapted(["algo=adsaga"]) == ["model=logreg", "launcher.nproc_per_node=3"]
    assert _adapted(["algo=decentlam"]) == ["optim.momentum=0.0", "launcher.nproc_per_node=3"]
    assert _adapted(["algo=ddp"]) == [] and _adapted(["algo=swarm_sgd"]) == []
    for name in ALGORITHMS.names():
        _adapted([f"algo={name}"])
    assert _adapted(["algo=dpsgd", "algo.topology=torus"]) == ["launcher.nproc_per_node=9"]  # the topology given


def test_debug_adaptation_leaves_what_the_command_line_sets():
    from lsgd.config.adapt import adapt_overrides, explicit_keys

    def added(overrides):
        return [o for o, _ in adapt_overrides(load(["debug=default", *overrides]), explicit_keys(overrides))]

    assert added(["algo=dpsgd", "launcher.nproc_per_node=2"]) == []  # validation then names the ring
    assert added(["algo=dpsgd", "algo.topology=complete"]) == []     # two workers fit a complete graph
    assert added(["algo=adsaga", "model=cnn"]) == ["launcher.nproc_per_node=3"]
    assert added(["algo=decentlam", "optim=adamw"]) == ["launcher.nproc_per_node=3"]  # nor optim's keys
    assert added(["algo=dpsgd", "launcher.nproc_per_node=4"]) == []
    assert adapt_overrides(load(["algo=dpsgd", "launcher.nproc_per_node=2"]), set()) == []  # no debug: nothing


def test_smallest_world_counts_workers_and_what_validation_accepts():
    from lsgd.algorithms import ALGORITHMS

    assert ALGORITHMS["ddp"].smallest_world({"name": "ddp"}, 2) == (2, [])
    assert ALGORITHMS["param_server"].smallest_world({"name": "param_server"}, 2) == (3, [])
    world, rejected = ALGORITHMS["dpsgd"].smallest_world({"name": "dpsgd", "topology": "ring"}, 2)
    assert world == 3 and rejected and "ring needs at least 3 nodes" in rejected[0]
    assert ALGORITHMS["dpsgd"].smallest_world({"name": "dpsgd", "topology": "hypercube"}, 5)[0] == 8
    assert ALGORITHMS["dpsgd"].smallest_world({"name": "dpsgd", "topology": "nonexistent"}, 2) is None


def test_unknown_group_options_name_the_closest():
    from lsgd.config.validation import check_group_options

    for overrides, message in [
        (["algo=swarmsgd"], "unknown algo=swarmsgd; did you mean swarm_sgd? (options: accordion, ad_psgd, "),
        (["-m", "algo=ddp,swarmsgd"], "unknown algo=swarmsgd; did you mean swarm_sgd?"),
        (["+experiment=asnyc_text"], "unknown experiment=asnyc_text; did you mean async_text"),
        (["optim/presets=dem"], "unknown optim/presets=dem; did you mean demo? (options: demo)"),
        (["model=zzzzz"], "unknown model=zzzzz (options: cnn, gpt, "),
        (["logger=[jsonl,tensorbord]"], "unknown logger=tensorbord; did you mean tensorboard?"),
    ]:
        with pytest.raises(ConfigError) as info:
            check_group_options(overrides)
        assert str(info.value).startswith(message), str(info.value)
    check_group_options(["algo=ddp,local_sgd", "experiment=null", "hydra/launcher=slurm", "algo.local_steps=4",
                         "~variant", "model=glob(*)", "logger=[jsonl,tensorboard]", "debug=null"])


def test_a_study_keyed_experiment_takes_its_ranks_from_the_study_keys():
    """async_text / async_c4 / async_at_scale / diloco_family set launcher.nproc_per_node from
    study.workers (+ study.servers): an override that disagrees names the keys to set instead."""
    from lsgd.config.validation import check_ranks_from_study

    _register_resolvers()
    with initialize_config_module(config_module="lsgd.conf", version_base="1.3"):
        with pytest.raises(ConfigError) as info:
            check_ranks_from_study(["experiment=async_text", "launcher.nproc_per_node=8"])
        assert str(info.value) == (
            "launcher.nproc_per_node=8 disagrees with experiment=async_text, which sets the ranks from its study keys "
            "(study.workers=4, study.servers=1: 5 ranks); set study.workers (and study.servers) instead of "
            "launcher.nproc_per_node")
        with pytest.raises(ConfigError, match=r"experiment=diloco_family, .*\(study.workers=16: 16 ranks\); set "
                                              r"study.workers instead"):
            check_ranks_from_study(["experiment=diloco_family", "launcher.nproc_per_node=6"])
        with pytest.raises(ConfigError, match=r"study.workers=16, study.servers=0: 16 ranks"):
            check_ranks_from_study(["experiment=async_at_scale", "variant=async_sync_diloco", "study.workers=16",
                                    "launcher.nproc_per_node=17"])
        for ok in (["experiment=async_text", "launcher.nproc_per_node=5"],
                   ["experiment=async_text", "study.workers=7", "launcher.nproc_per_node=8"],
                   ["experiment=fmnist_demo", "launcher.nproc_per_node=8"],  # its own number, no study keys
                   ["experiment=async_text"]):
            check_ranks_from_study(ok)


# --------------------------------------------------------------------------------------------
# issue 42: experiment bundles evaluate often enough to draw a curve
# --------------------------------------------------------------------------------------------
#: training-set sizes a composed config does not give (lsgd.data.catalog.dataset_info knows them only
#: once the data is read), as lower bounds, so that the counts below are conservative: the Austen
#: corpus's training split in byte tokens (about 3.62M: 1,742 steps of 4 x 8 blocks of 65 bytes an
#: epoch, conf/experiment/gravac_lstm_text.yaml; 878 of 4 x 8 blocks of 129, async_at_scale.yaml) and
#: WMT17 de-en's training pairs (5.9M, conf/experiment/wmt17_transformer_swarm.yaml)
TEXT_BYTE_TOKENS = 3_600_000
WMT17_PAIRS = 5_900_000

#: bundles that evaluate once on purpose: clock_validation times its window of records and evaluates
#: after the last one (a record's wall time holds every earlier evaluation)
EVALUATED_ONCE = {"clock_validation"}


def steps_per_epoch(cfg: dict) -> int:
    """A run's steps per epoch from its composed config, as lsgd.data.loader.ShardedLoader counts
    them: ``dataset.steps_per_epoch`` of a streaming set (c4), else the training samples //
    (workers x batch_size), the workers being the ranks the algorithm gives the data to (a server
    takes none); text and wmt17 at :data:`TEXT_BYTE_TOKENS` / :data:`WMT17_PAIRS`."""
    from lsgd.algorithms import ALGORITHMS
    from lsgd.data import dataset_info

    ranks = cfg["launcher"]["nproc_per_node"]
    ranks = 4 if ranks == "auto" else int(ranks)  # auto: 4 on CPU (test_nproc_auto_is_four_on_cpu)
    workers = ALGORITHMS[cfg["algo"]["name"]].roles(ranks).count("worker")
    data = cfg["dataset"]
    if data["name"] == "c4":
        return int(data["steps_per_epoch"])
    if data["name"] == "text":
        assert data["tokenizer"] == "byte", "a text bundle with another tokenizer needs its own training-set size here"
        samples = TEXT_BYTE_TOKENS // (data["seq_len"] + 1)  # blocks of seq_len + 1 tokens
    elif data["name"] == "wmt17":
        samples = WMT17_PAIRS
    else:
        samples = dataset_info(data).num_train
    return samples // (workers * cfg["batch_size"])


def evaluations(cfg: dict) -> int:
    """How many evaluations a run of ``cfg`` makes, as lsgd.training.trainer.Trainer makes them: one at
    every multiple of ``eval_every`` (in steps, or epochs of :func:`steps_per_epoch`) up to the run's
    total steps (epochs x steps per epoch, or max_steps when smaller), and one at the total."""
    per_epoch = steps_per_epoch(cfg)
    total = cfg["epochs"] * per_epoch
    if cfg.get("max_steps"):
        total = min(total, cfg["max_steps"])
    period = (per_epoch if cfg["eval_unit"] == "epoch" else 1) * cfg["eval_every"]
    return total // period + (1 if total % period else 0)


@pytest.mark.parametrize("experiment", options("experiment"))
def test_every_experiment_evaluates_often_enough_to_draw_a_curve(experiment):
    """Curves, not dots: a run of every bundle, at the bundle's own settings, evaluates at least 3
    times (about 10 where the bundle sets it by lsgd_period), counted from its composed config."""
    cfg = load([f"experiment={experiment}"])
    n = evaluations(cfg)
    if experiment in EVALUATED_ONCE:
        assert n == 1, f"{experiment}: {n} evaluations; it evaluates once, after the window it times"
        return
    assert n >= 3, (f"experiment={experiment}: a run evaluates {n} time(s) (eval_unit={cfg['eval_unit']}, "
                    f"eval_every={cfg['eval_every']}, {steps_per_epoch(cfg)} steps an epoch); set them for about ten")


@pytest.mark.parametrize("experiment, overrides, expected", [
    ("swarm_fmnist", [], 11),
    ("swarm_fmnist", ["launcher.nproc_per_node=16"], 11),
    ("fmnist_demo", [], 11),
    ("fmnist_demo", ["launcher.nproc_per_node=8", "epochs=5"], 10),
    ("fmnist_local_sgd_scaling", ["epochs=2"], 11),
    ("gravac_fmnist", [], 11),
    ("adasum_scaling", [], 11),
    ("adasum_scaling", ["epochs=2", "batch_size=4096"], 6),   # 3 steps an epoch: every step
    ("adasum_at_scale", ["launcher.nproc_per_node=256"], 12),
    ("local_sgd_at_scale", ["launcher.nproc_per_node=4"], 11),
    ("local_sgd_at_scale", ["launcher.nproc_per_node=256"], 14),
    ("adsaga_logreg", [], 10),
    ("gravac_lstm_text", [], 10),
])
def test_bundles_evaluate_about_ten_times_across_their_sweeps(experiment, overrides, expected):
    """The bundles that evaluate by ``${lsgd_period:...}`` keep about ten evaluations a run at the
    workers, batches and epochs their documented sweeps set, and checkpoint once an epoch in steps
    as they did in epochs (none in a one-epoch run: not at the last step)."""
    cfg = load([f"experiment={experiment}", *overrides])
    assert cfg["eval_unit"] == "step"
    assert evaluations(cfg) == expected
    if cfg["checkpoint_every"]:
        assert cfg["checkpoint_every"] == steps_per_epoch(cfg)


def test_lsgd_period_resolver():
    """Steps of ``epochs`` passes over ``samples`` at a global batch, // points; at least 1; integers only."""
    from lsgd.config.resolvers import period

    assert period(60000, 128, 1, 10) == 46 and period(60000, 128, 3, 10) == 140 and period(60000, 128, 1, 1) == 468
    assert period("60000", "16384", "3", "10") == 1 and period(0, 4, 1, 1) == 1
    for bad in [(60000, 0, 1, 10), (60000, 128, 0, 10), (60000, 128, 1, 0), (-1, 128, 1, 1), (60000, 128, 1.5, 10),
                (True, 128, 1, 10), ("x", 128, 1, 10)]:
        with pytest.raises(ValueError):
            period(*bad)
