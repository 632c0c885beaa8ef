"""Resuming a run folder: which folder a run writes and the config a resumed run runs with.

``resume=<run folder>`` (or ``resume=true``: the newest unfinished run of the experiment with a
checkpoint) continues that run from its last checkpoint (:func:`find_resume_dir`); a requeued
SLURM job resumes its own folder (:func:`run_folder`). The resumed run keeps its saved
``config.yaml``: the command line may change only :data:`RESUME_SAFE_KEYS`
(:func:`resumed_config`); the trainer then restores every rank's shard
(:class:`lsgd.training.checkpointer.Checkpointer`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import yaml

from lsgd.core.errors import ConfigError
from lsgd.launch.status import only_hydra_files

log = logging.getLogger("lsgd")


#: Keys a resumed run may change from its saved config.yaml (they do not change what is trained
#: before the end: how long it runs, where its logs go, how long a collective may wait, how the
#: input pipeline builds the same batches: lsgd.data.pipeline).
RESUME_SAFE_KEYS = ("resume", "epochs", "max_steps", "target_acc", "results_dir", "logger", "launcher.timeout_s",
                    "launcher.preemption", "launcher.interrupts", "dataset.num_workers", "dataset.pin_memory",
                    "dataset.persistent_workers", "dataset.prefetch_factor")


#: Keys a resumed run takes from this command line, never from the saved config (a testing aid).
RESUME_FROM_COMMAND_LINE = ("inject_failure",)


def defaults_config() -> dict:
    """The config of ``lsgd train`` with no overrides (inside a running Hydra app)."""
    from hydra import compose
    from omegaconf import OmegaConf

    return OmegaConf.to_container(compose(config_name="config"), resolve=True)


def _leaves(d, prefix: str = "") -> dict:
    if not isinstance(d, dict):
        return {prefix: d}
    out = {}
    for k, v in d.items():
        out.update(_leaves(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def _overlay(base: dict, saved: dict) -> dict:
    """``saved`` over ``base``: a group's section (a mapping with ``name``: algo, model, ...) is
    taken whole from ``saved``; other mappings merge key by key, so keys the saved run predates keep
    ``base``'s values."""
    out = dict(base)
    for k, v in saved.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict) and "name" not in v:
            out[k] = _overlay(out[k], v)
        else:
            out[k] = v
    return out


def resumed_config(cfg: dict, run_dir: Path, defaults: dict) -> dict:
    """The config a resume of ``run_dir`` runs with: the run's saved ``config.yaml``, where this
    command line (``cfg``, composed from its overrides) changed a key from ``defaults`` (the plain
    ``lsgd train`` config) to a value other than the saved one, only for :data:`RESUME_SAFE_KEYS`.
    The saved ``world_size`` comes back as ``_saved_world_size``.

    Raises:
        ConfigError: the run folder has no config.yaml, or the command line changes another key
            (named, with its saved and new values, and the keys allowed).
    """
    path = Path(run_dir) / "config.yaml"
    if not path.exists():
        raise ConfigError(f"resume={run_dir}: no config.yaml in the run folder")
    saved = yaml.safe_load(path.read_text())
    new, base, old = _leaves(cfg), _leaves(defaults), _leaves(saved)
    out = _overlay(cfg, {k: v for k, v in saved.items()
                         if (k in cfg or k in defaults) and k not in RESUME_FROM_COMMAND_LINE})
    for key, value in sorted(new.items()):
        if value == base.get(key, object()) or value == old.get(key, object()):
            continue  # not set by this command line, or set to the run's own value
        if not any(key == s or key.startswith(s + ".") for s in RESUME_SAFE_KEYS):
            raise ConfigError(f"resume: {key} cannot change when resuming {run_dir} (saved {old.get(key)!r}, "
                              f"given {value!r}); keys that may: {', '.join(RESUME_SAFE_KEYS)}")
        node = out
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    out["resume"] = str(run_dir)
    out["_saved_world_size"] = saved.get("world_size")
    return out


def find_resume_dir(cfg: dict, fresh_dir: Path) -> Path:
    """The run folder ``resume`` points to.

    ``resume`` is a path to a run folder, or ``true``: the newest folder of this experiment
    (``<results_dir>/<experiment_name>/*``) with a checkpoint and without a completed summary.

    Raises:
        ConfigError: the path has no checkpoint, or no resumable run exists.
    """
    resume = cfg["resume"]
    if resume is True:
        root = Path(cfg["results_dir"]) / cfg["experiment_name"]
        candidates = []
        for d in root.iterdir() if root.is_dir() else []:
            # (a requeued SLURM job's own folder, this job's Hydra folder, has a checkpoint and counts)
            if not (d / "checkpoints" / "last.json").exists():
                continue
            summary = d / "summary.json"
            if summary.exists() and json.loads(summary.read_text()).get("status") == "completed":
                continue
            candidates.append(d)
        if not candidates:
            raise ConfigError(f"resume=true but no unfinished run with a checkpoint exists under {root}")
        return max(candidates, key=lambda d: (d / "checkpoints" / "last.json").stat().st_mtime)
    path = Path(str(resume))
    if not (path / "checkpoints" / "last.json").exists():
        raise ConfigError(f"resume={resume!r}: no checkpoint found (expected {path}/checkpoints/last.json)")
    return path


def run_folder(cfg: dict, hydra_dir: Path | None) -> Path:
    """The folder this run writes: Hydra's ``hydra_dir``; the one ``resume`` names
    (:func:`find_resume_dir`; Hydra's fresh folder is then removed when it holds nothing but its
    own files); or, for a requeued SLURM job (``SLURM_RESTART_COUNT`` >= 1, the same job id and so
    the same folder), its own folder, which already holds a checkpoint: the job resumes it
    (``cfg["resume"]`` is set to it).

    Raises:
        ConfigError: ``resume`` finds no checkpoint, or the folder of a run that is not a requeued
            job already holds a checkpoint (starting afresh there would train beside the old
            checkpoints).
    """
    run_dir = hydra_dir
    if cfg.get("resume"):
        run_dir = find_resume_dir(cfg, hydra_dir)
        if hydra_dir is not None and hydra_dir != run_dir and only_hydra_files(hydra_dir):
            shutil.rmtree(hydra_dir)
        log.info("resuming run %s", run_dir)
    elif run_dir is not None and (run_dir / "checkpoints" / "last.json").exists():
        restarts = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
        if not restarts:
            raise ConfigError(f"the run folder {run_dir} already holds a checkpoint: pass resume={run_dir} to "
                              "continue that run, or choose another folder (hydra.run.dir)")
        cfg["resume"] = str(run_dir)
        log.info("requeued SLURM job (restart %d): resuming its run folder %s", restarts, run_dir)
    return run_dir
