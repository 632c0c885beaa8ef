"""The surface every algorithm implements; the trainer calls only these hooks.

Hook order in one step of a *worker* (trainer.py)::

    algorithm.before_step(step)         # work left over from the previous step's end (after its bookkeeping)
    forward, loss.backward()
    algorithm.after_backward(step)      # gradient reduction (DDP buckets, warm-up all-reduce)
    algorithm.optimizer_step()          # the local optimizer step (a parameter-server worker skips it)
    scheduler.step()
    algorithm.after_step(step + 1)      # model synchronization (averaging, outer steps)

``step`` passed to :meth:`Algorithm.after_step` is the number of completed local steps (1-based);
:meth:`Algorithm.before_step` gets the same count before the next step begins (after the
bookkeeping of the step that just ended). Methods whose workers take different numbers of local
steps (asynchronous SwarmSGD, asynchronous Local-SGD) set :attr:`Algorithm.lockstep` to False: the
trainer then performs each record at every multiple it crosses, one by one (see
``Trainer.bookkeeping``).
All communication goes through the :class:`lsgd.comm.communicator.Communicator` given at construction.

Roles: :meth:`Algorithm.roles` says what every rank is (``worker`` by default; ``server`` for
parameter-server methods). The trainer dispatches once: a worker runs the loop above, a server
runs ``algorithm.serve_step(step)`` per step, with the same recording, evaluation and checkpoint
services (its schedule, too, follows :meth:`Algorithm.schedule_position` where that is not None). Data shards are dealt to workers only (``RunContext.worker_index`` of
``RunContext.num_workers``); a worker reads its own shard unless :meth:`Algorithm.data_position`
names another shard and position for a step.

Registration: a subclass that sets ``name`` in its class body registers itself in
:data:`ALGORITHMS` (a :class:`lsgd.core.registry.Registry`; ``lsgd.algorithms`` imports every module
of the package) with its label, summary, paper and defining keys, and declares its ``algo.*`` keys
once, as the dataclass :attr:`Algorithm.Config` (a subclass of :class:`AlgoConfig`: defaults, types
and allowed values, :mod:`lsgd.core.typed_config`). The algorithm reads its keys from
``self.config`` (that dataclass, filled from the composed ``algo`` block); checks that involve
several keys or the world size go in :meth:`Algorithm.validate_config`. Adding an algorithm is one
module and one ``conf/algo/<name>.yaml`` (a preset of the dataclass: Hydra's schema of the group).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from lsgd.clock.worker_clock import Clock
from lsgd.comm.communicator import Communicator
from lsgd.compression.compressors import COMPRESSORS
from lsgd.core.errors import ConfigError
from lsgd.core.labels import flatten, format_value, is_missing
from lsgd.core.registry import Registry
from lsgd.core.typed_config import fields, option, parse

ROLES = ("worker", "server")

#: every registered algorithm, by ``algo.name`` (filled by Algorithm.__init_subclass__).
ALGORITHMS: Registry[type[Algorithm]] = Registry("algorithm", "algo.name")

#: registries whose members an ``algo.*`` key names (its value is written as the member's label, and
#: a defining key of this kind brings the member's ``strength_key``): the compressors.
NAMED_BY_KEY: dict[str, Registry] = {COMPRESSORS.key: COMPRESSORS}


@dataclass
class AlgoConfig:
    """The keys every ``algo`` block has; an algorithm's :attr:`Algorithm.Config` extends it."""

    name: str = option("", doc="the method (a registered algorithm: lsgd list algorithms)")


