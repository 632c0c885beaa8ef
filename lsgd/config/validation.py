"""Validation of a resolved run config, in the main process, before any worker starts.

Every check raises :class:`lsgd.core.errors.ConfigError` with the key and the allowed values. The
command line's overrides are checked before Hydra composes anything (:func:`check_override_keys`):
an option no config group has (``algo=swarmsgd``: :func:`check_group_options`), a key no config
defines, a value its typed field cannot hold.
"""

from __future__ import annotations

import torch

from lsgd.core.checks import choice, in_half_open, in_interval, int_at_least, number_at_least, positive
from lsgd.core.devices import DTYPES, cuda_available, cuda_device_index, resolve_backend, resolve_device, resolve_nproc
from lsgd.core.errors import ConfigError


def resolve_wire_overhead(cfg: dict) -> float:
    """Check ``network.wire_overhead`` (wire bytes per payload byte of the inter-node link, >= 1, or
    null) and resolve null in place: 1.0, or under ``launcher.emulate=true`` the emulated link's
    frame factor :data:`lsgd.clock.network.WIRE_FACTOR` = 1514/1448 (its ``tbf`` meters Ethernet frames of
    1448 TCP payload bytes at MTU 1500), so the clock prices the link the run runs on. Returns it.

    Raises:
        ConfigError: not a number >= 1 (nor null).
    """
    net = cfg["network"]
    if net.get("wire_overhead") is None:
        from lsgd.clock.network import WIRE_FACTOR

        net["wire_overhead"] = WIRE_FACTOR if (cfg.get("launcher") or {}).get("emulate") is True else 1.0
    number_at_least(net, "wire_overhead", 1, "network.")
    intra = net.get("intra_node") or {}
    if intra.get("wire_overhead") is not None:
        number_at_least(intra, "wire_overhead", 1, "network.intra_node.")
    return float(net["wire_overhead"])


def resolve_overhead(cfg: dict, several_nodes: bool = False, ranks: int | None = None) -> float:
    """Check ``network.overhead_us`` (LogGP's per-message overhead o, us: a finite number >= 0, or
    ``measured``; null is 0) and ``network.intra_node.overhead_us`` (the same, or null: the
    inter-node one) and resolve them in place: ``measured`` becomes this host's figure from ``lsgd
    calibrate --network`` (:func:`lsgd.comm.calibration.read_network_profile`, its median), so the
    run's ``config.yaml`` holds the number the clock used. Returns ``network.overhead_us``.
    ``several_nodes``: a joined launch over several hosts, whose ranks would each read their own
    host's figure (and price one message differently): ``measured`` is then refused. ``ranks``: the
    run's ranks on this host, where known: a figure measured with another number of ranks (``lsgd
    calibrate --network --nproc``) is used with a warning that says which to measure.

    Raises:
        ConfigError: a negative, infinite or non-numeric value, or ``measured`` without a
            calibration file or on several nodes.
    """
    import math

    net = cfg["network"]
    measured = None
    for block, where in ((net, "network."), (net.get("intra_node") or {}, "network.intra_node.")):
        value = block.get("overhead_us")
        if value is None:
            if block is net:
                net["overhead_us"] = 0.0
            continue
        if value == "measured":
            if several_nodes:
                raise ConfigError(f"{where}overhead_us=measured on a launch over several nodes: each would read its "
                                  "own host's figure; give the number (`lsgd calibrate --network` prints it)")
            if measured is None:
                from lsgd.comm.calibration import OVERHEAD_KEY, network_profile_path, read_network_profile

                record = read_network_profile()
                if record is None or not isinstance(record.get(OVERHEAD_KEY), (int, float)):
                    raise ConfigError(f"{where}overhead_us=measured needs this host's figure in {network_profile_path()}: "
                                      "run `lsgd calibrate --network` first (or give a number in us)")
                measured = float(record[OVERHEAD_KEY])
                calibrated = record.get("nproc", 2)
                if isinstance(ranks, int) and isinstance(calibrated, int) and ranks != calibrated:
                    import logging

                    logging.getLogger("lsgd").warning(
                        "%soverhead_us=measured reads %.1f us, measured with %d ranks on this host; this run has %d: "
                        "`lsgd calibrate --network --nproc %d` measures it with as many", where, measured, calibrated,
                        ranks, ranks)
            block["overhead_us"] = measured
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (value >= 0 and math.isfinite(value)):
            raise ConfigError(f"{where}overhead_us must be a number >= 0 (us per message) or measured, got {value!r}")
    return float(net["overhead_us"])


