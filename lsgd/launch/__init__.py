"""Launching a run: validate, make the run folder, spawn the workers (or join torchrun / srun), watch
signals and failures, and the emulated cluster (capped links in network namespaces)."""
