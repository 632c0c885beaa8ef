"""The typed configs as Hydra's schemas: every registered algorithm's :attr:`Config` dataclass is
stored in Hydra's ConfigStore as ``schema/algo/<name>``, and ``conf/algo/<name>.yaml`` starts from
it (``defaults: [/schema/algo/<name>@_here_, _self_]``), so the YAML file is a preset that lists only
what it changes, and every key has its default and type from the one dataclass
(:mod:`lsgd.core.typed_config`).

Registered when the config package ``lsgd.conf`` is imported, as the resolvers are, so every process
that composes a config (the CLI, tests, the jobs Hydra's submitit launcher starts) has them.
"""

from __future__ import annotations

_registered = False


def register_schemas() -> None:
    """Store every algorithm's config dataclass as ``schema/algo/<name>`` (once per process)."""
    global _registered
    if _registered:
        return
    from hydra.core.config_store import ConfigStore

    from lsgd.algorithms import ALGORITHMS

    store = ConfigStore.instance()
    for entry in ALGORITHMS.entries():
        store.store(group="schema/algo", name=entry.name, node=entry.config)
    _registered = True
