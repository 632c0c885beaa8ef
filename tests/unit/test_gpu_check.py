"""The GPU check (lsgd.launch.gpu_check; scripts/gpu_check.py runs it) runs end to end in its CPU
dry-run mode and its table has every row; its peak table picks the right part by device name."""

from __future__ import annotations

import sys

from lsgd.launch import gpu_check


def test_dry_run_executes_every_step_and_prints_every_row():
    # step 1's pytest subprocess is replaced by a stub (the suite is already running pytest); the
    # real command is `pytest -m cuda tests`, run on a GPU
    stub = [sys.executable, "-c", "print('3 passed in 0.1s')"]
    setup, rows = gpu_check.run_checks(dry_run=True, tests_cmd=stub)
    names = [r.check for r in rows]
    expected = ["1. CUDA tests", "2. trains: ddp bf16", "2. trains: local_sgd fp16", "2. trains: diloco bf16",
                "2. trains: compressed top-k bf16", "3. lsgd ddp / plain torch loop", "4. GPT-tiny bf16 eager",
                "4. GPT-tiny bf16 compile", "4. ResNet-18 fp32 channels_last"]
    assert len(rows) == len(expected)
    for name, prefix in zip(names, expected):
        assert name.startswith(prefix), (name, prefix)
    assert not any(r.failed for r in rows), gpu_check.table(setup, rows)
    assert rows[0].value == "3 passed in 0.1s"
    assert all("loss" in r.value and "->" in r.value for r in rows[1:5])  # each run trained
    assert all(("tokens/s" in r.value or "images/s" in r.value) and "MFU n/a" in r.value for r in rows[6:])
    text = gpu_check.table(setup, rows)
    assert all(n in text for n in names) and "cpu (dry run)" in text.splitlines()[0]


def test_peaks_by_device_name():
    peak = gpu_check.peak_flops
    assert peak("NVIDIA H100 80GB HBM3") == 989.4e12  # SXM5
    assert peak("NVIDIA H100 PCIe") == 756.5e12
    assert peak("NVIDIA H200") == 989.4e12
    assert peak("NVIDIA A100-SXM4-80GB") == 312e12
    assert peak("NVIDIA A10") == 125e12 and peak("NVIDIA A10G") is None
    assert peak("NVIDIA L40S") == 362.05e12 and peak("NVIDIA L4") == 121e12
    assert peak("Some Future GPU") is None
