"""The compute model: a local step's modeled seconds on a target device (device presets, FLOP counting,
roofline, CPU calibration, worker speeds)."""