def validate(cfg: dict, world_size: int | None = None, local_world_size: int | None = None) -> None:
    """Check a resolved config (plain dict) and resolve ``launcher.nproc_per_node: auto`` in place.

    ``world_size``: the number of workers when joining an external launch (torchrun, srun), with
    ``local_world_size`` of them on this node (then ``launcher.nproc_per_node`` is set to it and the
    GPU check is :func:`cuda_device_index`'s); None: ``launcher.nproc_per_node`` local workers.

    Raises:
        ConfigError: the first invalid key, with the allowed values.
    """
    from lsgd.algorithms import ALGORITHMS
    from lsgd.data import check_available, dataset_info
    from lsgd.models import check_compatible
    from lsgd.training.loggers import logger_names
    from lsgd.training.optim import LR_SCALINGS, OPTIMIZERS, SCHEDULES

    logger_names(cfg.get("logger") or {})  # ConfigError for an unknown logger.name
    int_at_least(cfg, "batch_size", 1)
    int_at_least(cfg, "epochs", 1)
    if cfg.get("max_steps") is not None:
        int_at_least(cfg, "max_steps", 1)
    int_at_least(cfg, "log_every", 1)
    int_at_least(cfg, "eval_every", 1)
    int_at_least(cfg, "checkpoint_every", 0)
    choice(cfg, "eval_unit", ("epoch", "step"), "")
    choice(cfg, "eval_workers", (False, True), "")
    choice(cfg, "consensus_every_record", (False, True), "")
    if "interrupts" in (cfg.get("launcher") or {}):
        choice(cfg["launcher"], "interrupts", (False, True), "launcher.")
    if cfg.get("eval_workers_samples") is not None:
        int_at_least(cfg, "eval_workers_samples", 1)
    if cfg.get("eval_bleu_samples") is not None:
        int_at_least(cfg, "eval_bleu_samples", 0)
    choice(cfg, "device", ("auto", "cpu", "cuda"), "")
    choice(cfg, "dtype", DTYPES, "")
    if cfg.get("target_acc") is not None and not 0 < float(cfg["target_acc"]) <= 1:
        raise ConfigError(f"target_acc must be in (0, 1], got {cfg['target_acc']!r}")
    if cfg.get("label_smoothing") is not None:
        in_half_open(cfg, "label_smoothing", 0.0, 1.0, "")

    OPTIMIZERS.entry(cfg["optim"].get("name"))  # ConfigError naming optim.name, the optimizers and the closest
    positive(cfg["optim"], "lr", "optim.")
    if cfg["optim"].get("lr_scaling") is not None:
        choice(cfg["optim"], "lr_scaling", LR_SCALINGS, "optim.")
    if cfg["optim"].get("base_batch_size") is not None:
        int_at_least(cfg["optim"], "base_batch_size", 1, "optim.")
    if cfg["optim"].get("clip_grad_norm") is not None:  # lsgd.training.optim.clip_grad_norm (null: off)
        positive(cfg["optim"], "clip_grad_norm", "optim.")
    SCHEDULES.entry(cfg["schedule"].get("name"))
    if cfg["schedule"]["name"] == "inverse_sqrt":
        int_at_least(cfg["schedule"], "warmup_steps", 1, "schedule.")
    if cfg["schedule"]["name"] in ("step", "cosine"):
        if cfg["schedule"].get("warmup_epochs") is not None:
            number_at_least(cfg["schedule"], "warmup_epochs", 0, "schedule.")
        if cfg["schedule"].get("warmup_start_factor") is not None:
            in_interval(cfg["schedule"], "warmup_start_factor", 0, 1, "schedule.", lo_open=False)
    positive(cfg["network"], "bandwidth_gbps", "network.")
    number_at_least(cfg["network"], "latency_us", 0, "network.")
    intra = cfg["network"].get("intra_node")
    if intra is not None:
        positive(intra, "bandwidth_gbps", "network.intra_node.")
        number_at_least(intra, "latency_us", 0, "network.intra_node.")
    resolve_wire_overhead(cfg)
    nproc = (cfg.get("launcher") or {}).get("nproc_per_node")
    resolve_overhead(cfg, several_nodes=world_size is not None and local_world_size is not None
                     and int(world_size) > int(local_world_size),
                     ranks=int(local_world_size) if local_world_size is not None
                     else nproc if isinstance(nproc, int) and not isinstance(nproc, bool) else None)
    if cfg["network"].get("ports") is not None:  # lanes per port (lsgd.clock.ports.Ports)
        int_at_least(cfg["network"], "ports", 1, "network.")
    report = cfg["network"].get("report_gbps") or []
    if not isinstance(report, (list, tuple)) or any(isinstance(b, bool) or not isinstance(b, (int, float)) or b <= 0 for b in report):
        raise ConfigError(f"network.report_gbps must be a list of bandwidths > 0 (Gbps), got {report!r}")

    launcher = cfg["launcher"]
    if local_world_size is not None:  # joining: the external launch decides the workers per node
        launcher["nproc_per_node"] = int(local_world_size)
    if launcher.get("nproc_per_node") == "auto":
        launcher["nproc_per_node"] = resolve_nproc(cfg)
    int_at_least(launcher, "nproc_per_node", 1, "launcher.")
    world = int(world_size or launcher["nproc_per_node"])

    # the algorithm checks its own keys: its typed config, then what involves several keys
    # (lsgd.algorithms.base.Algorithm.validate_config)
    algo = cfg["algo"]
    cls = ALGORITHMS[algo.get("name")]
    cls.validate_config(algo, world)
    cls.validate_run(cfg, world)
    num_workers = cls.roles(world).count("worker")
    choice(launcher, "backend", ("auto", "gloo", "nccl"), "launcher.")
    device = resolve_device(cfg)
    inprocess = launcher.get("inprocess", False)
    if not isinstance(inprocess, bool):
        raise ConfigError(f"launcher.inprocess={inprocess!r} must be true or false")
    if inprocess:
        check_inprocess(cfg, world_size)
    if device == "cuda" and inprocess:  # the workers share one device
        if not cuda_available():
            raise ConfigError("device=cuda but no CUDA device is visible; use device=cpu or device=auto")
    elif device == "cuda":
        if not cuda_available():
            raise ConfigError("device=cuda but no CUDA device is visible; use device=cpu or device=auto")
        n_gpu = torch.cuda.device_count()
        if local_world_size is not None:
            cuda_device_index(0, int(local_world_size), n_gpu)
        elif launcher["nproc_per_node"] > n_gpu:
            raise ConfigError(
                f"launcher.nproc_per_node={launcher['nproc_per_node']} exceeds the {n_gpu} visible GPU(s) "
                f"on this machine; allowed: 1..{n_gpu}"
            )
    elif resolve_backend(cfg) == "nccl":
        raise ConfigError("launcher.backend=nccl needs device=cuda; allowed on CPU: gloo, auto")
    from lsgd.data import resolve as resolve_dataset
    from lsgd.data.pipeline import resolve_pin_memory

    resolve_pin_memory(resolve_dataset(cfg["dataset"])["pin_memory"], device)  # true needs cuda

    from lsgd.training.accel import validate_precision

    validate_precision(cfg, device, cls)

    from lsgd.compute.validation import validate_cluster

    validate_cluster(cfg.setdefault("cluster", {}), world)

    info = dataset_info(cfg["dataset"])
    check_compatible(cfg["model"], info)
    global_batch = int(cfg["batch_size"]) * num_workers
    if info.num_train is not None and info.num_train < global_batch:
        raise ConfigError(
            f"batch_size={cfg['batch_size']} x {num_workers} workers = {global_batch} "
            f"exceeds the {info.num_train} training samples of dataset.name={info.name}; lower batch_size"
        )
    check_available(cfg["dataset"])