@dataclass
class RunContext:
    """What the trainer hands an algorithm at :meth:`Algorithm.setup`.

    Attributes:
        rank, world_size: this process and the number of processes (servers included).
        role: ``worker`` or ``server`` (:meth:`Algorithm.roles`).
        worker_index, num_workers: this worker's index among the workers and their number (the
            data shard it reads); ``worker_index`` is None on a server.
        steps_per_epoch, total_steps: local steps per epoch and in the run.
        batch_size: local batch (samples per worker per step).
        clock: this process's cluster clock (:class:`lsgd.clock.worker_clock.Clock`).
        device: where the model lives.
        data: the worker's :class:`lsgd.data.ShardedLoader` (None on a server).
        train_set: the whole training set (every rank, servers included; the same object the
            loader reads), for algorithms that choose their own samples (``adsaga``); None: not
            given (hand-driven hooks).
        lr: callable returning the learning rate in use this step.
        lr_decay_steps: completed-step counts from which a milestone of a step schedule lowers
            the learning rate (:func:`lsgd.training.optim.lr_decay_steps`; empty under constant and
            continuous schedules).
        seed: the run seed.
        compute_seconds: callable mapping FLOPs of extra compute (compression) to seconds on this
            worker's clock (0 in measured mode); None: not modeled.
        counted_seconds: callable running ``fn()`` and returning ``(its result, its modeled seconds
            on this worker)`` (:meth:`lsgd.compute.model.ComputeModel.counted_seconds`: its operators
            priced on the device's roofline; 0 in measured mode), for extra compute such as a
            compressor's; it dispatches slowly, so callers cache the seconds; None: not modeled.
        step_compute_s: callable returning ``(modeled, measured)`` seconds of the current step's
            forward and backward pass: what the clock was charged (the FLOP profile in
            ``cluster.compute=profile`` mode, deterministic; the measured time otherwise) and the
            measured wall time; None: not known (hand-driven hooks).
        worker_step_s: every worker's modeled compute seconds per local step (the profile divided
            by the worker's speed, ``cluster.compute=profile``), indexed by worker; None in
            measured mode or when not known. The same on every rank.
        take_losses: callable returning this rank's training-loss accumulators since the last
            call or record, ``(sum, count, non-finite count)``, and zeroing them (an algorithm
            with :attr:`Algorithm.bookkeeping` ``server`` ships its workers' losses to the server).
        add_losses: callable adding ``(sum, count, non-finite count)`` to this rank's accumulators
            (the server, with the losses its workers shipped).
        grad_ready_fraction: ``{parameter name: fraction of the backward pass's FLOPs done when its
            gradient is final}`` (:meth:`lsgd.compute.model.ComputeModel.count_grad_ready`), for
            algorithms that overlap communication with backward (DDP's buckets); None: not known
            (then by parameter share).
    """

    rank: int = 0
    world_size: int = 1
    role: str = "worker"
    worker_index: int | None = 0
    num_workers: int = 1
    steps_per_epoch: int | None = None
    total_steps: int | None = None
    batch_size: int | None = None
    clock: Clock | None = None
    device: torch.device | None = None
    data: Any = None
    train_set: Any = None
    lr: Callable[[], float] | None = None
    lr_decay_steps: tuple[int, ...] = ()
    seed: int = 0
    compute_seconds: Callable[[float], float] | None = None
    counted_seconds: Callable[[Callable[[], Any]], tuple[Any, float]] | None = None
    step_compute_s: Callable[[], tuple[float, float]] | None = None
    worker_step_s: tuple[float, ...] | None = None
    take_losses: Callable[[], tuple[float, int, int]] | None = None
    add_losses: Callable[[float, int, int], None] | None = None
    grad_ready_fraction: Mapping[str, float] | None = None


def float_buffers(model: nn.Module) -> list[torch.Tensor]:
    """Floating-point buffers of ``model`` (BatchNorm running mean/var) in a fixed order.

    Integer buffers (BatchNorm's ``num_batches_tracked``) count forward passes, which every worker
    makes equally often, so they are identical across workers and never communicated.
    """
    return [b for b in model.buffers() if b.is_floating_point()]


def model_tensors(model: nn.Module, buffers: bool) -> list[torch.Tensor]:
    """Parameters (and floating-point buffers if ``buffers``) of ``model`` in a fixed order."""
    tensors = [p.data for p in model.parameters()]
    if buffers:
        tensors += float_buffers(model)
    return tensors


@contextlib.contextmanager
def holding_model_of(model: nn.Module, comm: Communicator, src: int) -> Iterator[None]:
    """Within the block every rank holds rank ``src``'s parameters and floating buffers (an
    uncounted broadcast); each rank's own are restored afterwards. Parameter-server methods
    evaluate the server's model this way (their ``eval_context``)."""
    tensors = model_tensors(model, buffers=True)
    saved = [t.clone() for t in tensors]
    comm.broadcast_(tensors, src=src, count=False)
    try:
        yield
    finally:
        restore_(tensors, saved)


def restore_(tensors: list[torch.Tensor], saved: list[torch.Tensor]) -> None:
    """Copy ``saved[i]`` back into ``tensors[i]`` in place (no autograd): the end of an evaluation
    on a borrowed or averaged model."""
    with torch.no_grad():
        for t, s in zip(tensors, saved):
            t.copy_(s)


