"""The ``cluster:`` config block of the compute model: its keys, what each means and their defaults.

=================  ==========================================================================
key                meaning
=================  ==========================================================================
``compute``        ``profile`` (deterministic, independent of this machine) or ``measured``
                   (:mod:`lsgd.compute.model`)
``device``         target device, one of :data:`lsgd.compute.presets.DEVICES`: a GPU preset or
                   ``cpu`` (this machine, :mod:`lsgd.compute.calibration`)
``mfu``            fraction of the peak FLOP/s a compute-bound kernel reaches, in (0, 1]; null:
                   the device's :data:`lsgd.compute.presets.DEFAULT_EFFICIENCY` (0.4 on a GPU,
                   1.0 on ``cpu``)
``step_time_s``    compute seconds per local step at speed 1.0 (profile mode; overrides the count)
``speeds``         one relative speed per worker, or a preset of
                   :data:`lsgd.compute.workers.HETEROGENEITY`
``gpus_per_node``  workers per node (intra-node link inside a node, inter-node link between)
``stretch``        make each worker's modeled speed real in wall time (profile mode;
                   :mod:`lsgd.compute.stretch`)
``time_scale``     wall seconds per modeled compute second of the stretch (> 0)
=================  ==========================================================================

The checks of the block: :mod:`lsgd.compute.validation`.
"""

from __future__ import annotations

import math
from typing import Any

#: the values of ``cluster.compute``
COMPUTE_MODES = ("profile", "measured")

# the ``cluster:`` block of conf/config.yaml; a missing key takes this value
CLUSTER_DEFAULTS: dict[str, Any] = {
    "compute": "profile",
    "device": "a100",
    "mfu": None,
    "step_time_s": None,
    "speeds": None,
    "gpus_per_node": 1,
    "stretch": False,
    "time_scale": 1.0,
}


def is_number(value: Any) -> bool:
    """Whether ``value`` is a finite int or float, not a bool: what a numeric ``cluster`` key must be."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