def check_inprocess(cfg: dict, world_size: int | None = None) -> None:
    """What an in-process cluster (``launcher.inprocess=true``, :mod:`lsgd.launch.inprocess`) cannot
    run: time measured on this process's wall clock stands for no worker's.

    Raises:
        ConfigError: joining an external launch (torchrun / srun), ``launcher.emulate``,
            ``cluster.compute=measured``, ``cluster.stretch``, an asynchronous method with
            ``algo.timing=real``, ``launcher.backend=nccl``.
    """
    launcher, cluster, algo = cfg["launcher"], cfg.get("cluster") or {}, cfg["algo"]
    if world_size is not None:
        raise ConfigError("launcher.inprocess=true runs every worker in this process: it cannot join a "
                          "torchrun / srun launch of several tasks (run one task, or set launcher.inprocess=false)")
    if launcher.get("emulate", False) is not False:
        raise ConfigError("launcher.inprocess=true cannot run on the emulated cluster (launcher.emulate): its "
                          "workers are threads of one process; allowed: launcher.emulate=false")
    if cluster.get("compute", "profile") != "profile":
        raise ConfigError(f"cluster.compute={cluster.get('compute')} is not allowed with launcher.inprocess=true: "
                          "one process's wall time is not a worker's; allowed: cluster.compute=profile")
    if cluster.get("stretch"):
        raise ConfigError("cluster.stretch=true is not allowed with launcher.inprocess=true (the workers run one "
                          "at a time); allowed: cluster.stretch=false")
    if algo.get("timing", "virtual") == "real":
        raise ConfigError(f"algo.timing=real is not allowed with launcher.inprocess=true ({algo['name']} would "
                          "wait on wall time while one worker runs at a time); allowed: algo.timing=virtual")
    if launcher.get("backend", "auto") not in ("auto", "gloo"):
        raise ConfigError(f"launcher.backend={launcher['backend']} is not allowed with launcher.inprocess=true "
                          "(its workers talk through lsgd's in-process backend); allowed: auto")


