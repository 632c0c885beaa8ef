"""The one registry and the typed configs (lsgd.core.registry, lsgd.core.typed_config).

Every config group whose options are components (algorithms, models, datasets, optimizers,
schedules) has exactly the registry's names as options; every algorithm declares its own typed
config, which is Hydra's schema of its YAML preset; a misspelled key or a value of the wrong type is
a ConfigError naming the key, from the command line's check (before any worker starts) and from
``compose_config``.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from lsgd.algorithms import ALGORITHMS
from lsgd.algorithms.base import AlgoConfig, Algorithm
from lsgd.compression.compressors import COMPRESSORS
from lsgd.config.validation import check_override_keys, compose_config
from lsgd.core.errors import ConfigError
from lsgd.core.registry import Registry
from lsgd.core.typed_config import defaults, option, parse
from lsgd.data import DATASETS
from lsgd.models import MODELS
from lsgd.training.optim import OPTIMIZERS, SCHEDULES

CONF = Path(str(importlib.resources.files("lsgd.conf")))


def options(group: str) -> set[str]:
    return {p.stem for p in (CONF / group).glob("*.yaml")}


@pytest.mark.parametrize("group, registry", [("algo", ALGORITHMS), ("model", MODELS), ("dataset", DATASETS),
                                             ("optim", OPTIMIZERS), ("schedule", SCHEDULES)])
def test_a_groups_options_are_its_registrys_names(group, registry):
    assert options(group) == set(registry.names())


@pytest.mark.parametrize("name", ALGORITHMS.names())
def test_every_algorithm_declares_its_typed_config_and_its_yaml_is_a_preset_of_it(name):
    entry = ALGORITHMS.entry(name)
    cls = entry.obj
    assert "Config" in vars(cls) and dataclasses.is_dataclass(cls.Config) and issubclass(cls.Config, AlgoConfig)
    assert cls.Config().name == name and entry.config is cls.Config
    assert entry.label and entry.summary and entry.paper.startswith("docs/papers.md#")
    preset = yaml.safe_load((CONF / "algo" / f"{name}.yaml").read_text())
    assert preset["defaults"][0] == f"/schema/algo/{name}@_here_"
    # the preset states no default again: every key it sets differs from the dataclass's default (or interpolates)
    for key, value in preset.items():
        if key != "defaults":
            assert key in defaults(cls.Config), key
            assert value != defaults(cls.Config)[key] or str(value).startswith("${"), key
    # composed, the block has every declared key and parses
    cfg = compose_config([f"algo={name}"], check=False)
    assert set(cfg["algo"]) == set(defaults(cls.Config))
    assert cls.parse_config(cfg["algo"]).name == name


def test_a_misspelled_key_and_a_wrong_type_stop_before_any_worker_names_the_key():
    with pytest.raises(ConfigError, match=r"algo\.local_step\b.*did you mean algo\.local_steps"):
        check_override_keys(["algo=local_sgd", "+algo.local_step=4"])
    with pytest.raises(ConfigError, match=r"algo\.local_steps must be an integer, got 'four'"):
        check_override_keys(["algo=local_sgd", "algo.local_steps=four"])
    with pytest.raises(ConfigError, match=r"algo\.blocking must be true or false, got 'maybe'"):
        check_override_keys(["algo=swarm_sgd", "algo.blocking=maybe"])
    with pytest.raises(ConfigError, match=r"algo\.slow_lr must be a number, got 'x'"):
        check_override_keys(["-m", "algo=local_sgd,slowmo", "algo.slow_lr=x"])  # each arm of a sweep
    with pytest.raises(ConfigError, match=r"algo\.local_steps must be an integer, got 'four'"):
        compose_config(["algo=local_sgd", "algo.local_steps=four"])
    with pytest.raises(ConfigError, match=r"unknown config key algo\.cf for algo=accordion"):
        compose_config(["algo=accordion", "algo.cf=5"])
    with pytest.raises(ConfigError, match=r"algo\.buffer_policy='keep' is not allowed; allowed: reset, maintain, average"):
        compose_config(["algo=local_sgd", "algo.buffer_policy=keep"])


def test_an_algorithm_built_from_a_partial_block_takes_the_declared_defaults():
    cls = ALGORITHMS["local_sgd"]
    config = cls.parse_config({"name": "local_sgd", "local_steps": 3})
    assert (config.local_steps, config.buffer_policy, config.average_buffers) == (3, "maintain", True)
    with pytest.raises(ConfigError, match=r"unknown config key algo\.local_step for algo=local_sgd; did you mean algo\.local_steps"):
        cls.parse_config({"name": "local_sgd", "local_step": 3})


@dataclass
class _Toy:
    n: int = option(2, at_least=1)
    rate: float = option(0.5, above=0, below=1)
    mode: str = option("a", choices=("a", "b"))
    cap: int | None = option(None, at_least=0)
    speeds: list[float] | None = option(None)
    flag: bool = option(False)


@pytest.mark.parametrize("block, message", [
    ({"n": 0}, r"x\.n must be an integer >= 1, got 0"),
    ({"n": True}, r"x\.n must be an integer, got True"),  # a bool is not an integer
    ({"n": 2.0}, r"x\.n must be an integer, got 2\.0"),
    ({"rate": 1}, r"x\.rate must be a number > 0 and < 1, got 1"),
    ({"mode": "c"}, r"x\.mode='c' is not allowed; allowed: a, b"),
    ({"cap": -1}, r"x\.cap must be an integer or null >= 0, got -1"),
    ({"speeds": [1, "fast"]}, r"x\.speeds must be a list of a number or null, got \[1, 'fast'\]"),
    ({"flag": "yes"}, r"x\.flag must be true or false, got 'yes'"),
    ({"nn": 1}, r"unknown config key x\.nn for toy; did you mean x\.n\?"),
])
def test_parse_names_the_key_and_what_is_allowed(block, message):
    with pytest.raises(ConfigError, match=message):
        parse(_Toy, block, "x.", "toy")


def test_parse_keeps_the_values_it_is_given_and_the_defaults_of_the_rest():
    toy = parse(_Toy, {"n": 3, "rate": 1e-3, "cap": None, "speeds": [1, 0.5]}, "x.")
    assert (toy.n, toy.rate, toy.mode, toy.cap, toy.speeds, toy.flag) == (3, 1e-3, "a", None, [1, 0.5], False)
    assert isinstance(parse(_Toy, {"rate": 0.25}, "x.").rate, float)


def test_a_registry_names_the_key_the_names_and_the_closest_one():
    reg: Registry = Registry("widget", "w.name")
    reg.add("alpha", object(), label="Alpha")
    reg.add("beta", object())
    assert reg.names() == ["alpha", "beta"] and "alpha" in reg and len(reg) == 2
    assert reg.entry("beta").label == "beta"  # default label: the name
    with pytest.raises(ConfigError, match=r"w\.name='alpah' is not a registered widget; did you mean alpha\? \(allowed: alpha, beta\)"):
        reg["alpah"]
    with pytest.raises(ValueError, match="registered twice"):
        reg.add("alpha", object())


def test_an_algorithm_must_declare_its_own_config():
    with pytest.raises(TypeError, match="Config's name defaults to 'local_sgd', not 'my_method'"):
        type("MyMethod", (ALGORITHMS["local_sgd"],), {"name": "my_method"})
    assert "my_method" not in ALGORITHMS
    assert issubclass(ALGORITHMS["ddp"], Algorithm)


@pytest.mark.parametrize("name", ALGORITHMS.names())
def test_an_algorithms_label_facts_come_from_its_entry_and_its_typed_config(name):
    """Issue 37: the report's labels (labels.json) and the loggers' run names read the registry:
    the method's registered label, its defining keys (declared keys of its config), the symbols of
    its config's fields (``option(symbol=...)``) and, for a key naming a compressor, that
    compressor's registered label."""
    entry = ALGORITHMS.entry(name)
    cfg = compose_config([f"algo={name}"], check=False)
    facts = entry.obj.label_facts(cfg)
    assert set(facts) == {"values", "symbols", "defining_keys"}
    assert facts["values"]["algo.name"] == entry.label
    declared = {f"algo.{k}" for k in defaults(entry.config)}
    assert set(facts["defining_keys"]) <= declared and set(entry.defining_keys) <= set(facts["defining_keys"])
    assert set(facts["symbols"]) | set(facts["values"]) <= declared | {"algo.name"}
    assert not set(facts["symbols"]) & set(facts["values"])  # a key is written one way
    if cfg["algo"].get("compressor") in COMPRESSORS:  # (LEAD's compressors are its own: "quantize")
        assert facts["values"]["algo.compressor"] == COMPRESSORS.entry(cfg["algo"]["compressor"]).label
    assert json.loads(json.dumps(facts)) == facts  # what labels.json holds


