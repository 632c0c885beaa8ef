"""The training loop of one worker and its services: recording, evaluation, checkpoints, loggers,
optimizers and schedules, the speed switches, preemption and failure records, provenance."""
