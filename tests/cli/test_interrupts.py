"""Ctrl-C and SIGTERM on a local run (issue 24): the workers stop at one step with a checkpoint,
summary.json says ``interrupted`` (or ``preempted`` under ``launcher.preemption=checkpoint``, never
overwritten), the exit code is 128 + the signal, the console gets one line with the resume command,
and no process is left behind."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

import pytest
from runner import LSGD, TINY, lsgd, run_dirs, session_processes, summary

# trains until stopped: the signal always lands mid-run
ENDLESS = [*TINY, "epochs=1000", "max_steps=100000", "log_every=1", "eval_every=100000",
           "checkpoint_every=0"]


def start(args, cwd):
    return subprocess.Popen(LSGD + ["train", *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, env=dict(os.environ, WANDB_MODE="disabled"))


def stop_mid_run(proc, results, sig, group: bool) -> tuple[str, float]:
    """Wait for 3 records, send ``sig`` (to the process group, as a terminal's Ctrl-C does, or to
    the main process alone, as ``kill`` does); returns (stderr, seconds from the signal to exit)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        files = list(results.rglob("metrics.jsonl"))
        if files and len(files[0].read_text().splitlines()) >= 3:
            break
        time.sleep(0.02)
    else:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError(f"no records within 120 s: {proc.communicate()[1][-3000:]}")
    t0 = time.monotonic()
    os.killpg(proc.pid, sig) if group else proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    return err, time.monotonic() - t0


def no_process_left(sid: int) -> bool:
    deadline = time.monotonic() + 10
    while session_processes(sid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not session_processes(sid)


def test_ctrl_c_checkpoints_the_current_step_and_prints_one_resume_line(tmp_path):
    """SIGINT to the whole process group (a terminal's Ctrl-C): exit 130, status ``interrupted``
    at the step the ranks agreed on, a checkpoint there (checkpoint_every=0: none otherwise), one
    console line after the last step line (no traceback), and that line's command resumes the run."""
    proc = start([*ENDLESS, f"results_dir={tmp_path}/r"], tmp_path)
    err, _ = stop_mid_run(proc, tmp_path / "r", signal.SIGINT, group=True)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "SignalException" not in err, err[-3000:]
    (run,) = run_dirs(tmp_path / "r")
    s = summary(run)
    assert s["status"] == "interrupted" and s["signal"] == "SIGINT" and s["steps"] > 0
    assert json.loads((run / "checkpoints" / "last.json").read_text())["step"] == s["steps"]
    assert json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["step"] == s["steps"]
    lines = err.splitlines()
    last_step = max(i for i, line in enumerate(lines) if re.search(r"INFO step \d+/", line))
    assert lines[last_step + 1:] == [f"lsgd: interrupted (SIGINT) at step {s['steps']}, checkpoint saved; "
                                     f"resume: lsgd train resume={run}"], lines[last_step + 1:]
    assert no_process_left(proc.pid)
    # the printed command (a few more steps) continues from the checkpoint
    command = lines[-1].split("resume: ", 1)[1].split()
    assert command[:2] == ["lsgd", "train"]
    res = lsgd(["train", *command[2:], f"max_steps={s['steps'] + 2}"], tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert summary(run)["status"] == "completed" and summary(run)["steps"] == s["steps"] + 2
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, s["steps"] + 3))


@pytest.mark.parametrize("preemption, status", [("off", "interrupted"), ("checkpoint", "preempted")])
def test_sigterm_to_the_main_process_alone_stops_every_worker_at_once(tmp_path, preemption, status):
    """SIGTERM to the main process only (``kill <pid>``): it passes the signal on, the workers
    checkpoint at one step and return; exit 143. Under ``launcher.preemption=checkpoint`` the
    status stays ``preempted`` (main overwrote it with ``failed``) and nothing waits for torch
    elastic's 30 s shutdown timeout (main: the workers hung 30 s, then were killed)."""
    proc = start([*ENDLESS, f"launcher.preemption={preemption}", f"results_dir={tmp_path}/r"], tmp_path)
    err, took = stop_mid_run(proc, tmp_path / "r", signal.SIGTERM, group=False)
    assert proc.returncode == 143, err[-3000:]
    assert "Traceback" not in err and "forcefully exiting" not in err, err[-3000:]
    assert took < 25, took  # teardown of a finished run takes 2-7 s on a loaded 2-core machine
    (run,) = run_dirs(tmp_path / "r")
    s = summary(run)
    assert s["status"] == status and s["signal"] == "SIGTERM" and s["error"] is None and "failed_rank" not in s
    assert json.loads((run / "checkpoints" / "last.json").read_text())["step"] == s["steps"]
    assert err.splitlines()[-1] == (f"lsgd: {status} (SIGTERM) at step {s['steps']}, checkpoint saved; "
                                    f"resume: lsgd train resume={run}")
    assert no_process_left(proc.pid)
