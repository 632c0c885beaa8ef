"""The checks of the ``cluster:`` config block (keys: :mod:`lsgd.compute.config`): :func:`validate_cluster`,
run when a config is validated, and :func:`validate_compute`, the keys
:class:`lsgd.compute.model.ComputeModel` reads."""

from __future__ import annotations

from collections.abc import Mapping

from lsgd.compute.config import CLUSTER_DEFAULTS, COMPUTE_MODES, is_number
from lsgd.compute.presets import DEFAULT_EFFICIENCY, DEVICES
from lsgd.compute.workers import resolve_speeds
from lsgd.core.errors import ConfigError


def validate_compute(cluster: Mapping) -> None:
    """The keys :class:`lsgd.compute.model.ComputeModel` uses: compute, device, mfu, step_time_s."""
    compute = cluster.get("compute", CLUSTER_DEFAULTS["compute"])
    if compute not in COMPUTE_MODES:
        raise ConfigError(f"cluster.compute={compute!r} is not allowed; allowed: {', '.join(COMPUTE_MODES)}")
    device = cluster.get("device", CLUSTER_DEFAULTS["device"])
    if device not in DEVICES:
        raise ConfigError(f"cluster.device={device!r} is not allowed; allowed: {', '.join(DEVICES)}")
    mfu = cluster.get("mfu", CLUSTER_DEFAULTS["mfu"])
    if mfu is not None and not (is_number(mfu) and 0 < mfu <= 1):
        raise ConfigError(f"cluster.mfu must be null (the device's default: {DEFAULT_EFFICIENCY['a100']} on a GPU, "
                          f"1.0 on cpu) or a number in (0, 1] (the fraction of peak FLOP/s a compute-bound "
                          f"kernel reaches), got {mfu!r}")
    step_time_s = cluster.get("step_time_s", CLUSTER_DEFAULTS["step_time_s"])
    if step_time_s is not None and not (is_number(step_time_s) and step_time_s > 0):
        raise ConfigError(
            f"cluster.step_time_s must be null (count the step's FLOPs) or a number of seconds > 0, got {step_time_s!r}"
        )


def validate_cluster(cluster: Mapping, world_size: int) -> None:
    """Check a resolved ``cluster`` block (plain dict) for ``world_size`` workers.

    A missing key takes its :data:`CLUSTER_DEFAULTS` value; an unknown key is an error (a typo
    would otherwise be ignored silently). ``world_size`` need not be a multiple of
    ``gpus_per_node``: the last node is then partial (:mod:`lsgd.compute.workers`, "Nodes").

    Raises:
        ConfigError: the first invalid key (``cluster.<key>``) with its allowed values.
    """
    if not isinstance(cluster, Mapping):
        raise ConfigError(f"cluster must be a mapping with keys {', '.join(CLUSTER_DEFAULTS)}, got {cluster!r}")
    unknown = sorted(set(cluster) - set(CLUSTER_DEFAULTS))
    if unknown:
        raise ConfigError(f"cluster.{unknown[0]} is not a cluster key; allowed: {', '.join(CLUSTER_DEFAULTS)}")
    validate_compute(cluster)
    resolve_speeds(cluster.get("speeds", CLUSTER_DEFAULTS["speeds"]), world_size)
    gpus = cluster.get("gpus_per_node", CLUSTER_DEFAULTS["gpus_per_node"])
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise ConfigError(f"cluster.gpus_per_node must be an integer >= 1 (workers per node), got {gpus!r}")
    stretch = cluster.get("stretch", CLUSTER_DEFAULTS["stretch"])
    if not isinstance(stretch, bool):
        raise ConfigError(f"cluster.stretch must be true or false (stretch each worker's local steps to its modeled "
                          f"step time in wall time), got {stretch!r}")
    scale = cluster.get("time_scale", CLUSTER_DEFAULTS["time_scale"])
    if not (is_number(scale) and scale > 0):
        raise ConfigError(f"cluster.time_scale must be a number > 0 (wall seconds per modeled compute second of "
                          f"cluster.stretch), got {scale!r}")
    compute = cluster.get("compute", CLUSTER_DEFAULTS["compute"])
    if stretch and compute != "profile":
        raise ConfigError(f"cluster.stretch=true needs cluster.compute=profile (each worker's local step is stretched "
                          f"to its modeled step time / speed); got cluster.compute={compute!r}; allowed: profile, "
                          f"or cluster.stretch=false")