#: :attr:`Algorithm.agreement_lag` of methods whose workers drift apart between synchronizations:
#: read one step after its issue, the stop agreement tied every worker's every step to the
#: slowest's (measured on the emulated cluster at 50 Mbit/s: local SGD's wall time 5% and SlowMo's
#: 13% above the clock's), which these methods do not do; read 16 steps later it lets them drift
#: as the method does. Issued every 8th step (:data:`lsgd.training.preemption.AGREEMENTS_IN_FLIGHT`), a
#: signal then stops them within 24 steps (SLURM's ``--signal=USR1@120`` warning leaves 5 s per step).
DRIFT_AGREEMENT_LAG = 16


class Algorithm:
    """Base class: a method is a subclass in its own module of ``lsgd.algorithms``.

    Args:
        cfg: the resolved ``algo`` config group (a plain dict; ``cfg["name"]`` is the method),
            parsed into :attr:`Config` as ``self.config`` (keys it leaves out take their defaults).
        comm: the accounting communicator of this worker.

    Raises:
        lsgd.core.errors.ConfigError: a key of ``cfg`` that :attr:`Config` does not declare, or a
            value of the wrong type or not allowed.
    """

    name = "base"

    #: The ``algo.*`` keys of this method with their defaults, types and allowed values
    #: (:mod:`lsgd.core.typed_config`); ``self.config`` holds the run's values.
    Config: type[AlgoConfig] = AlgoConfig
    #: How tables and figures write the method (``"local SGD"``); default: ``name``.
    label: str = ""
    #: The source: a section of docs/papers.md (``docs/papers.md#local-sgd``).
    paper: str = ""
    #: Config keys written in every label of a run of this method, whatever other runs hold (H of
    #: local SGD, the compressor of ``compressed``, the graph of a gossip method).
    defining_keys: tuple[str, ...] = ()

    #: True when every rank's :meth:`progress` passes through the same values at the same points
    #: (all synchronous methods). False: ranks' progress moves at different local steps and by
    #: different amounts, and the trainer records at each crossed multiple separately.
    lockstep = True

    #: Who makes records, evaluations and checkpoints. ``collective`` (the default): every rank,
    #: at the same progress counts (records all-reduce the losses, evaluations split the test set).
    #: ``server``: the server rank alone, with no collective, for methods whose progress is not
    #: known in advance (asynchronous Local-SGD in real timing): its records carry the losses the
    #: algorithm handed it (``RunContext.add_losses``), its evaluations are of its own model over
    #: the whole test set, workers make no records, and there are no checkpoints (the algorithm
    #: rejects ``checkpoint_every`` > 0). May be set per instance.
    bookkeeping = "collective"

    #: How a skipped fp16 step (gradient overflow) is agreed by every worker (:mod:`lsgd.training.accel`):
    #: ``synchronized`` (the gradients are all-reduced before the step: the verdict is already the
    #: same everywhere), ``flag`` (the found-inf flag is all-reduced with MAX every step), or None:
    #: ``precision=fp16`` is refused for this algorithm (bf16 is not).
    grad_scaler: str | None = None

    #: Calls (steps, for lock-step methods) between the issue of the stop agreement
    #: (:class:`lsgd.training.preemption.PreemptionWatch`: an uncounted MAX all-reduce of a 4-byte flag,
    #: issued every ``max(1, agreement_lag // AGREEMENTS_IN_FLIGHT)`` steps, 8 for a lag of 16) and its
    #: read; a rank can run this many steps ahead of the slowest before the agreement makes it wait,
    #: and a signal stops the run ``agreement_lag`` to ``agreement_lag + max(1, agreement_lag //
    #: AGREEMENTS_IN_FLIGHT)`` steps after it arrives (:mod:`lsgd.training.preemption`).
    #: 1 (the default) for methods that all-reduce every step: their own collectives couple the
    #: workers anyway, and a signal stops them at once.
    #: :data:`DRIFT_AGREEMENT_LAG` for methods whose workers drift apart between synchronizations
    #: (local SGD and its family, Overlap-Local-SGD, the gossip family).
    agreement_lag = 1

    #: Config groups and keys this method runs only with, ``{group or key: value}`` (ADSAGA's
    #: ``{"model": "logreg"}``): its :meth:`validate_run` rejects others, and ``debug=default``
    #: selects them where the command line does not choose (:mod:`lsgd.config.adapt`).
    requires: Mapping[str, Any] = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        name = cls.__dict__.get("name")
        if name is not None:
            if cls.Config().name != name:  # a method declares its own Config (a subclass is another method)
                raise TypeError(f"{cls.__name__}.Config's name defaults to {cls.Config().name!r}, not {name!r}")
            summary = " ".join((cls.__doc__ or "").strip().split("\n\n")[0].split())
            # label and paper are the class's own (a subclass is another method); defining keys are inherited
            ALGORITHMS.add(name, cls, config=cls.Config, label=cls.__dict__.get("label") or name, summary=summary,
                           paper=cls.__dict__.get("paper", ""), defining_keys=cls.defining_keys)

    # -- class-level: roles and config checks (called before any worker starts) -----------------
    @classmethod
    def roles(cls, world_size: int) -> list[str]:
        """The role of every rank (``worker`` or ``server``); default: all workers."""
        return ["worker"] * world_size

    @classmethod
    def parse_config(cls, algo: dict) -> AlgoConfig:
        """:attr:`Config` filled from the ``algo`` block (keys it leaves out take their defaults).

        Raises:
            lsgd.core.errors.ConfigError: a key the method does not declare (with the closest one), a
                value of the wrong type or not allowed.
        """
        return parse(cls.Config, algo, "algo.", f"algo={cls.name}")

    @classmethod
    def validate_config(cls, algo: dict, world_size: int) -> None:
        """Check this algorithm's ``algo.*`` keys for ``world_size`` processes: each key against
        :attr:`Config` (:meth:`parse_config`), then what involves several keys or the world size
        (subclasses extend it and call ``super().validate_config`` first).

        Raises:
            lsgd.core.errors.ConfigError: naming the key and the allowed values.
        """
        cls.parse_config(algo)

    @classmethod
    def smallest_world(cls, algo: dict, workers: int, limit: int = 64) -> tuple[int, list[str]] | None:
        """The fewest processes, at most ``limit``, that run ``algo`` (this method's ``algo`` block)
        with at least ``workers`` of them in the role ``worker`` (:meth:`roles`: a parameter server's
        rank 0 comes on top) and that :meth:`validate_config` accepts (a ring has 3 nodes or more, a
        torus rows x cols of at least 3 each), with the messages of the sizes it
        rejected on the way; None when no size up to ``limit`` passes (the config is wrong for
        another reason, which validation reports)."""
        rejected: list[str] = []
        for world in range(1, limit + 1):
            if cls.roles(world).count("worker") < workers:
                continue
            try:
                cls.validate_config(algo, world)
            except ConfigError as exc:
                rejected.append(str(exc))
                continue
            return world, rejected
        return None

    @classmethod
    def validate_run(cls, cfg: dict, world_size: int) -> None:
        """Checks that need more of the run's config than the ``algo`` group (e.g. which optimizer
        an algorithm takes over); default: none. Called after :meth:`validate_config`.

        Raises:
            lsgd.core.errors.ConfigError: naming the key and the allowed values.
        """

    @classmethod
    def label_facts(cls, cfg: Mapping) -> dict:
        """How the report's labels and the loggers' run names write a run of this method
        (``labels.json``, :mod:`lsgd.core.labels`), from the registries: ``values`` (the method's
        registered label; for each key of :attr:`Config` whose ``symbol`` is ``""``, a pair of
        words or a mapping of values to words, or that names a compressor, the run's value as
        written: ``"top-k"``, ``"ring"``, ``"non-blocking"``, ``"lock-step"``), ``symbols`` (the
        keys with a name of their own: ``{"algo.local_steps": "H"}``) and ``defining_keys`` (:attr:`defining_keys`, each key that names a compressor
        followed by that compressor's ``strength_key`` where this method's Config declares it:
        ``algo.cf`` of compressed top-k, none of GraVAC, whose CF adapts).

        Args:
            cfg: the run's config, nested (as config.yaml) or flattened; keys it leaves out are
                left out of ``values`` (nothing is validated here).
        """
        flat = flatten(cfg)
        declared = fields(cls.Config)
        values = {"algo.name": ALGORITHMS.entry(cls.name).label if cls.name in ALGORITHMS else cls.name}
        symbols: dict[str, str] = {}
        for name, field in declared.items():
            key, symbol, value = f"algo.{name}", field.metadata.get("symbol"), flat.get(f"algo.{name}")
            named = NAMED_BY_KEY.get(key)
            if isinstance(symbol, str) and symbol:
                symbols[key] = symbol
            elif is_missing(value):
                continue
            elif named is not None:
                known = isinstance(value, str) and value in named
                values[key] = named.entry(value).label if known else format_value(value)
            elif symbol == "":
                values[key] = format_value(value)
            elif isinstance(symbol, tuple) and isinstance(value, bool):
                values[key] = symbol[0] if value else symbol[1]
            elif isinstance(symbol, Mapping):
                values[key] = str(symbol.get(value, format_value(value)))
        defining: list[str] = []
        for key in cls.defining_keys:
            defining.append(key)
            named, member = NAMED_BY_KEY.get(key), flat.get(key)
            if named is not None and isinstance(member, str) and member in named:
                strength = named.entry(member).extra.get("strength_key")
                if strength and strength.removeprefix("algo.") in declared:
                    defining.append(strength)
        return {"values": values, "symbols": symbols, "defining_keys": defining}

    @classmethod
    def describe(cls, algo: dict, world_size: int) -> dict:
        """Facts about the run's setting that the launcher records in ``config.yaml`` beside the
        config (e.g. a decentralized method's topology and spectral gap); default: none."""
        return {}

    def __init__(self, cfg: dict, comm: Communicator):
        self.config = self.parse_config(cfg)
        self.comm = comm
        self.model: nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.ctx = RunContext()
        # local steps per epoch and local batch size (from the RunContext at setup)
        self.steps_per_epoch: int | None = None
        self.batch_size: int | None = None
        # per-step rows (docs/results.md, "per-step compression rows"), drained by the trainer
        self.step_rows: list[dict] = []
        # (1/n) sum_i ||x_i - x_bar||^2 at the last evaluation when replicas differed, else None
        self.consensus_distance: float | None = None

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer, ctx: RunContext | None = None) -> nn.Module:
        """Attach to the model and optimizer; returns the module the trainer calls for training
        forward passes (DDP returns its wrapper). ``ctx``: the run context (None in hand-driven
        tests: then ``steps_per_epoch`` / ``batch_size`` may have been set directly)."""
        self.model, self.optimizer = model, optimizer
        if ctx is not None:
            self.ctx = ctx
            self.steps_per_epoch = ctx.steps_per_epoch
            self.batch_size = ctx.batch_size
        return model

    def overrides(self, hook: str) -> bool:
        """Whether ``hook`` (a method name, e.g. ``before_step``) is this algorithm's own rather
        than :class:`Algorithm`'s default (a no-op, or the plain optimizer step): the trainer skips
        the call of a default that does nothing (one Python call fewer per step and hook)."""
        return hook in vars(self) or getattr(type(self), hook) is not getattr(Algorithm, hook)

    def optimizer_step(self) -> None:
        """The worker's local optimizer step (a parameter-server worker has none)."""
        self.optimizer.step()

    def serve_step(self, step: int) -> None:
        """One step of a server rank (role ``server``); ``step`` = steps completed so far."""
        raise NotImplementedError(f"{type(self).__name__} has no server role")

    def progress(self, step: int) -> int:
        """The counter that decides logging, evaluation, checkpoints and stopping (the same on
        every rank at the same point); default: the local step count."""
        return step

    def schedule_position(self, step: int) -> int | None:
        """The learning-rate schedule's position after ``step`` completed local steps; None (the
        default): the local step count (the trainer steps the scheduler once per local step)."""
        return None

    def data_position(self, step: int) -> tuple[int, int] | None:
        """Where local step ``step`` (0-based) reads its batch: ``(shard, batch)``, batch ``batch``
        (0-based, counted over epochs) of shard ``shard`` of the W worker shards; None (the
        default): the worker's own shard, batch ``step``. The trainer reads the answer's batches
        one stream per shard (:class:`lsgd.data.ShardedLoader` of that shard), so a method may
        move workers between shards (asynchronous Local-SGD's least-visited shard)."""
        return None

    def before_step(self, step: int) -> None:
        """Called before local step ``step`` (0-based; = completed steps), after the bookkeeping
        of the previous step; not called after the last step."""

    def after_backward(self, step: int) -> None:
        """Called after ``loss.backward()`` of local step ``step`` (0-based)."""

    def after_step(self, step: int) -> None:
        """Called after the optimizer step; ``step`` = completed local steps (1-based)."""

    def finish(self) -> None:
        """Called on every rank once its training loop has ended (completed or diverged), before
        the final accounting; default: nothing (a server releases its waiting workers here)."""

    def broadcast_buffers(self) -> None:
        """Broadcast the floating-point buffers (BatchNorm statistics) from rank 0 (counted), as
        DDP's ``broadcast_buffers`` does, so synchronous methods keep identical replicas."""
        cached = getattr(self, "_float_buffers", None)
        if cached is None or cached[0] is not self.model:  # found once per model: BatchNorm updates
            cached = self._float_buffers = (self.model, float_buffers(self.model))  # them in place
        buffers = cached[1]
        if buffers:
            self.comm.broadcast_(buffers, src=0)

    def metrics(self) -> dict:
        """Extra keys merged into every metrics record (e.g. ``cf``); called on every rank at each
        record, so it may reset per-record accumulators."""
        return {}

    def pop_step_rows(self) -> list[dict]:
        """Per-step rows accumulated since the previous record (written before it by rank 0)."""
        rows, self.step_rows = self.step_rows, []
        return rows

    @property
    def models_in_sync(self) -> bool:
        """True when every worker holds the same parameters and buffers right now."""
        return False

    def _average_and_distance(self, tensors: list[torch.Tensor], n_params: int) -> tuple[list[torch.Tensor], float]:
        """Replace ``tensors`` by their average over workers (an uncounted all-reduce: measurement,
        not training); returns the saved originals and ``(1/n) sum_i ||x_i - x_bar||^2`` over the
        first ``n_params`` tensors (float64; another uncounted all-reduce)."""
        saved = [t.clone() for t in tensors]
        self.comm.average_(tensors, count=False)
        local = torch.zeros(1, dtype=torch.float64, device=tensors[0].device)
        for x_bar, x_i in zip(tensors[:n_params], saved[:n_params]):
            local += (x_i.double() - x_bar.double()).pow(2).sum()
        self.comm.all_reduce(local, count=False)
        return saved, local.item() / self.comm.world_size

    def measure_consensus(self) -> float | None:
        """``(1/n) sum_i ||x_i - x_bar||^2`` over the workers' parameters now (uncounted
        collectives; every rank calls it at the same point), or None when the replicas are in sync.
        The model is left as it was."""
        if self.comm.world_size == 1 or self.models_in_sync:
            return None
        params = [p.data for p in self.model.parameters()]
        saved, distance = self._average_and_distance(params, len(params))
        with torch.no_grad():
            for t, s in zip(params, saved):
                t.copy_(s)
        return distance

    @contextlib.contextmanager
    def eval_context(self) -> Iterator[None]:
        """Within the block every worker holds the averaged model (for evaluation only).

        When the replicas differ (between local SGD rounds), parameters and buffers are
        temporarily replaced by their average over workers (an uncounted all-reduce: it is
        measurement, not training) and restored afterwards; :attr:`consensus_distance` is then set
        to ``(1/n) sum_i ||x_i - x_bar||^2`` over the parameters (float64; another uncounted
        all-reduce), else to None.
        """
        self.consensus_distance = None
        if self.comm.world_size == 1 or self.models_in_sync:
            yield
            return
        tensors = model_tensors(self.model, buffers=True)
        saved, self.consensus_distance = self._average_and_distance(tensors, len(list(self.model.parameters())))
        try:
            yield
        finally:
            restore_(tensors, saved)

    def state_dict(self) -> dict:
        """Everything needed to resume exactly (counters, slow momentum, copies of models)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`."""


class ServerAlgorithm(Algorithm):
    """Base of parameter-server methods: rank 0 is the server, ranks 1..W the workers.

    Subclasses call ``super().validate_config(algo, world_size)`` first.

    Raises:
        lsgd.core.errors.ConfigError: (``validate_config``) a key :attr:`Algorithm.Config` does not
            allow (:meth:`Algorithm.validate_config`); fewer than 2 processes.
    """

    @classmethod
    def roles(cls, world_size: int) -> list[str]:
        return ["server"] + ["worker"] * (world_size - 1)

    @classmethod
    def validate_config(cls, algo: dict, world_size: int) -> None:
        super().validate_config(algo, world_size)
        if world_size < 2:
            raise ConfigError(f"algo={cls.name} needs at least 2 processes (rank 0 serves, the rest are workers); "
                              f"got {world_size}: set launcher.nproc_per_node >= 2")

