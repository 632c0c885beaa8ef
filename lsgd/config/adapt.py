"""``debug=default`` runs every registered algorithm: the run adapts to what the method needs.

``conf/debug/default.yaml`` sets ``adapt_to_algo: true`` beside its 2 workers. Before validation
(:func:`lsgd.launch.launcher.run`), :func:`adapt_overrides` asks the algorithm's class what it needs,
declared there once:

* the config groups and keys it runs only with, :attr:`lsgd.algorithms.base.Algorithm.requires`
  (ADSAGA: ``model=logreg``; DecentLaM, which applies its own momentum: ``optim.momentum=0.0``);
* the fewest processes that give it at least the debug's workers and that its own
  :meth:`~lsgd.algorithms.base.Algorithm.validate_config` accepts,
  :meth:`~lsgd.algorithms.base.Algorithm.smallest_world` (a parameter server's rank 0 on top of the
  workers; 3 nodes for a ring; 9 for a torus).

The answer is a list of Hydra overrides that the job's config is composed again with
(:func:`compose_job`), so every interpolation of the changed keys resolves as on a command line,
and one line on stdout says what was chosen and why (:func:`adapt_line`). What the command line
sets itself wins: an explicit ``launcher.nproc_per_node=`` or ``model=`` is never changed (a
config that then does not fit is validation's error, naming the key), and ``algo.topology=`` is
the graph the workers are counted for. A run that joins an external launch (torchrun, srun) keeps
the launch's workers, and a resumed run its saved config.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

#: the key of a composed config that turns the adaptation on (``conf/debug/default.yaml``)
ADAPT_KEY = "adapt_to_algo"

#: the largest number of processes the adaptation chooses
MAX_WORLD = 64


def explicit_keys(overrides: Iterable[str]) -> set[str]:
    """The keys and groups a list of Hydra overrides sets (``["algo=dpsgd", "++launcher.nproc_per_node=3"]``
    -> ``{"algo", "launcher.nproc_per_node"}``); deletions (``~key``) count too."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    args = [a for a in overrides if "=" in a or a.startswith("~")]
    return {o.key_or_group for o in OverridesParser.create().parse_overrides(args)} if args else set()


def _current(cfg: dict, key: str) -> Any:
    """The value of ``key`` in ``cfg``: a group's selected option (its block's ``name``) for a group
    (``model``), the value for a dotted key (``optim.weight_decay``)."""
    node: Any = cfg
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node.get("name") if isinstance(node, dict) else node


def _hydra_value(value: Any) -> str:
    """``value`` as a Hydra override writes it (``false``, ``null``, ``0.0``, ``logreg``)."""
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    return str(value)


def adapt_overrides(cfg: dict, explicit: set[str], joined: bool = False) -> list[tuple[str, str]]:
    """The overrides that make the resolved config ``cfg`` run its algorithm, each with what it
    chose and why (``("launcher.nproc_per_node=3", "running 3 workers (launcher.nproc_per_node=3), not
    2: algo.topology=ring needs at least 3 nodes; ...")``); empty when ``cfg`` does not set
    :data:`ADAPT_KEY` or nothing needs to change. ``cfg``'s ``launcher.nproc_per_node`` is the
    number of *workers* asked for: a method with server ranks gets them on top.

    Args:
        cfg: the job's resolved config (a plain dict).
        explicit: the keys and groups the command line set (:func:`explicit_keys`): never changed.
        joined: the run joins an external launch, whose tasks are the workers: their number stays.
    """
    from lsgd.algorithms import ALGORITHMS

    if cfg.get(ADAPT_KEY) is not True:
        return []
    algo = cfg.get("algo") or {}
    if algo.get("name") not in ALGORITHMS:
        return []  # validation names the unknown algorithm
    cls = ALGORITHMS[algo["name"]]
    out: list[tuple[str, str]] = []
    kept: set[str] = set()  # groups the command line chose otherwise: their keys are not set either
    for key, value in cls.requires.items():
        if _current(cfg, key) == value or key.split(".")[0] in kept:
            continue
        if key in explicit:
            kept.add(key)
            continue
        override = f"{key}={_hydra_value(value)}"
        out.append((override, f"running {override}, which it needs"))
    workers = (cfg.get("launcher") or {}).get("nproc_per_node")
    if joined or "launcher.nproc_per_node" in explicit or isinstance(workers, bool) or not isinstance(workers, int):
        return out
    found = cls.smallest_world(algo, workers, MAX_WORLD)
    if found is None or found[0] == workers:
        return out
    world, rejected = found
    servers = cls.roles(world).count("server")
    ranks = f"{world} processes, {servers} server + {world - servers} workers" if servers else f"{world} workers"
    why = rejected[:1] or [f"its server rank{'s come' if servers > 1 else ' comes'} on top of the {workers} workers"]
    if len(rejected) > 1:  # a torus: 3 to 8 nodes do not fit either
        why.append(f"nor any size up to {world - 1}")
    out.append((f"launcher.nproc_per_node={world}",
                f"running {ranks} (launcher.nproc_per_node={world}), not {workers}: {'; '.join(why)}"))
    return out


def adapt_line(cfg: dict, adapted: list[tuple[str, str]], option: str = "default") -> str:
    """The one line that says what :func:`adapt_overrides` chose and why: ``debug=default:
    algo=dpsgd: running 3 workers (launcher.nproc_per_node=3), not 2: algo.topology=ring needs at
    least 3 nodes; ...``."""
    return f"debug={option}: algo={cfg['algo']['name']}: " + "; ".join(why for _, why in adapted)


def compose_job(overrides: list[str]) -> dict:
    """The resolved config of ``overrides`` inside a running Hydra job (its config search path and
    resolvers), for a job composed again with more overrides.

    Raises:
        ConfigError: a value a typed config's field cannot hold.
    """
    from hydra import compose
    from omegaconf import OmegaConf

    from lsgd.config.validation import typed_value_error

    try:
        node = compose(config_name="config", overrides=list(overrides))
    except Exception as exc:
        error = typed_value_error(exc)
        if error is None:
            raise
        raise error from None
    return OmegaConf.to_container(node, resolve=True, throw_on_missing=True)


