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
from pathlib import Path

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


def process_tree(root: int) -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of ``root`` and every process below it (Linux /proc)."""
    procs = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if fields[0] != "Z":
            procs[int(d.name)] = (int(fields[1]), cmd)
    tree, grew = {root: procs[root]} if root in procs else {}, True
    while grew:
        below = {pid: p for pid, p in procs.items() if p[0] in tree and pid not in tree}
        tree.update(below)
        grew = bool(below)
    return tree


def gone(pids) -> bool:
    """Every pid exited (a zombie counts as gone: its parent has not reaped it yet), within 10 s."""
    def alive(pid):
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    deadline = time.monotonic() + 10
    while any(map(alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not any(map(alive, pids))


def wait_for(predicate, what: str, proc, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    raise AssertionError(f"{what} not seen within {timeout} s: {proc.communicate()[1][-3000:]}")


def workers_of(proc) -> list[int]:
    """The launcher's spawned workers (multiprocessing's resource tracker is the other child)."""
    return [pid for pid, (ppid, cmd) in process_tree(proc.pid).items() if ppid == proc.pid and "spawn_main" in cmd]


def test_a_second_ctrl_c_kills_the_busy_workers_at_once(tmp_path):
    """Ctrl-C twice: the first asks the workers to checkpoint at their next step, the second kills
    them (SIGKILL) before they got there. The workers are frozen (SIGSTOP) before the first Ctrl-C,
    standing for workers inside a long step: so the graceful stop cannot finish between the two
    signals whatever the machine's load, and the second Ctrl-C goes out once the launcher wrote in
    train.log that it got the first (two signals before its handler ran would count once).
    Then: exit 130, status ``interrupted`` with the last checkpoint's step, one console line after
    the last step line naming that checkpoint, well before torch elastic's 30 s shutdown timeout,
    and every process of the launcher's tree (listed before the signals) gone."""
    proc = start([*ENDLESS, "checkpoint_every=2", f"results_dir={tmp_path}/r"], tmp_path)
    metrics = wait_for(lambda: next((tmp_path / "r").rglob("metrics.jsonl"), None), "metrics.jsonl", proc)
    wait_for(lambda: len(metrics.read_text().splitlines()) >= 3, "3 records", proc)
    run = metrics.parent
    tree = process_tree(proc.pid)
    workers = workers_of(proc)
    assert len(workers) == 2 and len(tree) >= 3, tree  # launcher, 2 workers, resource tracker
    for pid in workers:
        os.kill(pid, signal.SIGSTOP)
    os.killpg(proc.pid, signal.SIGINT)
    log = run / "train.log"
    wait_for(lambda: "[main]" in log.read_text(), "the launcher's note of the first Ctrl-C", proc, timeout=30)
    t0 = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    took = time.monotonic() - t0
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err and "SignalException" not in err, err[-3000:]
    assert took < 15, took  # not torch elastic's 30 s wait for workers that return
    s = summary(run)
    saved = json.loads((run / "checkpoints" / "last.json").read_text())["step"]
    assert s["status"] == "interrupted" and s["signal"] == "SIGINT" and s["error"] is None and "failed_rank" not in s
    assert s["steps"] == saved >= 2
    lines = err.splitlines()
    last_step = max(i for i, line in enumerate(lines) if re.search(r"INFO step \d+/", line))
    assert lines[last_step + 1:] == [f"lsgd: interrupted (SIGINT) at step {saved}, checkpoint saved; "
                                     f"resume: lsgd train resume={run}"], lines[last_step + 1:]
    notes = [line for line in log.read_text().splitlines() if line.startswith("[main]")]
    assert len(notes) == 2 and "got SIGINT: the workers stop" in notes[0], notes
    assert "killing the workers at once" in notes[1], notes
    assert set(map(int, re.findall(r"\d+", notes[1].split("(SIGKILL to pid", 1)[1]))) == set(workers), notes
    assert gone(tree), {pid: tree[pid] for pid in tree if Path(f"/proc/{pid}").exists()}


@pytest.mark.parametrize("moment", ["run folder", "workers started"])
def test_a_ctrl_c_while_the_run_starts_prints_no_traceback(tmp_path, moment):
    """Ctrl-C (to the process group, as a terminal sends it) while the run starts: as soon as the
    launcher printed its run folder line (it is preparing the data or loading torch elastic), or as
    soon as its worker processes exist (they are importing torch, before their handlers: each
    printed a KeyboardInterrupt traceback). No traceback, exit 130, status ``interrupted`` (at a
    checkpointed step when the workers got to train, else with no step), one console line, no
    process left."""
    proc = start([*ENDLESS, f"results_dir={tmp_path}/r"], tmp_path)
    err = []
    if moment == "run folder":
        for line in proc.stderr:
            err.append(line)
            if " run folder " in line:
                break
    else:
        wait_for(lambda: len(workers_of(proc)) == 2, "two workers", proc)
    tree = process_tree(proc.pid)
    os.killpg(proc.pid, signal.SIGINT)
    out, rest = proc.communicate(timeout=120)
    err = "".join(err) + rest
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err + out and "KeyboardInterrupt" not in err + out, err[-3000:]
    (run,) = run_dirs(tmp_path / "r")
    s = summary(run)
    assert s["status"] == "interrupted" and s["signal"] == "SIGINT", s
    last = run / "checkpoints" / "last.json"
    if s["steps"]:  # the workers trained: they stopped at one step, with a checkpoint there
        assert json.loads(last.read_text())["step"] == s["steps"]
        stop = f"lsgd: interrupted (SIGINT) at step {s['steps']}, checkpoint saved; resume: lsgd train resume={run}"
    else:
        assert s["steps"] is None and not last.exists()
        stop = f"lsgd: interrupted (SIGINT); no checkpoint to resume from: {run}"
    assert err.splitlines()[-1] == stop and err.count("lsgd: interrupted") == 1, err[-3000:]
    assert gone(tree), {pid: tree[pid] for pid in tree if Path(f"/proc/{pid}").exists()}