def compose_config(overrides: list[str], *, check: bool = True, throw_on_missing: bool = False) -> dict:
    """The resolved run config (a plain dict) of ``overrides``, Hydra overrides as on the ``lsgd
    train`` command line (``["algo=local_sgd", "algo.local_steps=8"]``), composed from lsgd's config
    groups without launching anything: for tests, benchmarks and scripts that build a Trainer
    themselves. Hydra's compose API, initialised for the call (it must not be initialised already).

    Raises:
        ConfigError: ``check`` and a key or value :func:`validate` rejects; a value a typed config's
            field cannot hold (whatever ``check`` says).
        omegaconf.errors.MissingMandatoryValue: ``throw_on_missing`` and a ``???`` value left.
    """
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from lsgd.config.resolvers import register_resolvers

    register_resolvers()
    with initialize_config_module(config_module="lsgd.conf", version_base="1.3"):
        try:
            node = compose("config", overrides=list(overrides))
        except Exception as exc:
            error = typed_value_error(exc)
            if error is None:
                raise
            raise error from None
    cfg = OmegaConf.to_container(node, resolve=True, throw_on_missing=throw_on_missing)
    if check:
        validate(cfg)
    return cfg


def check_ranks_from_study(overrides: list[str]) -> None:
    """Reject a ``launcher.nproc_per_node=`` override that disagrees with an experiment that sets
    it from its study keys (``nproc_per_node: ${lsgd_add:${study.workers},${study.servers}}``:
    async_text, async_c4, async_at_scale; ``${study.workers}``: diloco_family): those keys set the
    ranks *and* what depends on them (one speed per rank, the warm-up, the outer learning rate), so
    the number of ranks is changed there. ``overrides``: the job's command-line overrides; the
    config is composed again without the ``launcher.nproc_per_node`` one, inside a running Hydra
    app (or within ``initialize_config_module``). A value that agrees with the study keys passes.

    Raises:
        ConfigError: naming the value given, the experiment, the study keys with their values and
            the ranks they give, and the keys to set instead.
    """
    import re

    from hydra import compose
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType
    from omegaconf import OmegaConf

    args = [a for a in overrides if "=" in a and not a.startswith("-")]
    parsed = OverridesParser.create().parse_overrides(args) if args else []
    given = [o for o in parsed if o.key_or_group == "launcher.nproc_per_node" and o.type != OverrideType.DEL]
    experiment = [o.get_value_element_as_str() for o in parsed if o.key_or_group == "experiment"]
    if not given or not experiment or given[-1].is_sweep_override():
        return
    node = compose(config_name="config",
                   overrides=[a for o, a in zip(parsed, args) if o.key_or_group != "launcher.nproc_per_node"])
    raw = OmegaConf.to_container(node.launcher, resolve=False).get("nproc_per_node")
    if not isinstance(raw, str) or "${" not in raw or "study." not in raw:
        return
    expected, value = OmegaConf.select(node, "launcher.nproc_per_node"), given[-1].value()
    if value == expected:
        return
    keys = list(dict.fromkeys(re.findall(r"study\.\w+", raw)))
    values = ", ".join(f"{k}={OmegaConf.select(node, k)}" for k in keys)
    instead = keys[0] + (f" (and {', '.join(keys[1:])})" if len(keys) > 1 else "")
    raise ConfigError(f"launcher.nproc_per_node={value} disagrees with experiment={experiment[-1]}, which sets the "
                      f"ranks from its study keys ({values}: {expected} ranks); set {instead} instead of "
                      f"launcher.nproc_per_node")


