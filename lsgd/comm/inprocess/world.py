"""torch.distributed's state, one copy per logical worker of the in-process cluster.

torch.distributed keeps a process's groups in one module-level object
(``torch.distributed.distributed_c10d._world``: the default group, the group names and ranks, the
group counter that names new groups). The in-process cluster's workers are threads of one process,
so :func:`installed` swaps that object for a :class:`WorkerWorld` whose fields are those of the
worker whose thread reads them (:func:`current`), and restores the process's own afterwards.
``dist.get_rank()``, ``dist.all_reduce(t)`` on the default group, ``dist.new_group(...)`` then do in
each worker what they do in a process of its own. Threads that are not workers (the main thread)
see the process's own state.

The same swap is what torch's own multi-threaded test process group does
(``torch.testing._internal.distributed.multi_threaded_pg``); this one keys the state by the worker
rank the thread runs, so a step of one worker's code run on another thread (the scheduler runs none)
would still see its own worker's groups.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch.distributed.distributed_c10d as c10d

_local = threading.local()  # .rank: the worker this thread runs; .fabric: its cluster's shared state


def current() -> int | None:
    """The worker rank of the calling thread (None outside an in-process cluster's workers)."""
    return getattr(_local, "rank", None)


def current_fabric():
    """The :class:`lsgd.comm.inprocess.backend.Fabric` of the calling worker's cluster (None
    outside one)."""
    return getattr(_local, "fabric", None)


@contextlib.contextmanager
def acting_as(rank: int, fabric) -> Iterator[None]:
    """Run the block as worker ``rank`` of ``fabric``'s cluster (this thread's world, its backend)."""
    before = (current(), current_fabric())
    _local.rank, _local.fabric = rank, fabric
    try:
        yield
    finally:
        _local.rank, _local.fabric = before


class _State:
    __slots__ = ("default_pg", "pg_map", "pg_names", "pg_group_ranks", "pg_backend_config", "group_count",
                 "tags_to_pg", "pg_to_tag", "pg_coalesce_state", "comms")

    def __init__(self):
        self.default_pg = None
        self.pg_map, self.pg_names, self.pg_group_ranks, self.pg_backend_config = {}, {}, {}, {}
        self.group_count = 0
        self.tags_to_pg, self.pg_to_tag, self.pg_coalesce_state = {}, {}, {}
        self.comms = []


def _field(name: str) -> property:
    def get(self):
        return getattr(self._state(), name)

    def set_(self, value):
        setattr(self._state(), name, value)

    return property(get, set_)


class WorkerWorld(c10d._World):
    """``c10d._World`` with a separate state per worker (:func:`current`); ``fallback`` (the
    process's own world) for other threads. ``pg_config_info`` is ``_World``'s, over these fields."""

    def __init__(self, fallback: c10d._World):  # noqa: D107 (no super().__init__: no state of its own)
        self._fallback = fallback
        self._states: dict[tuple[int, int], _State] = {}

    def _state(self):
        rank = current()
        if rank is None:
            return self._fallback
        key = (id(current_fabric()), rank)
        state = self._states.get(key)
        if state is None:
            state = self._states[key] = _State()
        return state

    def forget(self, fabric) -> None:
        """Drop the states of ``fabric``'s workers (their cluster ended)."""
        for key in [k for k in self._states if k[0] == id(fabric)]:
            del self._states[key]

    default_pg = _field("default_pg")
    pg_map = _field("pg_map")
    pg_names = _field("pg_names")
    pg_group_ranks = _field("pg_group_ranks")
    pg_backend_config = _field("pg_backend_config")
    group_count = _field("group_count")
    tags_to_pg = _field("tags_to_pg")
    pg_to_tag = _field("pg_to_tag")
    pg_coalesce_state = _field("pg_coalesce_state")
    comms = _field("comms")


_install_lock = threading.Lock()
_users = 0


@contextlib.contextmanager
def installed() -> Iterator[WorkerWorld]:
    """Swap torch.distributed's process state for a :class:`WorkerWorld` for the block (nested
    and concurrent clusters share one)."""
    global _users
    with _install_lock:
        if _users == 0:
            c10d._world = WorkerWorld(c10d._world)
        _users += 1
        world = c10d._world
    try:
        yield world
    finally:
        with _install_lock:
            _users -= 1
            if _users == 0:
                c10d._world = world._fallback