@pytest.mark.parametrize("compressor", COMPRESSORS.names())
def test_compressed_writes_each_compressor_by_its_label_and_strength_key(compressor):
    """``compressed`` with each compressor: its label from the compressors' registry, then the key
    its entry names as its strength (CF of the sparsifiers, rank of PowerSGD; none for fp16)."""
    entry = COMPRESSORS.entry(compressor)
    cfg = compose_config(["algo=compressed", f"algo.compressor={compressor}"], check=False)
    facts = ALGORITHMS["compressed"].label_facts(cfg)
    strength = entry.extra["strength_key"]
    assert facts["values"]["algo.compressor"] == entry.label
    assert facts["defining_keys"] == ["algo.compressor", *([strength] if strength else [])]
    assert strength is None or strength[len("algo."):] in defaults(ALGORITHMS["compressed"].Config)


def test_a_fields_symbol_is_how_labels_write_it():
    from lsgd.core.typed_config import fields

    assert fields(ALGORITHMS["local_sgd"].Config)["local_steps"].metadata["symbol"] == "H"
    assert fields(_Toy)["n"].metadata["symbol"] is None  # default: the key's own name
    swarm = ALGORITHMS["swarm_sgd"]
    facts = swarm.label_facts({"algo": {"name": "swarm_sgd", "topology": "ring", "blocking": False, "local_steps": 2}})
    assert facts == {"values": {"algo.name": "SwarmSGD", "algo.topology": "ring", "algo.blocking": "non-blocking"},
                     "symbols": {"algo.local_steps": "H"}, "defining_keys": ["algo.topology", "algo.local_steps"]}
    # GraVAC's CF adapts: its compressor defines it, no strength key follows (its config declares no cf)
    assert ALGORITHMS["gravac"].label_facts({"algo": {"name": "gravac", "compressor": "topk"}})["defining_keys"] == \
        ["algo.compressor"]