# --------------------------------------------------------------------------------------------
# override keys
# --------------------------------------------------------------------------------------------
def _conf_root():
    import importlib.resources

    return importlib.resources.files("lsgd.conf")


def group_options(group: str) -> list[str]:
    """The options of config group ``group`` (``algo``, ``optim/presets``): its YAML files under
    conf/, sorted."""
    path = _conf_root()
    for part in group.replace(".", "/").split("/"):
        path = path / part
    return sorted(f.name[:-5] for f in path.iterdir() if f.name.endswith(".yaml"))


def unknown_option_message(group: str, option: str, options: list[str]) -> str:
    """``unknown GROUP=OPTION; did you mean CLOSEST? (options: ...)``: the closest options by
    difflib, the way :func:`unknown_key_message` names the closest key."""
    import difflib

    close = difflib.get_close_matches(option, options, n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    return f"unknown {group}={option}{hint} (options: {', '.join(options)})"


def check_group_options(overrides: list[str]) -> None:
    """Reject a command-line selection of a config group option that does not exist
    (``algo=swarmsgd``, ``+experiment=asnyc_text``, each value of a sweep ``model=cnn,resnet`` or of
    a list ``logger=[jsonl,tensorboard]``), naming the group, the closest options and all of them,
    before Hydra composes anything (Hydra's own error prints its config search path). ``hydra/...``
    groups (Hydra's and its plugins' options) and ``null`` (no option) are not checked.

    Raises:
        ConfigError: the first unknown option (:func:`unknown_option_message`).
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType

    args = [a for a in overrides if "=" in a and not a.startswith("-")]
    for o in OverridesParser.create().parse_overrides(args) if args else []:
        group = o.key_or_group
        if o.type == OverrideType.DEL or group.startswith("hydra") or o.package or not _is_group(group):
            continue
        try:
            if o.is_sweep_override():
                values = list(o.sweep_string_iterator())
            elif isinstance(o.value(), list):  # several options at once: logger=[jsonl,tensorboard]
                values = [str(v) for v in o.value()]
            else:
                values = [o.get_value_element_as_str()]
        except Exception:  # noqa: BLE001 - a glob or range sweep: Hydra expands (and checks) it itself
            continue
        options = group_options(group)
        for value in values:
            if value not in options and value != "null":
                raise ConfigError(unknown_option_message(group.replace(".", "/"), value, options))


def _is_group(key: str) -> bool:
    """Whether ``key`` (``algo``, ``hydra/launcher``) names a config group: a folder under conf/."""
    path = _conf_root()
    for part in key.replace("/", ".").split("."):
        path = path / part
    return path.is_dir()


def _key_exists(cfg, key: str) -> bool:
    """Whether ``key`` (dotted) is in ``cfg``; keys below a null or empty mapping (free-form
    values such as ``dataset.data_files``) count as present."""
    from omegaconf import OmegaConf

    if cfg is None or cfg._is_none() or (OmegaConf.is_dict(cfg) and len(cfg) == 0):
        return True
    node, *rest = key.split(".", 1)
    if not OmegaConf.is_dict(cfg) or node not in cfg:
        return False
    return not rest or _key_exists(cfg._get_node(node), rest[0])


def unknown_key_message(cfg, key: str) -> str:
    """``unknown config key KEY`` with the closest existing key under the same parent (difflib) and
    the parent's keys."""
    import difflib

    from omegaconf import OmegaConf

    parts = key.split(".")
    parent, depth = cfg, 0
    while depth < len(parts) - 1 and OmegaConf.is_dict(parent) and parts[depth] in parent:
        parent = parent._get_node(parts[depth])
        depth += 1
    prefix = ".".join(parts[:depth])
    siblings = sorted(str(k) for k in parent.keys()) if OmegaConf.is_dict(parent) else []
    close = difflib.get_close_matches(parts[depth], siblings, n=1, cutoff=0.6)
    where = f" under {prefix}" if prefix else ""
    hint = f"; did you mean {(prefix + '.' if prefix else '') + close[0]}?" if close else ""
    shown = ", ".join(siblings[:40]) + (", ..." if len(siblings) > 40 else "")
    return f"unknown config key {key!r}{hint} (keys{where}: {shown})"


def check_override_keys(overrides: list[str]) -> None:
    """Reject command-line overrides of keys no config defines, with or without Hydra's ``+`` /
    ``++`` (a typo such as ``+algo.local_step=4`` would otherwise run with the default H).

    The config is composed from the overrides that select groups (``algo=local_sgd``,
    ``experiment=...``; a group sweep's values one at a time); a key set by an override is unknown
    when no such composition has it. ``hydra.*`` keys, group selections (``algo=``,
    ``+experiment=``) and deletions (``~key``) are not checked.

    Group options are checked first (:func:`check_group_options`).

    Raises:
        ConfigError: the first unknown group option, with the closest options, or the first unknown
            key, with the closest existing key and its siblings.
    """
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType

    check_group_options(overrides)
    args = [a for a in overrides if "=" in a and not a.startswith("-")]
    if not args:
        return
    parsed = OverridesParser.create().parse_overrides(args)
    keys = [(o, a) for o, a in zip(parsed, args)
            if o.type != OverrideType.DEL and not o.key_or_group.startswith("hydra") and not _is_group(o.key_or_group)]
    if not keys:
        return

    def plain(o, a: str, value: str | None = None) -> str:
        if value is None:
            return a
        prefix = {OverrideType.ADD: "+", OverrideType.FORCE_ADD: "++"}.get(o.type, "")
        return f"{prefix}{o.key_or_group}{'@' + o.package if o.package else ''}={value}"

    def first(o, a: str) -> str:
        return plain(o, a, next(iter(o.sweep_string_iterator()))) if o.is_sweep_override() else a

    base = [first(o, a) for o, a in zip(parsed, args)
            if _is_group(o.key_or_group) and o.type != OverrideType.DEL]
    variants = [base]
    for i, (o, a) in enumerate(zip(parsed, args)):
        if o.is_sweep_override() and _is_group(o.key_or_group):
            pos = base.index(first(o, a))
            variants += [base[:pos] + [plain(o, a, v)] + base[pos + 1:] for v in list(o.sweep_string_iterator())[1:]]
    composed = []
    fresh = not GlobalHydra.instance().is_initialized()
    ctx = initialize_config_module(config_module="lsgd.conf", version_base="1.3") if fresh else None
    try:
        if ctx is not None:
            ctx.__enter__()
        for ov in variants:
            try:
                composed.append(compose("config", overrides=ov))
            except Exception:  # a group option Hydra itself rejects: its own message follows
                continue
        if not composed:
            return
        for o, _ in keys:
            if not any(_key_exists(c, o.key_or_group) for c in composed):
                raise ConfigError(unknown_key_message(composed[0], o.key_or_group))
        for c in composed:
            _check_typed_values(c, keys)
    finally:
        if ctx is not None:
            ctx.__exit__(None, None, None)


def _check_typed_values(cfg, keys: list) -> None:
    """Check that each key override's value (each value of a sweep) fits the type of the typed
    config that holds the key in the composed config ``cfg`` (an algorithm's ``Config``, Hydra's
    schema of its group: :mod:`lsgd.config.schemas`), as Hydra will when it composes each job, but
    before any job starts and without composing again: the value is set on a fresh node of the
    schema, with OmegaConf's own conversions (``1`` for a float, ``yes`` for a bool). Allowed values
    and bounds are not checked here: an arm of a sweep outside them is validated, recorded failed
    and skipped on its own (:func:`validate`), while a value of the wrong type would stop the whole
    sweep in Hydra.

    Raises:
        ConfigError: the first value a typed field rejects (``algo.local_steps must be an integer,
            got 'four'``).
    """
    import dataclasses
    import typing

    from omegaconf import OmegaConf
    from omegaconf.errors import ValidationError

    from lsgd.core.typed_config import _type_name

    for o, _ in keys:
        leaf = o.key_or_group.split(".")[-1]
        node = cfg
        for part in o.key_or_group.split(".")[:-1]:
            node = node.get(part) if OmegaConf.is_dict(node) else None
        schema = OmegaConf.get_type(node) if OmegaConf.is_dict(node) else None
        if schema is None or not dataclasses.is_dataclass(schema):
            continue
        if leaf not in {f.name for f in dataclasses.fields(schema)}:
            continue  # not declared there: the unknown-key check covers it
        fresh = OmegaConf.structured(schema)
        values = list(o.sweep_iterator()) if o.is_sweep_override() else [o.value()]
        for value in values:
            if isinstance(value, str) and value.startswith("${"):
                continue  # an interpolation: resolved later, validated with the whole config
            try:
                fresh[leaf] = value
            except ValidationError:
                wanted = _type_name(typing.get_type_hints(schema)[leaf])
                raise ConfigError(f"{o.key_or_group} must be {wanted}, got {value!r}") from None


def typed_value_error(exc: BaseException, unknown_keys: bool = True) -> ConfigError | None:
    """The ConfigError for Hydra's rejection of a value that a typed config's field cannot hold
    (Hydra wraps the field's omegaconf ValidationError): ``algo.local_steps must be an integer, got
    'four'``, or (``unknown_keys``) of a key the typed config does not declare (ConfigKeyError); None
    for any other error."""
    import dataclasses
    import typing

    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

    from lsgd.core.typed_config import _type_name, unknown_key_error

    missing = (ConfigKeyError, ConfigAttributeError)
    cause = exc if isinstance(exc, (ValidationError, *missing)) else exc.__cause__
    if isinstance(cause, missing) and dataclasses.is_dataclass(cause.object_type) and unknown_keys:
        # a key the typed config does not declare (``algo=accordion algo.cf=5``)
        group = str(cause.full_key).rsplit(".", 1)[0] if "." in str(cause.full_key) else ""
        known = [f.name for f in dataclasses.fields(cause.object_type)]
        owner = getattr(cause.object_type(), "name", "") if "name" in known else ""
        what = f"{group}={owner}" if group and owner else cause.object_type.__name__
        return unknown_key_error(f"{group}." if group else "", str(cause.key), known, what)
    if not isinstance(cause, ValidationError):
        return None
    key = str(cause.full_key or cause.key)
    hints = typing.get_type_hints(cause.object_type) if isinstance(cause.object_type, type) else {}
    field = key.rsplit(".", 1)[-1]
    wanted = _type_name(hints[field]) if field in hints else "of another type"
    return ConfigError(f"{key} must be {wanted}, got {cause.value!r}")
