"""The compute model of the cluster clock: how long one local step takes on the target cluster.

Every worker carries a virtual clock (``modeled_time_s``, see ``lsgd.clock.worker_clock``). Its communication
advances by the alpha-beta cost of each collective; its compute advances, once per local step, by
the :class:`~lsgd.compute.model.StepTime` that :class:`~lsgd.compute.model.ComputeModel` returns.
This package models compute only, from the ``cluster:`` config block (its keys:
:mod:`lsgd.compute.config`).

Units: time in seconds (s), work in floating-point operations (FLOPs), rates in FLOP/s, memory
traffic in bytes and bytes/s.

The modules, from the config block to a step's seconds:

===============  ==============================================================================
module           what it holds
===============  ==============================================================================
``config``       the ``cluster:`` block's keys, what each means, their defaults
``workers``      each worker's relative speed (``cluster.speeds``, the heterogeneity presets)
                 and its node (``cluster.gpus_per_node``)
``validation``   the checks of the ``cluster:`` block (``validate_cluster``)
``stretch``      the wall-clock stretch (``cluster.stretch``): each worker's modeled speed made
                 real in wall time by sleeping the rest of its step
``presets``      the device presets (``cluster.device``): published peak FLOP/s, memory bandwidth
                 and launch cost of each GPU; ``device_spec``, a device's figures by name
``calibration``  the ``cpu`` preset: ``lsgd calibrate`` measures this machine's figures into the
                 calibration file; how the ``cpu`` profile holds against measured steps
``opcount``      counting one training step's operators (FLOPs, bytes, kernels) with a
                 ``TorchDispatchMode`` (``OpCounter``, ``count_step``)
``roofline``     a device's figures (``DeviceSpec``) and an operator's price on it:
                 max(FLOPs / (peak x mfu), bytes / bandwidth) + kernels x launch cost
``model``        ``ComputeModel``: a worker's seconds per local step, in profile mode (counted
                 and priced, or ``cluster.step_time_s``) or measured mode
===============  ==============================================================================
"""
