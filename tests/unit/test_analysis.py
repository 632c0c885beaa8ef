"""lsgd.analysis on fake-but-valid run folders (docs/results.md) with closed-form metrics.

Every fake run logs every LOG_EVERY steps and evaluates every EVAL_EVERY steps up to STEPS, with
    test_acc(step)       = rate * step            (test_ppl = 100 - rate * step for language models)
    wall_time_s(step)    = wall * step
    modeled_time_s(step) = modeled * step
    comm_bytes(step)     = (step // H) * PARAM_BYTES   (H = 1 for ddp)
so times to a threshold and speedups can be worked out by hand below. Each run folder has the
labels.json a launch writes (its label facts, from the registry: Algorithm.label_facts) unless
written with labels=False, as a run made before lsgd wrote them. Runs written with
alpha_beta=True also log the alpha-beta terms of a ring all-reduce of PARAM_BYTES per round
(model_alpha_terms = 2 (p-1) rounds, model_beta_bytes = 2 (p-1)/p PARAM_BYTES rounds), and runs
written with compression=f log f(step) as a per-step compression row before each step's record.
"""

from __future__ import annotations

import json
import math
import re

import pandas as pd
import pytest
import yaml

from lsgd.analysis import (
    aggregate_curves,
    aggregate_seeds,
    arm_keys,
    arm_labels,
    batch_scaling_table,
    differing_keys,
    experiment_tables,
    find_run_dirs,
    load_compression,
    load_runs,
    load_summaries,
    paired_differences,
    plot_runs,
    run_labels,
    t_halfwidth,
    time_to_threshold,
    write_report,
)
from lsgd.algorithms import ALGORITHMS
from lsgd.analysis.formats import markdown_table
from lsgd.analysis.load import LABELS_COLUMN, read_metrics
from lsgd.cli import main as lsgd_cli
from lsgd.core.run_files import LABELS_FILE

STEPS, LOG_EVERY, EVAL_EVERY = 100, 5, 10
PARAM_BYTES = 4_000_000
WORLD = 4
EXP = "fmnist_demo"

# The three runs of the main set: (run_id, algo, rate, wall s/step, modeled s/step)
DDP = ("run_ddp", {"name": "ddp"}, 0.009, 1.0, 2.0)  # final acc 0.90
H8 = ("run_h8", {"name": "local_sgd", "local_steps": 8, "buffer_policy": "reset"}, 0.008, 0.5, 0.5)  # final 0.80
H16 = ("run_h16", {"name": "local_sgd", "local_steps": 16, "buffer_policy": "reset"}, 0.0085, 0.25, 0.4)  # final 0.85


def write_run(
    root,
    run_id,
    algo,
    rate,
    wall,
    modeled,
    *,
    experiment=EXP,
    steps=STEPS,
    status="completed",
    with_summary=True,
    with_evals=True,
    lm=False,
    target_acc=0.7,
    batch_size=32,
    world=WORLD,
    bytes_per_round=PARAM_BYTES,
    alpha_beta=False,
    compression=None,
    optim=None,
    network=None,
    cluster=None,
    seed=0,
    labels=True,
):
    """Write <root>/<experiment>/<run_id>/{config.yaml, labels.json, metrics.jsonl, summary.json}; return
    the folder (``labels=False``: no labels.json, as a run made before lsgd wrote it)."""
    run_dir = root / experiment / run_id
    run_dir.mkdir(parents=True)
    H = algo.get("local_steps", 1)
    config = {
        "experiment_name": experiment,
        "run_id": run_id,
        "world_size": world,
        "seed": seed,
        "epochs": 1,
        "max_steps": steps,
        "batch_size": batch_size,
        "eval_every": EVAL_EVERY,
        "eval_unit": "steps",
        "log_every": LOG_EVERY,
        "checkpoint_every": 0,
        "target_acc": None if lm else target_acc,
        "resume": False,
        "results_dir": f"/scratch/job_{run_id}",  # differs between runs, but is bookkeeping
        "device": "cpu",
        "algo": {**algo, "speeds": [1.0] * world, **({"seed": seed} if "seed" in algo else {})},
        "model": {"name": "gpt" if lm else "cnn"},
        "dataset": {"name": "wikitext2" if lm else "fashion_mnist", "partition": "iid", "alpha": None},
        "optim": {"name": "sgd", "lr": 0.05, "momentum": 0.9, **(optim or {})},
        "schedule": {"name": "constant"},
        "launcher": {"name": "local", "nproc_per_node": world},
        "logger": {"name": "jsonl"},
        "network": network or {"name": "ethernet", "bandwidth_gbps": 10.0, "latency_us": 50.0},
        **({"cluster": cluster} if cluster is not None else {}),  # none: a run made before cluster.*
    }
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    if labels:  # as the launcher writes it: the label facts of the registry
        (run_dir / LABELS_FILE).write_text(json.dumps(ALGORITHMS[algo["name"]].label_facts(config)))
    records = []
    for step in range(LOG_EVERY, steps + 1, LOG_EVERY):
        rounds = step // H
        rec = {
            "step": step,
            "epoch": step / STEPS,
            "samples": step * batch_size * world,
            "lr": 0.05,
            "train_loss": 2.0 / (1 + 0.05 * step),
            "comm_bytes": rounds * bytes_per_round,
            "wire_bytes": rounds * bytes_per_round * 2 * (world - 1) // world,
            "comm_rounds": rounds,
            "wall_time_s": wall * step,
            "compute_time_s": 0.8 * wall * step,
            "comm_time_s": 0.2 * wall * step,
            "modeled_time_s": modeled * step,
            "samples_per_s": batch_size * world / wall,
        }
        if alpha_beta:
            rec.update(model_alpha_terms=2 * (world - 1) * rounds, model_beta_bytes=2 * (world - 1) / world * PARAM_BYTES * rounds)
        if with_evals and step % EVAL_EVERY == 0:
            if lm:
                rec.update(test_loss=math.log(100 - rate * step), test_ppl=100 - rate * step)
            else:
                rec.update(test_loss=1.0 - rate * step, test_acc=rate * step)
        records.append(rec)
    lines, by_step = [], {r["step"]: r for r in records}
    for step in range(1, steps + 1):
        if compression is not None:
            lines.append({"kind": "compression", "step": step, **compression(step)})
        if step in by_step:
            lines.append(by_step[step])
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    if with_summary:
        evals = [r for r in records if "test_loss" in r]
        last = records[-1]
        hit = next((r for r in evals if not lm and r["test_acc"] >= target_acc), None)
        summary = {
            "status": status,
            "run_id": run_id,
            "experiment_name": experiment,
            "algo": algo["name"],
            "world_size": world,
            "steps": last["step"],
            "epochs": last["epoch"],
            "samples": last["samples"],
            "final_test_loss": evals[-1]["test_loss"] if evals else None,
            "final_test_acc": evals[-1]["test_acc"] if evals and not lm else None,
            "best_test_acc": max(r["test_acc"] for r in evals) if evals and not lm else None,
            "final_test_ppl": evals[-1]["test_ppl"] if evals and lm else None,
            "best_test_ppl": min(r["test_ppl"] for r in evals) if evals and lm else None,
            **{k: last[k] for k in ("comm_bytes", "wire_bytes", "comm_rounds", "wall_time_s", "compute_time_s", "comm_time_s", "modeled_time_s")},
            **{k: last[k] for k in ("model_alpha_terms", "model_beta_bytes") if k in last},
            "target_acc": None if lm else target_acc,
            "time_to_target_s": hit["wall_time_s"] if hit else None,
            "modeled_time_to_target_s": hit["modeled_time_s"] if hit else None,
            "step_to_target": hit["step"] if hit else None,
            "error": None if status == "completed" else "loss became nan at step 42",
        }
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return run_dir


@pytest.fixture
def results(tmp_path):
    """results/fmnist_demo with the three runs DDP, H8, H16 (all completed)."""
    root = tmp_path / "results"
    for run in (DDP, H8, H16):
        write_run(root, *run)
    return root


def by_run(frame, column):
    return dict(zip(frame["run_id"], frame[column]))


def parse_markdown_tables(text):
    """[[{header: cell}]] for each Markdown table in text (works for tabulate's and our own layout)."""
    tables, current = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            if not all(set(c) <= set("-: ") for c in cells):
                current.append(cells)
        elif current:
            header, *rows = current
            tables.append([dict(zip(header, r)) for r in rows])
            current = []
    return tables


# -- loading --------------------------------------------------------------------------------------
def test_load_runs_one_row_per_record_with_metrics_and_flattened_config(results):
    df = load_runs(results / EXP)
    per_run = STEPS // LOG_EVERY
    assert len(df) == 3 * per_run
    assert df.groupby("run_id").size().to_dict() == {"run_ddp": per_run, "run_h8": per_run, "run_h16": per_run}
    for col in ("step", "train_loss", "test_acc", "comm_bytes", "wall_time_s", "modeled_time_s", "run_id", "run_dir",
                "algo.name", "algo.local_steps", "optim.lr", "world_size", "network.bandwidth_gbps", "experiment_name"):
        assert col in df.columns, col
    assert set(df.attrs["config_keys"]) >= {"algo.name", "optim.lr", "world_size"}
    # eval-only metrics are present on eval records only
    assert df.groupby("run_id")["test_acc"].count().to_dict() == {r: STEPS // EVAL_EVERY for r in ("run_ddp", "run_h8", "run_h16")}
    # config values are broadcast to every record of their run; absent keys are missing
    h8 = df[df["run_id"] == "run_h8"]
    assert (h8["algo.local_steps"] == 8).all() and (h8["algo.name"] == "local_sgd").all()
    assert df.loc[df["run_id"] == "run_ddp", "algo.local_steps"].isna().all()
    # metric values as written: 100 // 8 = 12 rounds at the last record
    assert h8["comm_bytes"].iloc[-1] == 12 * PARAM_BYTES
    assert h8["step"].tolist() == list(range(LOG_EVERY, STEPS + 1, LOG_EVERY))
    # lists become JSON strings
    assert set(df["algo.speeds"]) == {json.dumps([1.0] * WORLD)}
    assert set(df["run_dir"]) == {str((results / EXP / r).resolve()) for r in ("run_ddp", "run_h8", "run_h16")}


def test_load_summaries_one_row_per_run_and_summary_fields_do_not_shadow_config(results):
    s = load_summaries(results)
    assert sorted(s["run_id"]) == ["run_ddp", "run_h16", "run_h8"]
    assert (s["status"] == "completed").all()
    assert by_run(s, "final_test_acc") == pytest.approx({"run_ddp": 0.9, "run_h8": 0.8, "run_h16": 0.85})
    assert by_run(s, "comm_rounds") == {"run_ddp": 100, "run_h8": 12, "run_h16": 6}
    assert by_run(s, "algo.local_steps")["run_h8"] == 8
    # summary fields named like a config key keep the config's name free
    assert (s["world_size"] == WORLD).all() and (s["summary.world_size"] == WORLD).all()
    assert (s["epochs"] == 1).all() and "summary.epochs" in s


def test_run_discovery(results, tmp_path):
    runs = [results / EXP / r for r in ("run_ddp", "run_h8", "run_h16")]
    assert len(find_run_dirs(results)) == 3
    assert find_run_dirs(runs[0]) == [runs[0].resolve()]
    assert len(find_run_dirs([results, runs[0], results / EXP])) == 3  # duplicates counted once
    # a Hydra .hydra/config.yaml inside a run and a conf/ folder with a config.yaml are not runs
    (runs[0] / ".hydra").mkdir()
    (runs[0] / ".hydra" / "config.yaml").write_text("algo: {name: ddp}\n")
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "config.yaml").write_text("defaults: [algo: ddp]\n")
    assert len(find_run_dirs(tmp_path)) == 3


def test_folder_without_runs_raises_with_path(tmp_path):
    empty = tmp_path / "nothing_here"
    (empty / "sub").mkdir(parents=True)
    (empty / "sub" / "notes.txt").write_text("x")
    with pytest.raises(FileNotFoundError, match="nothing_here"):
        load_runs(empty)
    with pytest.raises(FileNotFoundError, match="does_not_exist"):
        load_summaries(tmp_path / "does_not_exist")
    with pytest.raises(ValueError):
        load_runs([])
    with pytest.raises(FileNotFoundError, match="nothing_here"):
        write_report(empty, tmp_path / "out")


def test_unfinished_run_loads_as_running(results):
    # killed at step 50, no summary.json, and a truncated last line
    run = write_run(results, "run_killed", {"name": "local_sgd", "local_steps": 4}, 0.007, 0.5, 0.5, steps=50, with_summary=False)
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 55, "epoch": 0.5')
    with pytest.warns(UserWarning, match="truncated"):
        s = load_summaries(run)
    assert len(s) == 1
    row = s.iloc[0]
    assert row["status"] == "running"
    assert row["steps"] == 50 and row["comm_rounds"] == 50 // 4
    assert row["final_test_acc"] == pytest.approx(0.007 * 50)
    assert pd.isna(row["time_to_target_s"])
    with pytest.warns(UserWarning):
        assert len(load_runs(run)) == 50 // LOG_EVERY


def test_resumed_metrics_keep_the_resumed_records(tmp_path):
    run = write_run(tmp_path, "r", {"name": "ddp"}, 0.009, 1.0, 1.0, steps=20)
    # resumed from a checkpoint at step 10 after having logged up to 20: steps 15 and 20 logged again
    lines = (run / "metrics.jsonl").read_text().splitlines()
    again = [json.dumps({**json.loads(l), "train_loss": -1.0}) for l in lines if json.loads(l)["step"] > 10]
    (run / "metrics.jsonl").write_text("\n".join(lines + again) + "\n")
    recs = read_metrics(run)
    assert [r["step"] for r in recs] == [5, 10, 15, 20]
    assert [r["train_loss"] for r in recs][2:] == [-1.0, -1.0]


def test_differing_keys_and_labels(results):
    s = load_summaries(results)
    # results_dir differs too, but is ignored by default; seed, lr... are equal
    assert differing_keys(s) == ["algo.name", "algo.local_steps"]
    assert "results_dir" in differing_keys(s, ignore=())
    labels = {s.set_index("run_dir").loc[d, "run_id"]: lab for d, lab in run_labels(s).items()}
    assert labels == {
        "run_ddp": "algo.name=ddp",
        "run_h8": "algo.name=local_sgd, algo.local_steps=8",
        "run_h16": "algo.name=local_sgd, algo.local_steps=16",
    }
    # the records frame gives the same keys, also after a row filter
    df = load_runs(results)
    assert differing_keys(df) == ["algo.name", "algo.local_steps"]
    assert differing_keys(df[df["run_id"] != "run_ddp"]) == ["algo.local_steps"]
    # without attrs the config columns are recognised by name
    plain = pd.DataFrame(s.to_dict("list"))
    assert differing_keys(plain) == ["algo.name", "algo.local_steps"]
    # a key set in only some runs counts only when nothing else tells those runs apart:
    # algo.buffer_policy (all local SGD runs) does not, algo.error_feedback (one H8 repeat) does
    write_run(results, "run_h8_ef", {**H8[1], "error_feedback": True}, *H8[2:])
    s2 = load_summaries(results)
    assert differing_keys(s2) == ["algo.name", "algo.local_steps", "algo.error_feedback"]
    assert sorted(run_labels(s2).values())[-2:] == [
        "algo.name=local_sgd, algo.local_steps=8",
        "algo.name=local_sgd, algo.local_steps=8, algo.error_feedback=true",
    ]


# -- speedup --------------------------------------------------------------------------------------
# By hand: T = lowest final test_acc of the completed runs = H8's 0.008 * 100 = 0.80.
# First eval (every 10 steps) with acc >= 0.80:
#   ddp: 0.009 * 80 = 0.72 < T, 0.009 * 90 = 0.81 -> step 90: wall 90 s, modeled 180 s
#   H8:  0.008 * 90 = 0.72,     0.008 * 100 = 0.80 -> step 100: wall 50 s, modeled 50 s
#   H16: 0.0085 * 90 = 0.765,  0.0085 * 100 = 0.85 -> step 100: wall 25 s, modeled 40 s
# Speedup wall: 90/90 = 1, 90/50 = 1.8, 90/25 = 3.6; modeled: 180/180 = 1, 180/50 = 3.6, 180/40 = 4.5
HAND_T = 0.80
HAND_TIME = {"run_ddp": (90.0, 180.0), "run_h8": (50.0, 50.0), "run_h16": (25.0, 40.0)}
HAND_SPEEDUP = {"run_ddp": (1.0, 1.0), "run_h8": (1.8, 3.6), "run_h16": (3.6, 4.5)}


def test_time_to_threshold_and_speedup_match_hand_computation(results):
    tables = experiment_tables(results)
    assert list(tables) == [EXP]
    t = tables[EXP]
    assert t.metric == "test_acc" and t.threshold == pytest.approx(HAND_T)
    assert t.baseline_runs == ["run_ddp"]
    assert t.keys == ["algo.name", "algo.local_steps"]
    tab = t.table
    for run, (wall, modeled) in HAND_TIME.items():
        assert by_run(tab, "time_to_T_wall_s")[run] == pytest.approx(wall)
        assert by_run(tab, "time_to_T_modeled_s")[run] == pytest.approx(modeled)
    for run, (wall, modeled) in HAND_SPEEDUP.items():
        assert by_run(tab, "speedup_wall")[run] == pytest.approx(wall)
        assert by_run(tab, "speedup_modeled")[run] == pytest.approx(modeled)
    # GB per worker = wire_bytes / 1e9: 100, 12 and 6 ring all-reduces of 4 MB on 4 workers (each
    # sends 2 x 3/4 of the payload); floats sent: the payload / 4
    assert by_run(tab, "gb_sent_per_worker") == pytest.approx({"run_ddp": 0.6, "run_h8": 0.072, "run_h16": 0.036})
    assert by_run(tab, "floats_sent") == pytest.approx({"run_ddp": 1e8, "run_h8": 1.2e7, "run_h16": 6e6})
    assert by_run(tab, "best_test_acc") == pytest.approx({"run_ddp": 0.9, "run_h8": 0.8, "run_h16": 0.85})
    # target 0.7: ddp first reaches it at step 80 (0.72)
    assert by_run(tab, "time_to_target_s")["run_ddp"] == pytest.approx(80.0)

    records = load_runs(results / EXP / "run_h16")
    assert time_to_threshold(records, 0.5) == pytest.approx(0.25 * 60)  # 0.0085 * 60 = 0.51
    assert math.isnan(time_to_threshold(records, 0.9))
    assert time_to_threshold(records, 0.5, time_col="step") == 60


def test_running_and_failed_runs_do_not_set_the_threshold(results):
    # an unfinished run that stopped at 0.007 * 50 = 0.35 and a diverged one: T stays 0.80
    write_run(results, "run_killed", {"name": "local_sgd", "local_steps": 4}, 0.007, 0.5, 0.5, steps=50, with_summary=False)
    write_run(results, "run_nan", {"name": "local_sgd", "local_steps": 2}, 0.001, 0.5, 0.5, status="diverged")
    t = experiment_tables(results)[EXP]
    assert t.threshold == pytest.approx(HAND_T)
    assert by_run(t.table, "status")["run_killed"] == "running"
    for run in ("run_killed", "run_nan"):  # never reached 0.80
        assert math.isnan(by_run(t.table, "speedup_wall")[run])
    assert by_run(t.table, "speedup_wall")["run_h8"] == pytest.approx(1.8)


def collapse(run_dir, after_step: int, to: float):
    """Rewrite a written run so that its test accuracy is ``to`` from ``after_step`` on (a run that
    blew up): its final evaluation is then worse than its first."""
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for r in lines:
        if "test_acc" in r and r["step"] > after_step:
            r["test_acc"] = to
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["final_test_acc"] = to
    (run_dir / "summary.json").write_text(json.dumps(summary))


def test_a_collapsed_run_does_not_set_the_threshold(results, tmp_path):
    # local SGD H=2 learns at 0.009 / step to 0.45 at step 50, then blows up to 0.01 (chance level
    # would be 0.1): completed, but its final 0.01 is below its first evaluation's 0.09. Counted,
    # it would set T = 0.01, reached by every run at its first evaluation (step 10), and every
    # speedup would be the ratio of step times. Left out, T stays 0.80 and the hand times hold.
    collapse(write_run(results, "run_blown", {"name": "local_sgd", "local_steps": 2}, 0.009, 0.5, 0.5), 50, 0.01)
    t = experiment_tables(results)[EXP]
    assert t.threshold == pytest.approx(HAND_T)
    assert t.collapsed_runs == ["run_blown"] and not t.threshold_given
    for run, (wall, modeled) in HAND_TIME.items():
        assert by_run(t.table, "time_to_T_wall_s")[run] == pytest.approx(wall)
        assert by_run(t.table, "speedup_modeled")[run] == pytest.approx(HAND_SPEEDUP[run][1])
    assert math.isnan(by_run(t.table, "time_to_T_wall_s")["run_blown"])  # best 0.45 < 0.80
    text = write_report(results, tmp_path / "report").read_text()
    assert "among the 3 completed runs that did not collapse" in text
    assert "1 run collapsed (final test accuracy worse than at the first evaluation): `run_blown`" in text
    # when every completed run collapsed, T comes from all of them (there is nothing else)
    alone = experiment_tables(results / EXP / "run_blown")[EXP]
    assert alone.threshold == pytest.approx(0.01) and alone.collapsed_runs == ["run_blown"]


def test_threshold_given_on_the_command_line(results, tmp_path, capsys):
    # T = 0.5: ddp (0.009 / step) first evaluates >= 0.5 at step 60 (0.54): wall 60 s, modeled 120 s;
    # H=8 (0.008) at step 70 (0.56): 35 s, 35 s; H=16 (0.0085) at step 60 (0.51): 15 s, 24 s.
    t = experiment_tables(results, threshold=0.5)[EXP]
    assert t.threshold == 0.5 and t.threshold_given
    assert by_run(t.table, "time_to_T_wall_s") == pytest.approx({"run_ddp": 60.0, "run_h8": 35.0, "run_h16": 15.0})
    assert by_run(t.table, "time_to_T_modeled_s") == pytest.approx({"run_ddp": 120.0, "run_h8": 35.0, "run_h16": 24.0})
    assert by_run(t.table, "speedup_wall") == pytest.approx({"run_ddp": 1.0, "run_h8": 60 / 35, "run_h16": 4.0})
    assert lsgd_cli(["report", str(results), "--out", str(tmp_path / "r"), "--threshold", "0.5"]) == 0
    assert "Threshold T = 0.5000 test accuracy, given by `--threshold`" in (tmp_path / "r" / "report.md").read_text()
    with pytest.raises(SystemExit) as exc:
        lsgd_cli(["report", str(results), "--out", str(tmp_path / "bad"), "--threshold", "nan"])
    assert exc.value.code == 2 and "--threshold must be a finite number" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()  # refused before any work
    with pytest.raises(ValueError, match="threshold must be a finite number"):
        experiment_tables(results, threshold=float("inf"))


def test_no_ddp_run_gives_no_speedup(results):
    t = experiment_tables([results / EXP / "run_h8", results / EXP / "run_h16"])[EXP]
    assert t.threshold == pytest.approx(HAND_T)
    assert t.baseline_runs == []
    assert t.table["speedup_wall"].isna().all() and t.table["speedup_modeled"].isna().all()
    assert by_run(t.table, "time_to_T_wall_s") == pytest.approx({"run_h8": 50.0, "run_h16": 25.0})


def test_language_model_threshold_uses_perplexity(tmp_path):
    # test_ppl = 100 - rate * step; T = highest final ppl = 100 - 0.2 * 100 = 80.
    # ddp (rate 0.3): 100 - 0.3 * 70 = 79 <= 80 at step 70 (step 60: 82) -> wall 70 s
    # local (rate 0.2): reaches 80 at step 100 -> wall 0.5 * 100 = 50 s; speedup 70 / 50 = 1.4
    write_run(tmp_path, "lm_ddp", {"name": "ddp"}, 0.3, 1.0, 1.0, experiment="wt2", lm=True)
    write_run(tmp_path, "lm_local", {"name": "local_sgd", "local_steps": 8}, 0.2, 0.5, 0.5, experiment="wt2", lm=True)
    t = experiment_tables(tmp_path)["wt2"]
    assert t.metric == "test_ppl" and t.threshold == pytest.approx(80.0)
    assert by_run(t.table, "time_to_T_wall_s") == pytest.approx({"lm_ddp": 70.0, "lm_local": 50.0})
    assert by_run(t.table, "speedup_wall")["lm_local"] == pytest.approx(1.4)
    files = plot_runs(tmp_path, tmp_path / "plots")
    assert {p.name for p in files} >= {"wt2_test_ppl_vs_wire_bytes.png", "wt2_test_ppl_vs_wall_time_s.svg"}


@pytest.mark.filterwarnings("ignore:bytes per worker")  # the fake async runs record no wire_bytes_workers
def test_perplexity_vs_server_updates_for_sync_diloco_and_async_runs(tmp_path):
    """issue 13's figure: records carrying ``server_updates`` (async_local_sgd's server; diloco's
    rounds) give a test_ppl vs server_updates figure with one line per arm at the recorded counts;
    runs whose records lack it are left out of that figure."""
    sync = write_run(tmp_path, "sync", {"name": "diloco", "local_steps": 10}, 0.3, 1.0, 2.0, experiment="at", lm=True)
    asyn = write_run(tmp_path, "async", {"name": "async_local_sgd", "local_steps": 10}, 0.2, 1.0, 1.0,
                     experiment="at", lm=True)
    write_run(tmp_path, "plain", {"name": "ddp"}, 0.1, 1.0, 1.0, experiment="at", lm=True)
    for run, per_round in ((sync, 1), (asyn, WORLD)):  # async: W server updates per H progress steps
        path = run / "metrics.jsonl"
        recs = [json.loads(line) for line in path.read_text().splitlines()]
        path.write_text("".join(json.dumps({**r, "server_updates": r["step"] // 10 * per_round}) + "\n" for r in recs))
    out = tmp_path / "plots"
    names = {p.name for p in plot_runs(tmp_path, out)}
    assert {"at_test_ppl_vs_server_updates.png", "at_test_ppl_vs_server_updates.svg",
            "at_test_ppl_vs_modeled_time_s.png"} <= names
    svg = (out / "at_test_ppl_vs_server_updates.svg").read_text()
    assert "server updates" in svg and "DDP" not in svg
    curves = aggregate_curves(load_runs(tmp_path).dropna(subset=["server_updates", "test_ppl"]), "server_updates",
                              "test_ppl", {str(sync): "sync", str(asyn): "async"})
    by_arm = {arm: c["x"].tolist() for arm, c in curves.groupby("arm")}
    assert by_arm["sync"] == list(range(1, 11)) and by_arm["async"] == [WORLD * k for k in range(1, 11)]


# -- figures and report ---------------------------------------------------------------------------
FIGURES = ("test_acc_vs_wire_bytes", "test_acc_vs_wall_time_s", "test_acc_vs_modeled_time_s", "train_loss_vs_step")


def test_plot_runs_writes_png_and_svg_per_figure(results, tmp_path):
    # a completed run without any evaluation: only in the training-loss figure
    write_run(results, "run_noeval", {"name": "local_sgd", "local_steps": 32}, 0.0, 0.5, 0.5, with_evals=False)
    out = tmp_path / "plots"
    files = plot_runs(results, out)
    expected = {f"{EXP}_{fig}.{ext}" for fig in FIGURES for ext in ("png", "svg", "pdf")}
    assert {p.name for p in files} == expected
    for p in files:
        assert p.parent == out and p.stat().st_size > 1000
        if p.suffix == ".png":
            assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        if p.suffix == ".pdf":  # for papers (issue 24)
            assert p.read_bytes()[:5] == b"%PDF-"
    svg = {fig: (out / f"{EXP}_{fig}.svg").read_text() for fig in FIGURES}
    for fig in FIGURES:  # readable arm labels with their number of runs (one seed each here)
        assert "local SGD, H=8 (n=1)" in svg[fig]
        assert "DDP (n=1)" in svg[fig]
        assert "algo.name" not in svg[fig] and "run_h8" not in svg[fig]
    assert "H=32 (n=1)" in svg["train_loss_vs_step"]
    assert all("H=32" not in svg[f] for f in FIGURES if f.startswith("test_acc"))


def test_plot_runs_one_set_per_experiment(results, tmp_path):
    write_run(results, "c10_ddp", {"name": "ddp"}, 0.009, 1.0, 1.0, experiment="cifar10 resnet")
    write_run(results, "c10_slowmo", {"name": "slowmo", "slow_lr": 1.0}, 0.008, 0.5, 0.5, experiment="cifar10 resnet")
    files = {p.name for p in plot_runs(results, tmp_path / "plots")}
    for prefix in (EXP, "cifar10_resnet"):
        assert {f"{prefix}_{fig}.{ext}" for fig in FIGURES for ext in ("png", "svg")} <= files
    assert len(files) == 2 * len(FIGURES) * 3  # PNG, SVG and PDF
    # labels are per experiment: cifar's runs differ by algo.name only (slow_lr is slowmo's alone)
    svg = (tmp_path / "plots" / "cifar10_resnet_train_loss_vs_step.svg").read_text()
    assert "SlowMo (n=1)" in svg and "DDP (n=1)" in svg
    assert "H=" not in svg and "alpha" not in svg


#: The arm labels of the main set (one seed each).
LABELS = {"run_ddp": "DDP", "run_h8": "local SGD, H=8", "run_h16": "local SGD, H=16"}
MAIN_COLUMNS = ["method", "n", "final test acc", "best test acc", "GB on the wire / worker", "wire bytes vs ddp",
                "modeled time (s)", "time to T, modeled (s)", "modeled speedup vs ddp (cluster above)",
                "wall speedup vs ddp (this machine)", "Δ final test acc vs ddp, paired"]  # fmt: skip
MODELED, WALL = "modeled speedup vs ddp (cluster above)", "wall speedup vs ddp (this machine)"


def test_write_report_tables_and_figures(results, tmp_path):
    # the report's format changed with issue 14: a compact main table and a detailed table, both one
    # row per arm (labelled "local SGD, H=8", with n and seeds), instead of one 21-column table per run
    write_run(results, "run_killed", {"name": "local_sgd", "local_steps": 4}, 0.007, 0.5, 0.5, steps=50, with_summary=False)
    out = tmp_path / "report"
    path = write_report(results / EXP, out)
    assert path == out / "report.md" and path.stat().st_size > 0
    text = path.read_text()
    assert f"## {EXP}" in text and "Threshold T = 0.8000" in text
    main, details = parse_markdown_tables(text)
    rows = {r["method"]: r for r in details}
    assert list(rows) == ["DDP", "local SGD, H=4 (running)", "local SGD, H=8", "local SGD, H=16"]  # baseline first, then H
    assert rows["local SGD, H=8"]["algo"] == "local_sgd" and rows["local SGD, H=8"]["algo.local_steps"] == "8"
    assert rows["DDP"]["algo.local_steps"] == ""
    assert rows["local SGD, H=4 (running)"]["status"] == "running"
    assert all(r["n"] == "1" and r["seeds"] == "0" for r in details)
    for run, (wall, modeled) in HAND_SPEEDUP.items():
        assert rows[LABELS[run]][WALL] == f"{wall:.2f}"
        assert rows[LABELS[run]][MODELED] == f"{modeled:.2f}"
    assert rows["local SGD, H=4 (running)"][WALL] == "n/a"
    assert rows["DDP"]["final test acc"] == "0.9000" and rows["local SGD, H=16"]["best test acc"] == "0.8500"
    # wire bytes: 100 ring all-reduces of 4 MB on 4 workers, 2 x 3/4 x 4 MB each
    assert rows["DDP"]["GB on the wire / worker"] == "0.6" and rows["local SGD, H=8"]["comm rounds"] == "12"
    # 100 steps x batch 32 x 4 workers; train_loss(100) = 2 / (1 + 0.05 * 100); test_loss(100) = 1 - rate * 100
    assert rows["local SGD, H=8"]["samples"] == "12800" and rows["local SGD, H=8"]["final train loss"] == "0.3333"
    assert rows["DDP"]["final test loss"] == "0.1000" and rows["local SGD, H=4 (running)"]["final test loss"] == "0.6500"
    assert rows["local SGD, H=16"]["wall time (s)"] == "25.0" and rows["local SGD, H=16"]["modeled time (s)"] == "40"  # 3 significant digits
    assert rows["DDP"]["time to target, wall (s)"] == "80.0"
    # the main table: the compact columns, the same numbers, no run ids
    assert list(main[0]) == MAIN_COLUMNS
    assert [r["method"] for r in main] == list(rows)
    for r in main:
        assert {k: v for k, v in rows[r["method"]].items() if k in MAIN_COLUMNS} == r
    main_text = markdown_table(pd.DataFrame(main))
    assert not any(run in main_text for run in ("run_ddp", "run_h8", "run_h16", "run_killed"))
    # figures embedded with relative links that resolve from the report's folder; LaTeX and CSV beside
    links = re.findall(r"\]\(([^)]+)\)", text)
    figures = [link for link in links if link.startswith("figures/")]
    assert {f.rsplit(".", 1)[1] for f in figures} == {"png", "svg", "pdf"} and len(figures) == 3 * len(FIGURES)
    assert sorted(set(links) - set(figures)) == [f"{EXP}_arms.csv", f"{EXP}_main.tex", f"{EXP}_runs.csv"]
    for link in links:
        assert not link.startswith("/") and (out / link).stat().st_size > 0


def test_markdown_table_without_tabulate(monkeypatch):
    frame = pd.DataFrame({"run": ["a", "b|c"], "speedup": ["1.80", "n/a"]})
    with_tabulate = parse_markdown_tables(markdown_table(frame))

    def no_tabulate(*args, **kwargs):
        raise ImportError("Missing optional dependency 'tabulate'")

    monkeypatch.setattr(pd.DataFrame, "to_markdown", no_tabulate)
    without = markdown_table(frame)
    assert parse_markdown_tables(without) == with_tabulate == [[{"run": "a", "speedup": "1.80"}, {"run": "b\\|c", "speedup": "n/a"}]]


# -- compression rows, bytes vs dense, modeled time at 1 / 10 Gbps, batch scaling ------------------
GRAVAC = {"name": "gravac", "compressor": "dgc", "epsilon": 0.9, "cf_min": 10, "cf_max": 1000}
ACCORDION = {"name": "accordion", "compressor": "topk", "cf_low": 2, "cf_high": 10}


@pytest.fixture
def no_figures(monkeypatch):
    """write_report without rendering figures (the tests below check tables only; keeps them fast)."""
    monkeypatch.setattr("lsgd.analysis.report.plot_frames", lambda *args, **kwargs: {})


def gravac_row(step):
    """cf_min 10 then 20 from step 51; the candidate (2x) is sent except on every 10th step (dense)."""
    cf_min = 10.0 if step <= 50 else 20.0
    dense = step % 10 == 0
    return {
        "cf": 1.0 if dense else 2 * cf_min, "sent": "dense" if dense else "candidate",
        "cf_min": cf_min, "cf_candidate": 2 * cf_min, "gain_min": 0.95, "gain_candidate": 0.9,
        "gain": 1.0 if dense else 0.9,
    }  # fmt: skip


def accordion_row(step):
    low = step <= 30
    return {"cf": 2.0 if low else 10.0, "sent": "low" if low else "high", "low_fraction": 1.0 if low else 0.0}


def test_compression_rows_are_skipped_by_load_runs_and_returned_by_load_compression(results, tmp_path):
    write_run(results, "run_gravac", GRAVAC, 0.0088, 0.5, 0.5, bytes_per_round=PARAM_BYTES // 20, compression=gravac_row)
    write_run(results, "run_acc", ACCORDION, 0.0087, 0.5, 0.5, bytes_per_round=PARAM_BYTES // 5, compression=accordion_row)
    lines = (results / EXP / "run_gravac" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == STEPS + STEPS // LOG_EVERY and '"kind"' not in lines[-1]

    df = load_runs(results)
    per_run = STEPS // LOG_EVERY
    assert df.groupby("run_id").size().to_dict() == {r: per_run for r in ("run_ddp", "run_h8", "run_h16", "run_gravac", "run_acc")}
    assert not {"kind", "cf", "cf_min", "gain", "sent", "low_fraction"} & set(df.columns)
    g = df[df["run_id"] == "run_gravac"]
    assert g["step"].tolist() == list(range(LOG_EVERY, STEPS + 1, LOG_EVERY))
    assert g["comm_bytes"].iloc[-1] == 100 * (PARAM_BYTES // 20)
    assert load_summaries(results).set_index("run_id").loc["run_gravac", "steps"] == STEPS
    assert read_metrics(results / EXP / "run_gravac")[0]["step"] == LOG_EVERY

    comp = load_compression(results)
    assert comp.groupby("run_id").size().to_dict() == {"run_gravac": STEPS, "run_acc": STEPS}  # none for ddp / local SGD
    g = comp[comp["run_id"] == "run_gravac"]
    assert g["step"].tolist() == list(range(1, STEPS + 1))
    assert (g["kind"] == "compression").all() and (g["algo.name"] == "gravac").all() and (g["status"] == "completed").all()
    assert g["cf"].tolist() == [gravac_row(s)["cf"] for s in range(1, STEPS + 1)]
    assert g.set_index("step").loc[60, "cf_min"] == 20.0 and g.set_index("step").loc[60, "sent"] == "dense"
    a = comp[comp["run_id"] == "run_acc"]
    assert a["low_fraction"].tolist() == [1.0] * 30 + [0.0] * 70 and a["cf_min"].isna().all()
    assert set(comp["experiment_name"]) == {EXP} and "algo.epsilon" in comp.attrs["config_keys"]
    assert len(load_compression(results / EXP / "run_ddp")) == 0

    # the tables do not change when a run's metrics.jsonl also holds compression rows
    write_run(tmp_path / "plain", "run_gravac", GRAVAC, 0.0088, 0.5, 0.5, bytes_per_round=PARAM_BYTES // 20)
    with_rows = experiment_tables(results / EXP / "run_gravac")[EXP].table.drop(columns="run_dir")
    without = experiment_tables(tmp_path / "plain")[EXP].table.drop(columns="run_dir")
    pd.testing.assert_frame_equal(with_rows, without)


def test_bytes_vs_dense(results, tmp_path, no_figures):
    # main set: ddp sends 100 rounds of PARAM_BYTES; H8 12 rounds, H16 6 rounds; static topk cf=10 a tenth
    write_run(results, "run_topk", {"name": "compressed", "compressor": "topk", "cf": 10}, 0.0087, 0.5, 0.5,
              bytes_per_round=PARAM_BYTES // 10)  # fmt: skip
    t = experiment_tables(results)[EXP].table
    assert by_run(t, "bytes_vs_dense") == pytest.approx({"run_ddp": 1.0, "run_h8": 0.12, "run_h16": 0.06, "run_topk": 0.1})
    assert set(t["dense_run"]) == {"run_ddp"}
    assert by_run(t, "floats_sent")["run_topk"] == pytest.approx(100 * PARAM_BYTES / 10 / 4)
    main, details = parse_markdown_tables(write_report(results, tmp_path / "r1").read_text())
    rows = {r["method"]: r for r in details}  # the payload ratio is in the details only (issue 42)
    assert rows["compressed, top-k, CF=10"]["payload vs dense"] == "0.1" and rows["DDP"]["payload vs dense"] == "1"
    assert not any("dense" in column for column in main[0])

    # two dense runs (ddp at batch 32 and 64): each run is compared with the one of its own batch size;
    # compressor=none is dense too
    exp = "batch"
    write_run(tmp_path / "b", "ddp32", {"name": "ddp"}, 0.009, 1.0, 1.0, experiment=exp)
    write_run(tmp_path / "b", "ddp64", {"name": "ddp"}, 0.009, 1.0, 1.0, experiment=exp, batch_size=64, bytes_per_round=2 * PARAM_BYTES)
    write_run(tmp_path / "b", "topk32", {"name": "compressed", "compressor": "topk", "cf": 10}, 0.008, 0.5, 0.5,
              experiment=exp, bytes_per_round=PARAM_BYTES // 10)  # fmt: skip
    write_run(tmp_path / "b", "topk64", {"name": "compressed", "compressor": "topk", "cf": 10}, 0.008, 0.5, 0.5,
              experiment=exp, batch_size=64, bytes_per_round=PARAM_BYTES // 10)  # fmt: skip
    write_run(tmp_path / "b", "none64", {"name": "compressed", "compressor": "none", "cf": 1}, 0.008, 0.5, 0.5,
              experiment=exp, batch_size=64, bytes_per_round=PARAM_BYTES)  # fmt: skip
    t = experiment_tables(tmp_path / "b")[exp].table
    assert by_run(t, "dense_run") == {"ddp32": "ddp32", "ddp64": "ddp64", "topk32": "ddp32", "topk64": "ddp64", "none64": "none64"}
    assert by_run(t, "bytes_vs_dense") == pytest.approx({"ddp32": 1.0, "ddp64": 1.0, "topk32": 0.1, "topk64": 0.05, "none64": 1.0})

    # no dense run: n/a
    t = experiment_tables([results / EXP / "run_h8", results / EXP / "run_topk"])[EXP].table
    assert t["bytes_vs_dense"].isna().all() and t["dense_run"].isna().all()
    rows = parse_markdown_tables(write_report([results / EXP / "run_h8"], tmp_path / "r2").read_text())[1]
    assert rows[0]["method"] == "local SGD, H=8" and rows[0]["payload vs dense"] == "n/a"  # H defines local SGD


def test_gb_sent_per_worker_counts_the_wire_of_workers_only(tmp_path, no_figures):
    """issue 22 item 6: the bytes column is what one worker puts on the wire, over the worker ranks.

    Parameter server, 1 server + 3 workers, 10 steps of an n = 4 MB model: each worker sends n per
    step (its gradient), the server 3 n (the model to each worker); the mean over the 4 ranks is
    (3 x 10 n + 3 x 10 n) / 4 = 15 n = 60 MB, but a worker sends 10 n = 40 MB (wire = payload for
    messages). An all-gather algorithm on 4 workers, 10 steps of a 1 MB input: the payload handed
    to the collective is 10 MB, the wire (p - 1) x 1 MB x 10 = 30 MB. A server run recorded before
    the workers-only keys: n/a (its mean counts the server)."""
    n, steps = 4_000_000, 10
    root = tmp_path / "res"
    exp = "bytes_study"

    def patch(run_dir, **summary):
        path = run_dir / "summary.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **summary}))

    ps = write_run(root, "ps", {"name": "param_server"}, 0.009, 1.0, 1.0, experiment=exp, steps=steps)
    patch(ps, num_workers=3, comm_bytes=15 * n, wire_bytes=15 * n, comm_bytes_workers=10 * n, wire_bytes_workers=10 * n)
    old = write_run(root, "ps_old", {"name": "param_server"}, 0.009, 1.0, 1.0, experiment=exp, steps=steps)
    patch(old, num_workers=3, comm_bytes=15 * n, wire_bytes=15 * n)
    ag = write_run(root, "allgather", {"name": "compressed", "compressor": "topk"}, 0.009, 1.0, 1.0, experiment=exp,
                   steps=steps)
    patch(ag, num_workers=4, comm_bytes=steps * 1_000_000, wire_bytes=steps * 3 * 1_000_000)
    t = experiment_tables(root)[exp].table
    gb = by_run(t, "gb_sent_per_worker")
    assert gb["ps"] == pytest.approx(0.04) and gb["allgather"] == pytest.approx(0.03)
    assert math.isnan(gb["ps_old"])
    assert by_run(t, "floats_sent")["ps"] == pytest.approx(10 * n / 4)
    text = write_report(root, tmp_path / "r").read_text()
    assert "GB on the wire / worker" in text and "GB sent / worker" not in text


def test_modeled_time_at_1_and_10_gbps(results, tmp_path, no_figures):
    # 100 rounds of a ring all-reduce over 4 workers: a = 2 * 3 * 100 = 600 latencies,
    # b = 2 * 3/4 * 4 MB * 100 = 6e8 bytes; compute = 0.8 * wall * 100 = 80 s (wall 1 s/step).
    a, b, compute = 600, 6e8, 80.0
    write_run(results, "run_ab", {"name": "ddp", "bucket_cap_mb": 25}, 0.009, 1.0, 2.0, alpha_beta=True)  # latency 50 us
    write_run(results, "run_ab_default", {"name": "ddp", "bucket_cap_mb": 50}, 0.009, 1.0, 2.0, alpha_beta=True,
              network={"name": "custom", "bandwidth_gbps": 10.0})  # no latency_us: 10 us  # fmt: skip
    write_run(results, "run_ab_running", {"name": "ddp", "bucket_cap_mb": 100}, 0.009, 1.0, 2.0, alpha_beta=True, with_summary=False)
    t = experiment_tables(results)[EXP].table
    # each column is the network preset of its bandwidth, latency included (conf/network/1gbps.yaml:
    # 50 us, 10gbps.yaml: 10 us), whatever the run's own latency (50 us, or none given)
    for run in ("run_ab", "run_ab_default", "run_ab_running"):  # running: from its last record
        assert by_run(t, "modeled_1gbps_s")[run] == pytest.approx(compute + a * 50e-6 + b * 8 / 1e9)
        assert by_run(t, "modeled_10gbps_s")[run] == pytest.approx(compute + a * 10e-6 + b * 8 / 10e9)
    assert by_run(t, "modeled_1gbps_s")["run_ab"] == pytest.approx(80 + 0.03 + 4.8)
    assert by_run(t, "modeled_10gbps_s")["run_ab"] == pytest.approx(80 + 0.006 + 0.48)  # not 80.51 (50 us)
    assert math.isnan(by_run(t, "modeled_1gbps_s")["run_h8"])  # older run: no alpha-beta terms
    rows = {r["method"]: r for r in parse_markdown_tables(write_report(results, tmp_path / "r").read_text())[1]}
    assert rows["DDP, bucket cap mb=25"]["modeled @1 Gbps (s)"] == "84.8"
    assert rows["DDP, bucket cap mb=25"]["modeled @10 Gbps (s)"] == "80.5"
    assert rows["local SGD, H=8"]["modeled @1 Gbps (s)"] == ""
    # an experiment where no run has the terms gets no such columns
    old = parse_markdown_tables(write_report(results / EXP / "run_h8", tmp_path / "old").read_text())[1]
    assert not any(k.startswith("modeled @") for k in old[0])


def test_batch_scaling_table_and_report_section(results, tmp_path, no_figures):
    # final acc = rate * 100; effective batch = batch_size x world size
    exp = "adasum_study"
    root = tmp_path / "res"
    ddp, adasum = {"name": "ddp"}, {"name": "adasum", "target": "delta"}
    for run_id, algo, rate, bs, world, scaling, status in (
        ("ddp_128", ddp, 0.0090, 32, 4, "linear", "completed"),
        ("ddp_256", ddp, 0.0080, 64, 4, "linear", "completed"),
        ("ddp_512", ddp, 0.0010, 64, 8, "linear", "diverged"),
        ("ada_128", adasum, 0.0091, 32, 4, "adasum", "completed"),
        ("ada_256_a", adasum, 0.0088, 64, 4, "adasum", "completed"),
        ("ada_256_b", adasum, 0.0086, 32, 8, "adasum", "completed"),  # same effective batch: mean
        ("ada_512", adasum, 0.0085, 64, 8, "adasum", "completed"),
        ("adag_128", {"name": "adasum", "target": "gradient"}, 0.0089, 32, 4, "adasum", "completed"),
    ):
        write_run(root, run_id, algo, rate, 1.0, 1.0, experiment=exp, batch_size=bs, world=world,
                  optim={"lr_scaling": scaling}, status=status)  # fmt: skip
    tab = batch_scaling_table(load_summaries(root))
    assert list(tab.columns) == [128, 256, 512] and tab.attrs["metric"] == "test_acc"
    ada, adag, d = "adasum (delta), lr_scaling=adasum", "adasum (gradient), lr_scaling=adasum", "ddp, lr_scaling=linear"
    assert list(tab.index) == [ada, adag, d]
    expected = {
        ada: [0.91, (0.88 + 0.86) / 2, 0.85],
        adag: [0.89, math.nan, math.nan],
        d: [0.90, 0.80, math.nan],  # the diverged run is left out
    }
    for method, values in expected.items():
        assert tab.loc[method].tolist() == pytest.approx(values, nan_ok=True)
    # without lr_scaling differing: the label is the method alone; world size from summary.json
    tab = batch_scaling_table(load_summaries([root / exp / r for r in ("ddp_128", "ddp_256")]))
    assert list(tab.index) == ["ddp"] and tab.loc["ddp"].to_dict() == pytest.approx({128: 0.9, 256: 0.8})

    text = write_report(root, tmp_path / "report").read_text()
    assert "### accuracy vs effective batch" in text
    main, details, scaling = parse_markdown_tables(text)
    assert len(main) == len(details) == 8
    cells = {r["method"]: r for r in scaling}
    # cells: mean +- 95% t interval (n=2: t_{0.975,1} = tan(0.475 pi)) and n; 0.88 and 0.86: s = 0.01 sqrt(2)
    h = math.tan(0.475 * math.pi) * 0.01 * math.sqrt(2) / math.sqrt(2)
    assert cells[ada] == {"method": ada, "128": "0.9100 (n=1)", "256": f"0.8700 ± {h:.4f} (n=2)", "512": "0.8500 (n=1)"}
    assert f"{h:.4f}" == "0.1271"
    assert cells[d]["512"] == "diverged" and cells[adag]["256"] == ""
    assert batch_scaling_table(load_summaries(root), stat="n").loc[ada].tolist() == [1, 2, 1]
    # the main set has one effective batch: no such table
    assert "effective batch" not in write_report(results, tmp_path / "main").read_text()
    assert experiment_tables(results)[EXP].batch_scaling is None


def test_compression_figure(results, tmp_path, monkeypatch):
    write_run(results, "run_gravac", GRAVAC, 0.0088, 0.5, 0.5, compression=gravac_row)
    write_run(results, "run_acc", ACCORDION, 0.0087, 0.5, 0.5, compression=accordion_row)
    out = tmp_path / "plots"
    files = {p.name for p in plot_runs(results, out)}
    assert {f"{EXP}_compression.png", f"{EXP}_compression.svg"} <= files
    assert len(files) == 3 * (len(FIGURES) + 1)  # PNG, SVG and PDF
    assert (out / f"{EXP}_compression.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    svg = (out / f"{EXP}_compression.svg").read_text()
    assert "GraVAC, DGC (n=1)" in svg and "Accordion, top-k (n=1)" in svg and "cf_candidate" in svg
    assert "DDP" not in svg  # no compression rows
    # referenced from the report (only the compression figure drawn again, to keep the test fast)
    monkeypatch.setattr("lsgd.analysis.plots.plot_experiment", lambda *args, **kwargs: {})
    text = write_report(results, tmp_path / "report").read_text()
    assert f"figures/{EXP}_compression.png" in text and f"figures/{EXP}_compression.svg" in text
    # the gain panel also draws GraVAC's smoothed theta_min and candidate gains (the epsilon rule's inputs)
    figs = []
    monkeypatch.setattr("lsgd.analysis.plots._save", lambda fig, path: figs.append(fig) or [])
    plot_runs(results, tmp_path / "again")
    gain_ax = figs[-1].axes[1]
    ys = sorted({tuple(line.get_ydata()) for line in gain_ax.get_lines()}, key=len)
    assert (0.95,) * STEPS in ys and (0.9,) * STEPS in ys


def test_resumed_metrics_with_compression_rows(tmp_path):
    # logged up to step 20, resumed from step 10: the rows of steps 11-20 are superseded, both kinds
    run = write_run(tmp_path, "r", GRAVAC, 0.009, 1.0, 1.0, steps=20, compression=gravac_row)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    again = [json.dumps({**json.loads(l), "resumed": True}) for l in lines if json.loads(l)["step"] > 10]
    (run / "metrics.jsonl").write_text("\n".join(lines + again) + "\n")
    assert [(r["step"], "resumed" in r) for r in read_metrics(run)] == [(5, False), (10, False), (15, True), (20, True)]
    comp = load_compression(run)
    assert comp["step"].tolist() == list(range(1, 21)) and comp["resumed"].isna().tolist() == [True] * 10 + [False] * 10


def test_bytes_per_worker_vs_workers_and_consensus_figures(tmp_path):
    """Runs of two methods at 4, 8 and 16 workers: one line per method in the scaling figure (the
    world size is its x axis, not part of the label); consensus distance vs step when recorded."""
    root = tmp_path / "res"
    for world in (4, 8, 16):
        # all-reduce bytes grow with the world size; a gossip method's stay flat
        write_run(root, f"ddp_{world}", {"name": "ddp"}, 0.01, 0.5, 0.5, world=world,
                  bytes_per_round=int(PARAM_BYTES * 2 * (world - 1) / world))
        run = write_run(root, f"gossip_{world}", {"name": "swarm_sgd", "local_steps": 1}, 0.01, 0.5, 0.5, world=world)
        lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        for i, rec in enumerate(lines):
            rec["consensus_distance"] = 1.0 / (i + 1)
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    files = {p.name for p in plot_runs(root, tmp_path / "plots")}
    assert {f"{EXP}_wire_bytes_per_step_vs_nodes.svg", f"{EXP}_consensus_distance_vs_step.svg"} <= files
    svg = (tmp_path / "plots" / f"{EXP}_wire_bytes_per_step_vs_nodes.svg").read_text()
    assert "DDP (n=1)" in svg and "SwarmSGD, H=1 (n=1)" in svg and "world_size" not in svg and "workers=" not in svg
    assert "ddp_4" not in svg  # one line per method: no run ids
    # one set of runs at one world size: no scaling figure
    single = tmp_path / "single"
    write_run(single, "a", {"name": "ddp"}, 0.01, 0.5, 0.5)
    write_run(single, "b", {"name": "local_sgd", "local_steps": 8}, 0.01, 0.5, 0.5)
    assert not any("vs_nodes" in p.name for p in plot_runs(single, tmp_path / "plots2"))


# -- seeds: arms, means and 95% t intervals (issue 14) ---------------------------------------------
# Student t quantiles by hand: df = 1 is the Cauchy quantile tan(pi (p - 1/2)); df = 2 has the closed
# form (2p - 1) / sqrt(2 p (1 - p)) (4.302652729749464; tables print 4.303).
T1 = math.tan(math.pi * (0.975 - 0.5))
T2 = (2 * 0.975 - 1) / math.sqrt(2 * 0.975 * 0.025)


def test_t_quantiles_by_hand():
    assert T1 == pytest.approx(12.706204736174696, rel=1e-12)
    assert T2 == pytest.approx(4.302652729749464, rel=1e-12)
    assert t_halfwidth(1.0, 3) == pytest.approx(T2 / math.sqrt(3), rel=1e-12)
    assert math.isnan(t_halfwidth(1.0, 1))


def test_aggregate_seeds_matches_hand_computed_means_and_intervals():
    df = pd.DataFrame(
        {
            "algo.name": ["local_sgd", "ddp", "local_sgd", "local_sgd", "ddp", "slowmo"],
            "algo.local_steps": [8, None, 8, 8, None, 8],  # ddp: missing, and grouped together
            "seed": [0, 0, 1, 2, 1, 0],
            "run_id": ["a0", "d0", "a1", "a2", "d1", "s0"],
            "acc": [0.80, 0.90, 0.82, 0.84, 0.92, 0.70],
            "time": [10.0, 1.0, math.nan, 30.0, 3.0, 5.0],  # one local SGD seed never reached T
        }
    )
    arms = aggregate_seeds(df, by=["algo.name", "algo.local_steps"])
    assert arms["algo.name"].tolist() == ["local_sgd", "ddp", "slowmo"]  # order of first appearance
    assert arms["n"].tolist() == [3, 2, 1]
    assert arms["seeds"].tolist() == ["0, 1, 2", "0, 1", "0"] and arms["run_ids"].tolist()[1] == "d0, d1"
    assert [c for c in arms.columns if c.startswith("acc_")] == [f"acc_{s}" for s in ("mean", "ci", "sd", "n", "min", "max")]
    local, ddp, slowmo = (arms.iloc[i] for i in range(3))
    # local SGD acc 0.80, 0.82, 0.84: mean 0.82, s = 0.02, h = t_{0.975,2} 0.02 / sqrt(3) = 0.0497
    assert local["acc_mean"] == pytest.approx(0.82) and local["acc_sd"] == pytest.approx(0.02)
    assert local["acc_ci"] == pytest.approx(T2 * 0.02 / math.sqrt(3)) and f"{local['acc_ci']:.4f}" == "0.0497"
    assert (local["acc_n"], local["acc_min"], local["acc_max"]) == (3, 0.80, 0.84)
    # its time over the 2 seeds that have one: 10 and 30: mean 20, s = 10 sqrt(2), h = t_{0.975,1} 10 sqrt(2) / sqrt(2)
    assert local["time_mean"] == pytest.approx(20.0) and local["time_n"] == 2
    assert local["time_ci"] == pytest.approx(T1 * 10.0)
    # ddp 0.90, 0.92: mean 0.91, s = 0.01 sqrt(2), h = t_{0.975,1} 0.01
    assert ddp["acc_mean"] == pytest.approx(0.91) and ddp["acc_ci"] == pytest.approx(T1 * 0.01)
    assert pd.isna(ddp["algo.local_steps"])
    # one run: its value, no interval
    assert slowmo["acc_mean"] == pytest.approx(0.70) and math.isnan(slowmo["acc_ci"]) and math.isnan(slowmo["acc_sd"])
    t_075 = (2 * 0.75 - 1) / math.sqrt(2 * 0.75 * 0.25)  # confidence 0.5: t_{0.75,2}
    half = aggregate_seeds(df, by="algo.name", values=["acc"], confidence=0.5)["acc_ci"].iloc[0]
    assert half == pytest.approx(t_075 * 0.02 / math.sqrt(3), rel=1e-12)
    with pytest.raises(KeyError):
        aggregate_seeds(df, by=["nope"])


def write_seeds(root):
    """DDP and local SGD H=8 with seeds 0, 1, 2, local SGD H=16 with seed 0 (final acc = rate * 100).

    DDP: rates 0.0090, 0.0092, 0.0094 (final 0.90, 0.92, 0.94), modeled 2 s/step.
    H=8: rates 0.0080, 0.0082, 0.0078 (final 0.80, 0.82, 0.78), modeled 0.5, 0.6, 0.4 s/step.
    H=16: rate 0.0085 (final 0.85), modeled 0.4 s/step. algo.seed follows seed (as in the configs).
    """
    for seed, rate in enumerate((0.0090, 0.0092, 0.0094)):
        write_run(root, f"ddp_s{seed}", {"name": "ddp"}, rate, 1.0, 2.0, seed=seed)
    for seed, (rate, modeled) in enumerate(((0.0080, 0.5), (0.0082, 0.6), (0.0078, 0.4))):
        write_run(root, f"h8_s{seed}", {**H8[1], "seed": seed}, rate, 0.5, modeled, seed=seed)
    write_run(root, "h16_s0", {**H16[1], "seed": 0}, 0.0085, 0.25, 0.4, seed=0)


# By hand: T = the lowest final accuracy of the 7 completed runs = 0.78 (H=8, seed 2).
# DDP reaches 0.78 at step 90 in each seed (0.009 * 80 = 0.72, 0.0092 * 80 = 0.736, 0.0094 * 80 = 0.752
# are below): modeled 180 s each, so the baseline's time to T is 180 s and each DDP speedup 1.
# H=8 reaches it at step 100 (0.72, 0.738, 0.702 at step 90): modeled 50, 60, 40 s -> speedups
# 3.6, 3.0, 4.5: mean 3.7, s = sqrt((0.01 + 0.49 + 0.64) / 2) = sqrt(0.57).
# H=16 at step 100 (0.765 at step 90): 40 s -> 4.5.
SEED_SPEEDUPS = (3.6, 3.0, 4.5)


def test_report_over_three_seeds_and_one_seed(tmp_path):
    root = tmp_path / "res"
    write_seeds(root)
    s = load_summaries(root)
    assert differing_keys(s) == ["algo.name", "algo.local_steps", "algo.seed", "seed"]
    assert arm_keys(s) == ["algo.name", "algo.local_steps"]
    labels = arm_labels(s)
    assert sorted(set(labels.values())) == ["DDP", "local SGD, H=16", "local SGD, H=8"]

    t = experiment_tables(root)[EXP]
    assert t.threshold == pytest.approx(0.78) and len(t.baseline_runs) == 3
    assert by_run(t.table, "speedup_modeled") == pytest.approx(
        {"ddp_s0": 1.0, "ddp_s1": 1.0, "ddp_s2": 1.0, "h8_s0": 3.6, "h8_s1": 3.0, "h8_s2": 4.5, "h16_s0": 4.5})
    arms = t.arms.set_index("arm")
    assert arms.loc["local SGD, H=8", "speedup_modeled_mean"] == pytest.approx(3.7)
    assert arms.loc["local SGD, H=8", "speedup_modeled_ci"] == pytest.approx(T2 * math.sqrt(0.57) / math.sqrt(3))
    assert arms.loc["local SGD, H=8", "time_to_T_modeled_s_ci"] == pytest.approx(T2 * 10 / math.sqrt(3))

    out = tmp_path / "report"
    text = write_report(root, out).read_text()
    assert "Student t with n - 1 degrees of freedom" in text  # the report says how its intervals are made
    assert "Config differences: `algo.name`: ddp, local_sgd; `algo.local_steps`: (unset), 8, 16; `seed`: 0, 1, 2; `algo.seed`: (unset), 0, 1, 2." in text
    assert "7 runs in 3 arms (n = 1 to 3 runs)." in text
    assert "In the labels: H = `algo.local_steps`." in text
    assert text.count("Threshold T") == 1 and text.count("**Modeled time** is") == 1  # definitions once
    main, details = parse_markdown_tables(text)
    assert list(main[0]) == MAIN_COLUMNS
    rows = {r["method"]: r for r in main}
    assert list(rows) == ["DDP", "local SGD, H=8", "local SGD, H=16"]
    h_acc = T2 * 0.02 / math.sqrt(3)  # both 3-seed arms: s = 0.02 over their final accuracies
    assert rows["DDP"]["n"] == "3" and rows["DDP"]["final test acc"] == f"0.9200 ± {h_acc:.4f}" == "0.9200 ± 0.0497"
    assert rows["DDP"][MODELED] == "1.00"  # the same in every seed: no "± 0" (issue 24)
    assert rows["local SGD, H=8"]["final test acc"] == "0.8000 ± 0.0497"
    h_speedup = T2 * math.sqrt(0.57) / math.sqrt(3)
    assert rows["local SGD, H=8"][MODELED] == f"3.70 ± {h_speedup:.2f}" == "3.70 ± 1.88"
    assert rows["local SGD, H=8"]["time to T, modeled (s)"] == f"50 ± {T2 * 10 / math.sqrt(3):.3g}" == "50 ± 24.8"
    # paired by seed with DDP: d = 0.80 - 0.90, 0.82 - 0.92, 0.78 - 0.94 = -0.10, -0.10, -0.16;
    # mean -0.12, s = sqrt((0.02^2 + 0.02^2 + 0.04^2) / 2) = sqrt(0.0012); H=16 has seed 0 only
    h_paired = T2 * math.sqrt(0.0012) / math.sqrt(3)
    assert rows["local SGD, H=8"]["Δ final test acc vs ddp, paired"] == f"-0.1200 ± {h_paired:.4f}" == "-0.1200 ± 0.0861"
    assert rows["local SGD, H=16"]["Δ final test acc vs ddp, paired"] == "-0.0500 (1 pair)"
    assert rows["DDP"]["Δ final test acc vs ddp, paired"] == "baseline"
    assert list(t.arms["paired_with"]) == ["baseline", "DDP", "DDP"]
    assert list(t.arms["paired_diff_final_test_acc_n"]) == [3, 3, 1]
    assert rows["local SGD, H=8"]["GB on the wire / worker"] == "0.072"  # the same bytes in every seed: no "± 0"
    # one seed: n=1, the value and no interval
    assert rows["local SGD, H=16"]["n"] == "1"
    assert rows["local SGD, H=16"]["final test acc"] == "0.8500" and rows["local SGD, H=16"][MODELED] == "4.50"
    assert not any("±" in cell for cell in rows["local SGD, H=16"].values())  # 1 seed, 1 pair
    # no run ids or dotted keys in the main table; the details name the seeds
    main_text = markdown_table(pd.DataFrame(main))
    assert not re.search(r"ddp_s\d|h8_s\d|h16_s0|algo\.", main_text)
    assert {r["method"]: r["seeds"] for r in details} == {"DDP": "0, 1, 2", "local SGD, H=8": "0, 1, 2", "local SGD, H=16": "0"}

    # LaTeX (booktabs) beside the Markdown, CSV files with every number
    tex = (out / f"{EXP}_main.tex").read_text()
    assert all(rule in tex for rule in ("\\toprule", "\\midrule", "\\bottomrule", "\\begin{tabular}"))
    assert "local SGD, H=8 & 3 & 0.8000 $\\pm$ 0.0497" in tex and "fmnist\\_demo" in tex and "95\\%" in tex
    assert "$\\Delta$ final test acc vs ddp, paired" in tex and "Δ" not in tex  # pdflatex-safe
    arms_csv = pd.read_csv(out / f"{EXP}_arms.csv")
    assert arms_csv["arm"].tolist() == ["DDP", "local SGD, H=8", "local SGD, H=16"] and arms_csv["n"].tolist() == [3, 3, 1]
    assert arms_csv["final_test_acc_ci"].iloc[1] == pytest.approx(h_acc)
    assert len(pd.read_csv(out / f"{EXP}_runs.csv")) == 7

    # figures: one mean line per arm, a band for the 3-seed arms, n in the legend
    for fig in FIGURES:
        svg = (out / "figures" / f"{EXP}_{fig}.svg").read_text()
        assert (out / "figures" / f"{EXP}_{fig}.png").stat().st_size > 1000
        assert "DDP (n=3)" in svg and "local SGD, H=8 (n=3)" in svg and "local SGD, H=16 (n=1)" in svg
        assert "h8_s0" not in svg


def test_paired_differences_by_seed_against_hand_computation():
    # seeds 0, 1, 2: d = 0.90 - 0.88, 0.85 - 0.84, 0.80 - 0.81 = 0.02, 0.01, -0.01; mean 0.02 / 3,
    # s^2 = ((0.02 - m)^2 + (0.01 - m)^2 + (-0.01 - m)^2) / 2 = 0.00023333 (m = 0.0066667)
    arm, base = pd.Series([0.90, 0.85, 0.80]), pd.Series([0.81, 0.84, 0.88])
    got = paired_differences(arm, [0, 1, 2], base, [2, 1, 0])  # the baseline listed in another order
    assert got["n"] == 3 and got["mean"] == pytest.approx(0.02 / 3)
    assert got["ci"] == pytest.approx(T2 * math.sqrt(0.00023333333) / math.sqrt(3))
    # the unpaired interval of the arm's mean alone is wider than the paired one: seeds share noise
    assert got["ci"] < T2 * arm.std() / math.sqrt(3)
    # only seeds both arms have are paired; a missing value drops its pair
    two = paired_differences([0.90, 0.85, 0.70], [0, 1, 5], base, [2, 1, 0])
    assert two["n"] == 2 and two["mean"] == pytest.approx(0.015)
    one = paired_differences([0.90, float("nan")], [0, 1], base, [2, 1, 0])
    assert one["n"] == 1 and one["mean"] == pytest.approx(0.02) and math.isnan(one["ci"])
    assert paired_differences([0.5], [7], base, [2, 1, 0])["n"] == 0
    with pytest.raises(ValueError, match="several runs of seed 1"):
        paired_differences([0.9, 0.8], [1, 1], base, [2, 1, 0])


def test_figures_draw_mean_curves_with_bands(tmp_path, monkeypatch):
    root = tmp_path / "res"
    write_seeds(root)
    figs = {}
    monkeypatch.setattr("lsgd.analysis.plots._save", lambda fig, stem: figs.setdefault(stem.name, fig) and [])
    plot_runs(root, tmp_path / "plots")
    ax = figs[f"{EXP}_test_acc_vs_modeled_time_s"].axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert sorted(lines) == ["DDP (n=3)", "local SGD, H=16 (n=1)", "local SGD, H=8 (n=3)"]
    assert len(ax.collections) == 2  # bands of the two 3-seed arms, none for n=1
    # DDP's seeds share their modeled times (2 s/step): the mean of 0.009, 0.0092, 0.0094 x step
    ddp = lines["DDP (n=3)"]
    assert list(ddp.get_xdata()) == [2.0 * step for step in range(EVAL_EVERY, STEPS + 1, EVAL_EVERY)]
    assert list(ddp.get_ydata()) == pytest.approx([0.0092 * step for step in range(EVAL_EVERY, STEPS + 1, EVAL_EVERY)])
    band = ax.collections[0].get_paths()[0].vertices  # the DDP band: mean -+ t_{0.975,2} s / sqrt(3), s = 0.0002 step
    assert band[:, 1].max() == pytest.approx(0.92 + T2 * 0.02 / math.sqrt(3))
    assert band[:, 1].min() == pytest.approx(0.0092 * EVAL_EVERY - T2 * 0.0002 * EVAL_EVERY / math.sqrt(3))


def test_aggregate_curves_on_a_common_grid():
    # two runs whose x values differ: interpolated onto {0, 5, 10, 20} (the union inside [0, 20])
    records = pd.DataFrame(
        {
            "run_dir": ["a"] * 3 + ["b"] * 4 + ["c"] * 2,
            "x": [0.0, 10.0, 20.0, 0.0, 5.0, 20.0, 30.0, 0.0, 10.0],
            "y": [0.0, 1.0, 2.0, 0.0, 1.0, 4.0, 9.0, 5.0, 6.0],
        }
    )
    curves = aggregate_curves(records, "x", "y", {"a": "arm", "b": "arm", "c": "single"})
    arm = curves[curves["arm"] == "arm"]
    assert arm["x"].tolist() == [0.0, 5.0, 10.0, 20.0]  # b's point at 30 lies beyond a's range
    # a at 5: 0.5; b at 10: 1 + (10 - 5) / (20 - 5) * 3 = 2
    assert arm["mean"].tolist() == pytest.approx([0.0, (0.5 + 1.0) / 2, (1.0 + 2.0) / 2, (2.0 + 4.0) / 2])
    assert arm["low"].tolist() == pytest.approx([0.0, 0.5, 1.0, 2.0]) and arm["high"].tolist() == pytest.approx([0.0, 1.0, 2.0, 4.0])
    assert set(arm["band"]) == {"minmax"} and arm["interpolated"].all() and set(arm["n"]) == {2}
    single = curves[curves["arm"] == "single"]
    assert single["mean"].tolist() == [5.0, 6.0] and single["band"].iloc[0] == "none" and single["low"].isna().all()
    assert not single["interpolated"].any()
    # a repeated x keeps its last value (the state reached once that much was spent)
    rep = pd.DataFrame({"run_dir": ["a"] * 3 + ["b"] * 2, "x": [0.0, 10.0, 10.0, 0.0, 10.0], "y": [0.0, 1.0, 3.0, 0.0, 1.0]})
    assert aggregate_curves(rep, "x", "y", {"a": "m", "b": "m"})["mean"].tolist() == pytest.approx([0.0, 2.0])


def test_baseline_option(results, tmp_path, no_figures):
    # speedups against local SGD H=8 (modeled time to T: ddp 180 s, H8 50 s, H16 40 s)
    for baseline in ("local_sgd, H=8", "local SGD, H=8", "algo.name=local_sgd,algo.local_steps=8"):
        t = experiment_tables(results, baseline=baseline)[EXP]
        if baseline == "local_sgd, H=8":  # neither an algo.name, a label nor key=value pairs
            assert t.baseline_runs == [] and t.table["speedup_modeled"].isna().all()
            continue
        assert t.baseline_runs == ["run_h8"] and t.baseline == baseline
        assert by_run(t.table, "speedup_modeled") == pytest.approx({"run_ddp": 50 / 180, "run_h8": 1.0, "run_h16": 1.25})
        assert t.arms["arm"].tolist()[0] == "local SGD, H=8"  # the baseline first
    assert lsgd_cli(["report", str(results), "--out", str(tmp_path / "r"), "--baseline", "local SGD, H=8"]) == 0
    text = (tmp_path / "r" / "report.md").read_text()
    rows = {r["method"]: r for r in parse_markdown_tables(text)[0]}
    assert rows["local SGD, H=16"]["modeled speedup vs local SGD, H=8 (cluster above)"] == "1.25"
    assert rows["local SGD, H=16"]["wall speedup vs local SGD, H=8 (this machine)"] == "2.00"  # 50 s / 25 s
    # the wire ratio is to the same baseline: 6 rounds of H=16 / 12 of H=8; DDP's 100 / 12
    assert rows["local SGD, H=16"]["wire bytes vs local SGD, H=8"] == "0.5" and rows["DDP"]["wire bytes vs local SGD, H=8"] == "8.33"
    assert "baseline `local SGD, H=8`: 1 run." in text


def test_a_method_label_selects_its_arm_at_every_number_of_workers(tmp_path, no_figures):
    """An experiment over n writes "workers=n" into every label; `--baseline "local SGD, H=1"` then
    selects H = 1 at each n, and each arm is paired with the H = 1 arm of its own n (final accuracy
    = rate * 100: H = 1 0.90, 0.92 at n = 4 and 0.80, 0.84 at n = 16; H = 8 0.88, 0.91 and 0.70,
    0.72)."""
    root = tmp_path / "res"
    h1 = {"name": "local_sgd", "local_steps": 1, "buffer_policy": "reset"}
    h8 = {"name": "local_sgd", "local_steps": 8, "buffer_policy": "reset"}
    finals = {(4, 1): (0.0090, 0.0092), (16, 1): (0.0080, 0.0084), (4, 8): (0.0088, 0.0091), (16, 8): (0.0070, 0.0072)}
    for (world, h), rates in finals.items():
        for seed, rate in enumerate(rates):
            write_run(root, f"n{world}_h{h}_s{seed}", {**(h1 if h == 1 else h8), "seed": seed}, rate, 1.0, 1.0,
                      world=world, seed=seed)
    t = experiment_tables(root, baseline="local SGD, H=1")[EXP]
    assert sorted(t.baseline_runs) == ["n16_h1_s0", "n16_h1_s1", "n4_h1_s0", "n4_h1_s1"]
    arms = t.arms.set_index("arm")
    assert arms.loc["local SGD, H=8, workers=4", "paired_with"] == "local SGD, H=1, workers=4"
    assert arms.loc["local SGD, H=8, workers=16", "paired_with"] == "local SGD, H=1, workers=16"
    # n = 4: 0.88 - 0.90, 0.91 - 0.92 -> mean -0.015; n = 16: 0.70 - 0.80, 0.72 - 0.84 -> mean -0.11
    assert arms.loc["local SGD, H=8, workers=4", "paired_diff_final_test_acc_mean"] == pytest.approx(-0.015)
    assert arms.loc["local SGD, H=8, workers=16", "paired_diff_final_test_acc_mean"] == pytest.approx(-0.11)
    # wire bytes against the H = 1 run of the same n and seed: 12 rounds of 100 at either n (not
    # 12 rounds at n = 16 against 100 at n = 4: 2 15/16 / (2 3/4) x 0.12)
    assert arms["wire_vs_baseline_mean"].tolist() == pytest.approx([1.0, 1.0, 0.12, 0.12])
    assert by_run(t.table, "baseline_run")["n16_h8_s1"] == "n16_h1_s1"
    # a label that is not the start of one with only run-level parts after it selects nothing
    assert experiment_tables(root, baseline="local SGD, H=1, workers")[EXP].baseline_runs == []
    assert experiment_tables(root, baseline="local SGD")[EXP].baseline_runs == []


def with_label_facts(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` (one row per run, a flattened config) with each run's label facts as a launch
    writes them to labels.json and load_summaries reads them (the registry's: Algorithm.label_facts)."""
    facts = [json.dumps(ALGORITHMS[row["algo.name"]].label_facts(row.to_dict())) for _, row in frame.iterrows()]
    out = frame.assign(**{LABELS_COLUMN: facts})
    out.attrs = dict(frame.attrs)
    return out


def test_readable_labels():
    frame = pd.DataFrame(
        {
            "run_dir": list("abcdefg"),
            "run_id": list("abcdefg"),
            "algo.name": ["compressed", "compressed", "gravac", "swarm_sgd", "swarm_sgd", "ddp", "swarm_sgd"],
            "algo.compressor": ["topk", "topk", "dgc", None, None, None, None],
            "algo.cf": [10, 100, None, None, None, None, None],
            "algo.blocking": [None, None, None, True, False, None, True],
            "algo.pairing": [None, None, None, "rounds", "rounds", None, "virtual_time"],
            "seed": [0] * 7,
        }
    )
    frame.attrs["config_keys"] = ["algo.name", "algo.compressor", "algo.cf", "algo.blocking", "algo.pairing", "seed"]
    assert arm_labels(with_label_facts(frame)) == {
        "a": "compressed, top-k, CF=10", "b": "compressed, top-k, CF=100", "c": "GraVAC, DGC",
        "d": "SwarmSGD, blocking, rounds", "e": "SwarmSGD, non-blocking, rounds", "f": "DDP",
        "g": "SwarmSGD, blocking, asynchronous",
    }  # fmt: skip


def test_labels_show_what_defines_each_method():
    """Issue 24: "local SGD" and "SlowMo" hid H and "compressed" hid top-k 100x. A label writes the
    keys that tell arms apart and the keys that define the run's method (H, the compressor and its
    CF, the topology), and no key that neither varies nor defines the method."""
    from lsgd.analysis.arms import config_label, written_label_keys

    frame = pd.DataFrame(
        {
            "run_dir": list("abcdefg"),
            "algo.name": ["ddp", "local_sgd", "slowmo", "compressed", "compressed", "dpsgd", "compressed"],
            "algo.local_steps": [None, 8, 12, None, None, None, None],
            # differs between local SGD and SlowMo, but only as their defaults: neither varies it
            "algo.buffer_policy": [None, "maintain", "reset", None, None, None, None],
            "algo.compressor": [None, None, None, "topk", "powersgd", None, "fp16"],
            "algo.cf": [None, None, None, 100, 10, None, 10],
            "algo.rank": [None, None, None, 2, 2, None, 2],
            "algo.topology": [None, None, None, None, None, "ring", None],
            "optim.lr": [0.1] * 7,  # one value: never written
            "seed": [0] * 7,
        }
    )
    frame.attrs["config_keys"] = [c for c in frame.columns if c != "run_dir"]
    frame = with_label_facts(frame)
    assert arm_labels(frame) == {
        "a": "DDP", "b": "local SGD, H=8", "c": "SlowMo, H=12", "d": "compressed, top-k, CF=100",
        "e": "compressed, PowerSGD, rank=2", "f": "D-PSGD, ring", "g": "compressed, fp16",
    }  # fmt: skip
    assert written_label_keys(frame) == ["algo.name", "algo.local_steps", "algo.compressor", "algo.cf", "algo.rank",
                                         "algo.topology"]  # fmt: skip
    # a key that varies within a method is written too: H of local SGD next to its lr sweep
    two = frame.iloc[[1, 1]].assign(run_dir=["x", "y"], **{"optim.lr": [0.1, 0.2]})
    assert arm_labels(two) == {"x": "local SGD, H=8, lr=0.1", "y": "local SGD, H=8, lr=0.2"}
    # one run from its config alone (a logger's run name): the method and what defines it
    local = {"algo": {"name": "local_sgd", "local_steps": 8}, "seed": 1}
    topk = {"algo.name": "compressed", "algo.compressor": "topk", "algo.cf": 100}
    ddp = {"algo": {"name": "ddp", "bucket_cap_mb": 25}}
    assert config_label(local, extra=["seed"], facts=ALGORITHMS["local_sgd"].label_facts(local)) == "local SGD, H=8, seed=1"
    assert config_label(topk, facts=ALGORITHMS["compressed"].label_facts(topk)) == "compressed, top-k, CF=100"
    assert config_label(ddp, facts=ALGORITHMS["ddp"].label_facts(ddp)) == "DDP"
    # without facts (a run made before lsgd wrote them): plain parts, no defining keys
    assert config_label(local, extra=["seed"]) == "local_sgd, seed=1"
    # a row of load_summaries carries its facts
    assert config_label(frame.iloc[1], extra=["seed"]) == "local SGD, H=8, seed=0"


def test_a_launched_run_is_labelled_with_the_words_of_the_registry(tmp_path):
    """Issue 37: the labels come from the one registry. The launcher writes each run's label facts
    (labels.json, Algorithm.label_facts) beside its config; the report's labels read them: each
    method's registered label, its defining keys with their symbols (H, CF) and the compressor's
    registered label, so no table of method names is kept in lsgd.analysis."""
    from lsgd.config.validation import compose_config
    from lsgd.launch.launcher import write_run_config

    arms = {"ddp": ["algo=ddp"], "h8": ["algo=local_sgd", "algo.local_steps=8"],
            "topk": ["algo=compressed", "algo.compressor=topk", "algo.cf=100"],
            "swarm": ["algo=swarm_sgd", "algo.topology=ring", "algo.blocking=false"]}  # fmt: skip
    for run_id, overrides in arms.items():
        cfg = {**compose_config([*overrides, "experiment_name=launched"], check=False), "run_id": run_id}
        run_dir = tmp_path / "launched" / run_id
        run_dir.mkdir(parents=True)
        write_run_config(run_dir, cfg, world_size=4)
        (run_dir / "summary.json").write_text(json.dumps({"status": "completed", "run_id": run_id}))
        facts = json.loads((run_dir / LABELS_FILE).read_text())
        assert facts == ALGORITHMS[cfg["algo"]["name"]].label_facts(cfg)
    summaries = load_summaries(tmp_path / "launched")
    by_id = dict(zip(summaries["run_dir"], summaries["run_id"]))
    labels = {by_id[d]: lab for d, lab in arm_labels(summaries).items()}
    entry = {name: ALGORITHMS.entry(name).label for name in ("ddp", "local_sgd", "compressed", "swarm_sgd")}
    topk = ALGORITHMS["compressed"].label_facts({"algo": {"name": "compressed", "compressor": "topk"}})
    assert labels == {"ddp": entry["ddp"], "h8": f"{entry['local_sgd']}, H=8",
                      "topk": f"{entry['compressed']}, {topk['values']['algo.compressor']}, CF=100",
                      "swarm": f"{entry['swarm_sgd']}, ring, H=1"}  # fmt: skip
    assert labels == {"ddp": "DDP", "h8": "local SGD, H=8", "topk": "compressed, top-k, CF=100", "swarm": "SwarmSGD, ring, H=1"}
    # the facts are no config column: they split no arm and are no differing key
    assert LABELS_COLUMN not in summaries.attrs["config_keys"] and LABELS_COLUMN not in arm_keys(summaries)
    # a resumed run keeps its config.yaml and labels.json; one made before labels.json gets it
    h8 = tmp_path / "launched" / "h8"
    (h8 / LABELS_FILE).unlink()
    before = (h8 / "config.yaml").read_text()
    cfg = {**compose_config(["algo=local_sgd", "algo.local_steps=8", "experiment_name=launched"], check=False),
           "run_id": "h8", "resume": str(h8), "seed": 5}
    write_run_config(h8, cfg, world_size=4)
    assert (h8 / "config.yaml").read_text() == before and (h8 / LABELS_FILE).exists()


#: the arms of experiment=swarm_fmnist: its header's sweep, and docs/studies/swarmsgd.md's sweep of
#: heterogeneous workers (experiment_name=swarm_hetero, a report of its own)
SWARM_FMNIST_ARMS = ("dense", "local_sgd_h4", "dpsgd_ring", "sgp", "decentlam", "overlap_local_sgd", "swarm_h1",
                     "swarm_h1_nonblocking", "swarm_h4", "swarm_h4_nonblocking")
SWARM_HETERO_ARMS = ("dense", "swarm_h1", "swarm_h1_async", "ad_psgd_lockstep", "ad_psgd_async")


def _bundle_labels(root, experiment: str, arms) -> tuple[dict, dict]:
    """``({arm: report label}, {arm: composed config})`` of ``experiment``'s ``arms``: each composed
    with the bundle as ``lsgd train`` composes it, its run folder written as the launcher writes it,
    labelled by the report's :func:`arm_labels`."""
    from lsgd.config.validation import compose_config
    from lsgd.launch.launcher import write_run_config

    configs = {}
    for arm in arms:
        cfg = {**compose_config([f"experiment={experiment}", f"variant={arm}"], check=False), "run_id": arm}
        run_dir = root / arm
        run_dir.mkdir(parents=True)
        write_run_config(run_dir, cfg, world_size=cfg["launcher"]["nproc_per_node"])
        (run_dir / "summary.json").write_text(json.dumps({"status": "completed", "run_id": arm}))
        configs[arm] = cfg
    summaries = load_summaries(root)
    by_id = dict(zip(summaries["run_dir"], summaries["run_id"]))
    return {by_id[d]: lab for d, lab in arm_labels(summaries).items()}, configs


def test_swarm_fmnist_labels_name_each_arms_graph_and_quantizer(tmp_path):
    """Issue 42: swarm_fmnist compares SwarmSGD on the complete graph with the 8-bit lattice against
    D-PSGD on a ring (and other methods on their own graphs; the graphs stay as the study pages
    measured them): each arm's report label says its graph, and SwarmSGD's its quantizer."""
    from pathlib import Path

    from lsgd.analysis.arms import config_label
    from lsgd.core.labels import format_value
    from lsgd.core.typed_config import fields

    header = (Path(__file__).resolve().parents[2] / "conf" / "experiment" / "swarm_fmnist.yaml").read_text()
    assert f"variant={','.join(SWARM_FMNIST_ARMS)}" in header  # the arms are the bundle's own sweep
    for name, arms in (("swarm_fmnist", SWARM_FMNIST_ARMS), ("swarm_hetero", SWARM_HETERO_ARMS)):
        labels, configs = _bundle_labels(tmp_path / name, "swarm_fmnist", arms)
        assert len(set(labels.values())) == len(labels), labels
        for arm, cfg in configs.items():
            parts, algo = labels[arm].split(", "), cfg["algo"]
            if "topology" in fields(ALGORITHMS[algo["name"]].Config):  # a method on a graph says which
                assert algo["topology"] in parts, (arm, labels[arm])
            if algo.get("quantizer") == "lattice":
                assert f"{format_value(algo['bits'])}-bit lattice" in parts, (arm, labels[arm])
        if name == "swarm_fmnist":
            assert labels["swarm_h1"] == "SwarmSGD, complete, H=1, 8-bit lattice, blocking"
            assert labels["swarm_h4_nonblocking"] == "SwarmSGD, complete, H=4, 8-bit lattice, non-blocking"
            assert labels["dpsgd_ring"] == "D-PSGD, ring" and labels["decentlam"] == "DecentLaM, ring"
            assert labels["dense"] == "DDP"
    # the same words name one run alone (a logger's run name)
    swarm = configs["swarm_h1"]
    alone = config_label(swarm, facts=ALGORITHMS["swarm_sgd"].label_facts(swarm))
    assert alone == "SwarmSGD, complete, H=1, 8-bit lattice"
    plain = {"algo": {"name": "swarm_sgd", "topology": "ring", "quantizer": "none"}}
    assert ALGORITHMS["swarm_sgd"].label_facts(plain)["values"]["algo.quantizer"] == "unquantized"
    assert config_label(plain, facts=ALGORITHMS["swarm_sgd"].label_facts(plain)) == "SwarmSGD, ring"

def test_a_run_made_before_labels_json_is_labelled_with_plain_key_value_parts(tmp_path):
    """A run folder without labels.json (made before lsgd wrote it): its labels are plain parts, the
    method's name as it is and every key as its last dotted part, and no defining keys; an arm that
    has a run with facts is labelled by them (its seeds share one label)."""
    root = tmp_path / "results"
    for run in (DDP, H8, H16):
        write_run(root, *run, labels=False)
    s = load_summaries(root)
    assert s[LABELS_COLUMN].isna().all()
    labels = {r: lab for r, lab in zip(s["run_id"], s["run_dir"].map(arm_labels(s)))}
    assert labels == {"run_ddp": "ddp", "run_h8": "local_sgd, local steps=8", "run_h16": "local_sgd, local steps=16"}
    t = experiment_tables(root)[EXP]
    assert sorted(t.arms["arm"]) == ["ddp", "local_sgd, local steps=16", "local_sgd, local steps=8"]
    assert t.label_names == {"algo.local_steps": "local steps"}
    # no defining keys without facts: local SGD's H is written only where it tells arms apart
    only = tmp_path / "one"
    write_run(only, *H8, labels=False)
    write_run(only, *DDP, labels=False)
    assert sorted(arm_labels(load_summaries(only)).values()) == ["ddp", "local_sgd"]
    # a second seed of H8 made after the change: the arm keeps one label, the facts' words
    write_run(root, "run_h8_s1", H8[1], *H8[2:], seed=1)
    s = load_summaries(root)
    labels = {r: lab for r, lab in zip(s["run_id"], s["run_dir"].map(arm_labels(s)))}
    assert labels["run_h8"] == labels["run_h8_s1"] == "local SGD, H=8"
    assert labels["run_ddp"] == "ddp" and labels["run_h16"] == "local_sgd, H=16"  # the key's name: the report's symbol


# -- environment.json: what produced the runs ------------------------------------------------------
def environment(torch="2.14.1", commit="a" * 40, dirty=False, cap="AVX512", gpus=(), device="cpu", **extra):
    """One session of environment.json as lsgd.training.provenance writes it (the keys the report reads)."""
    return {
        "session": "start", "started_at": "2026-01-01T00:00:00+00:00",
        "lsgd": {"version": "0.1.0", "path": "/src/lsgd", "commit": commit, "commit_short": commit[:7], "dirty": dirty},
        "python": {"version": "3.11.7", "implementation": "CPython"}, "hostname": "node1",
        "torch": {"version": torch, "cpu_capability": cap}, "cpu": {"model": "Intel Xeon", "count": 8},
        "gpus": [{"name": g} for g in gpus], "distributed": {"device": device, "backend": "gloo", "world_size": 4},
        **extra,
    }  # fmt: skip


def test_report_lists_the_environment_and_names_the_groups_that_differ(results, tmp_path, no_figures):
    # run_ddp and a second seed of H=8 on torch 2.14.1 at commit aaaaaaa; run_h8 on torch 2.15.0 at a
    # dirty bbbbbbb on two GPUs; run_h16 made before environment.json
    write_run(results, "run_h8s1", *H8[1:], seed=1)
    envs = {"run_ddp": environment(), "run_h8s1": environment(),
            "run_h8": environment("2.15.0", "b" * 40, dirty=True, gpus=["NVIDIA H100"] * 2, device="cuda")}  # fmt: skip
    for run, env in envs.items():
        (results / EXP / run / "environment.json").write_text(json.dumps(env))
    summ = load_summaries(results).set_index("run_id")
    assert summ.loc["run_h8", "env.commit"] == "bbbbbbb+dirty" and summ.loc["run_ddp", "env.commit"] == "aaaaaaa"
    assert summ.loc["run_h8", "env.gpu"] == "2 x NVIDIA H100" and summ.loc["run_ddp", "env.gpu"] == "none"
    assert summ.loc["run_h8", "env.torch"] == "2.15.0" and summ.loc["run_ddp", "env.cpu_capability"] == "AVX512"
    assert summ.loc["run_h16", ["env.commit", "env.torch", "env.cpu"]].isna().all()  # no file: not an error
    assert not any(k.startswith("env.") for k in summ.attrs["config_keys"])

    text = write_report(results, tmp_path / "r").read_text()
    line = ("**The runs differ in their environment:** 2 torch versions: 2.14.1 (2 runs), 2.15.0 (1 run), - (1 run); "
            "2 commits: aaaaaaa (2 runs), bbbbbbb+dirty (1 run), - (1 run); 1 run without environment.json.")  # fmt: skip
    assert text.splitlines()[4] == line  # at the top, under the line that counts the runs
    assert text.count(line) == 2  # and in the experiment's environment section
    tables = parse_markdown_tables(text)
    details, env_table = tables[1], tables[2]
    # the environment does not split arms: H=8's two seeds stay one arm
    assert [(r["method"], r["n"]) for r in details] == [("DDP", "1"), ("local SGD, H=8", "2"), ("local SGD, H=16", "1")]
    assert env_table == [
        {"runs": "2", "commit": "aaaaaaa", "lsgd": "0.1.0", "torch": "2.14.1", "CPU capability": "AVX512",
         "CPU": "Intel Xeon", "GPU": "none", "python": "3.11.7", "run ids": "run_ddp, run_h8s1"},
        {"runs": "1", "commit": "-", "lsgd": "-", "torch": "-", "CPU capability": "-", "CPU": "-", "GPU": "-",
         "python": "-", "run ids": "run_h16"},
        {"runs": "1", "commit": "bbbbbbb+dirty", "lsgd": "0.1.0", "torch": "2.15.0", "CPU capability": "AVX512",
         "CPU": "Intel Xeon", "GPU": "2 x NVIDIA H100", "python": "3.11.7", "run ids": "run_h8"},
    ]  # fmt: skip
    runs_csv = pd.read_csv(tmp_path / "r" / f"{EXP}_runs.csv").set_index("run_id")
    assert runs_csv.loc["run_h8", "env.torch"] == "2.15.0" and pd.isna(runs_csv.loc["run_h16", "env.commit"])

    # one environment for all: one line with the shared values, one row for all runs
    for run in ("run_h8", "run_h16"):
        (results / EXP / run / "environment.json").write_text(json.dumps(environment()))
    text = write_report(results, tmp_path / "same").read_text()
    assert "Environment: torch 2.14.1, commit aaaaaaa, CPU capability AVX512 (all 4 runs)." in text
    assert "differ in their environment" not in text
    assert parse_markdown_tables(text)[2][0]["run ids"] == "all"
    # no run with environment.json: one line, no table
    for run in ("run_ddp", "run_h8", "run_h8s1", "run_h16"):
        (results / EXP / run / "environment.json").unlink()
    text = write_report(results, tmp_path / "none").read_text()
    assert "Environment: not recorded (no environment.json in the 4 runs" in text and "### Environment" not in text


def test_a_run_resumed_under_another_torch_and_commit_shows_both(tmp_path):
    run = write_run(tmp_path, "run_resumed", *DDP[1:])
    env = environment(resumed=[{**environment("2.15.0", "c" * 40), "session": "resume"},
                               {**environment("2.15.0", "c" * 40, cap="AVX2"), "session": "resume"}])  # fmt: skip
    (run / "environment.json").write_text(json.dumps(env))
    (row,) = load_summaries(run).to_dict("records")
    assert row["env.torch"] == "2.14.1 → 2.15.0" and row["env.commit"] == "aaaaaaa → ccccccc"
    assert row["env.cpu_capability"] == "AVX512 → AVX2" and row["env.lsgd"] == "0.1.0"
    # an unreadable file is reported and read as none
    (run / "environment.json").write_text("{not json")
    with pytest.warns(UserWarning, match="environment.json: unreadable"):
        (row,) = load_summaries(run).to_dict("records")
    assert row["env.torch"] is None


def test_a_curve_at_zero_bytes_is_drawn_on_the_log_bytes_axis(tmp_path, monkeypatch):
    """An arm that never communicates (wire_bytes 0 at every record) is drawn, not dropped by the
    log axis: the axis becomes symmetric-log, linear below the smallest nonzero byte count (issue 24)."""
    import pandas as pd

    from lsgd.analysis import plots

    rows = []
    for run, scale in (("a", 1e6), ("b", 0.0)):
        for step in (10, 20, 30):
            rows.append({"run_dir": run, "step": step, "wire_bytes": step * scale, "test_acc": 0.5 + step / 100,
                         "modeled_time_s": step, "wall_time_s": step})
    figures = {}
    monkeypatch.setattr(plots, "_save", lambda fig, path: figures.setdefault(path.name, fig) and [path])
    plots.plot_experiment(pd.DataFrame(rows), {"a": "ddp", "b": "DiLoCo, H=100"}, tmp_path, "x_")
    ax = figures["x_test_acc_vs_wire_bytes"].axes[0]
    assert ax.get_xscale() == "symlog"
    assert ax.get_title() == ""  # the report's caption names the figure, as a paper's does
    drawn = {line.get_label().split(" (n=")[0]: list(line.get_xdata()) for line in ax.get_lines()}
    assert drawn["DiLoCo, H=100"] == [0.0, 0.0, 0.0] and drawn["ddp"] == [1e7, 2e7, 3e7]


# -- figures a paper can use (issue 24) ------------------------------------------------------------
def _capture_figures(monkeypatch) -> dict:
    """Replace plots._save: {file stem: Figure} of every figure drawn, nothing written."""
    figures = {}
    monkeypatch.setattr("lsgd.analysis.plots._save", lambda fig, stem: figures.setdefault(stem.name, fig) and [])
    return figures


def _lines(ax) -> dict:
    """{arm label without its "(n=...)": Line2D} of an axes' solid arm lines."""
    return {line.get_label().split(" (n=")[0]: line for line in ax.get_lines() if not line.get_label().startswith("_")}


def test_consensus_distance_breaks_where_a_point_is_missing(tmp_path, monkeypatch):
    """The line breaks at an evaluation that has no consensus distance (or 0, not drawable on the log
    axis) instead of joining its neighbours: the straight segment looked like a measured V."""
    from lsgd.analysis import plots

    # consensus at the evaluations (every 10 steps): none at step 30, 0 at step 50 (replicas equal)
    at_eval = {10: 0.4, 20: 0.2, 30: None, 40: 0.1, 50: 0.0, 60: 0.05}
    rows = []
    for run, scale in (("s0", 1.0), ("s1", 2.0)):  # two seeds of one arm: the mean is 1.5 x at_eval
        for step in range(5, 65, 5):
            rec = {"run_dir": run, "step": step, "train_loss": 1.0}
            if step % 10 == 0:
                rec.update(test_loss=1.0, test_acc=step / 100)
                if at_eval[step] is not None:
                    rec["consensus_distance"] = at_eval[step] * scale
            rows.append(rec)
    # a run that measures it at every record (consensus_every_record), missing at step 25 only
    for step in range(5, 65, 5):
        rows.append({"run_dir": "every", "step": step, "train_loss": 1.0,
                     **({} if step == 25 else {"consensus_distance": 1.0 / step}),
                     **({"test_loss": 1.0, "test_acc": 0.5} if step % 10 == 0 else {})})  # fmt: skip
    figures = _capture_figures(monkeypatch)
    plots.plot_experiment(pd.DataFrame(rows), {"s0": "SwarmSGD", "s1": "SwarmSGD", "every": "D-PSGD"}, tmp_path, "x_")
    ax = figures["x_consensus_distance_vs_step"].axes[0]
    lines = _lines(ax)
    swarm = lines["SwarmSGD"]
    assert list(swarm.get_xdata()) == [10, 20, 30, 40, 50, 60]
    expected = [1.5 * v if v else math.nan for v in at_eval.values()]
    assert list(swarm.get_ydata()) == pytest.approx(expected, nan_ok=True)
    assert swarm.get_marker() == "o"  # the point between the two gaps (step 40) still shows
    every = lines["D-PSGD"]
    assert list(every.get_xdata()) == list(range(5, 65, 5))
    assert [math.isnan(v) for v in every.get_ydata()] == [step == 25 for step in range(5, 65, 5)]
    # the min-max band of the two seeds breaks at the same points
    band = ax.collections[0].get_paths()
    assert len(band) == 3  # steps 10-20, 40 alone, 60 alone


def test_an_arm_has_one_color_in_every_figure_and_experiment(tmp_path, monkeypatch):
    """Two experiments (a study's two levels), the second without DDP: local SGD and SlowMo keep
    their colors; in the bytes-per-worker-vs-workers figure each method has the color of its arms'
    first (in the figures' order)."""
    root = tmp_path / "res"
    for exp, runs in (("level_a", (DDP, H8, H16)), ("level_b", (H8, H16))):
        for run in runs:
            write_run(root, f"{exp}_{run[0]}", *run[1:], experiment=exp)
    for world in (4, 8):
        write_run(root, f"ddp_{world}", {"name": "ddp"}, 0.01, 0.5, 0.5, world=world, experiment="scaling")
        write_run(root, f"h8_{world}", {"name": "local_sgd", "local_steps": 8}, 0.01, 0.5, 0.5, world=world,
                  experiment="scaling", bytes_per_round=PARAM_BYTES // 8)  # fmt: skip
    figures = _capture_figures(monkeypatch)
    plot_runs(root, tmp_path / "plots")
    colors: dict[str, set] = {}
    for stem, fig in figures.items():
        if stem.endswith("vs_nodes"):
            continue
        for arm, line in _lines(fig.axes[0]).items():
            colors.setdefault(arm, set()).add(tuple(line.get_color()))
    assert {arm for arm in colors if "workers" not in arm} == {"DDP", "local SGD, H=8", "local SGD, H=16"}
    assert all(len(c) == 1 for c in colors.values())  # one color per arm, whatever the figure or experiment
    assert len({next(iter(c)) for c in colors.values()}) == len(colors)  # distinct arms, distinct colors
    scaling = {c.get_label().split(" (n=")[0]: c.lines[0] for c in figures["scaling_wire_bytes_per_step_vs_nodes"].axes[0].containers}
    assert sorted(scaling) == ["DDP", "local SGD, H=8"]
    for method, line in scaling.items():
        arms = [a for a in colors if a.startswith(method + ", workers=")]
        assert len(arms) == 2 and tuple(line.get_color()) in {next(iter(colors[a])) for a in arms}


@pytest.mark.parametrize("width, inches", [("one", 3.25), ("two", 6.75)])
def test_paper_widths_give_figures_exactly_one_or_two_columns_wide(results, tmp_path, width, inches):
    """--width one / two: the PDF page is exactly 3.25 / 6.75 in wide (ICML's column and text
    widths) with TrueType fonts, the PNG that many inches at 300 dpi, no text under 7 pt at that
    size, and the legend inside the page."""
    from matplotlib.text import Text

    from lsgd.analysis import plots

    write_run(results, "run_slowmo", {"name": "slowmo", "local_steps": 12}, 0.0087, 0.5, 0.5)
    figures = {}
    real_save = plots._save

    def save(fig, stem):  # one figure's files written (the others only drawn: a cheaper test)
        figures[stem.name] = fig
        return real_save(fig, stem) if stem.name.endswith("test_acc_vs_wire_bytes") else []

    import unittest.mock

    with unittest.mock.patch.object(plots, "_save", save):
        files = plot_runs(results, tmp_path / "p", width=width)
    pdfs = [p for p in files if p.suffix == ".pdf"]
    assert len(figures) == len(FIGURES) and len(pdfs) == 1
    for pdf in pdfs:
        box = re.search(rb"/MediaBox \[\s*0 0 ([\d.]+) ([\d.]+)\s*\]", pdf.read_bytes())
        assert float(box.group(1)) == pytest.approx(72 * inches, abs=0.01), pdf.name  # points
        fonts = set(re.findall(rb"/Subtype /(\w+)", pdf.read_bytes()))
        assert b"Type3" not in fonts and b"CIDFontType2" in fonts  # TrueType, as IEEE / ACM checks want
    from PIL import Image

    for png in (p for p in files if p.suffix == ".png"):
        assert Image.open(png).size[0] == round(300 * inches)
    for stem, fig in figures.items():
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        canvas = FigureCanvasAgg(fig)
        canvas.draw()
        renderer = canvas.get_renderer()
        texts = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
        assert min(t.get_fontsize() for t in texts) >= 7, stem
        page = fig.bbox
        for legend in fig.legends:
            box = legend.get_window_extent(renderer)
            assert page.x0 - 1 <= box.x0 and box.x1 <= page.x1 + 1 and page.y0 - 1 <= box.y0, stem
        ax_box = fig.axes[0].get_window_extent(renderer)
        assert ax_box.height / fig.dpi >= 1.5 and ax_box.width / fig.dpi >= 0.6 * inches, stem
    with pytest.raises(ValueError, match="one, two"):
        plot_runs(results, tmp_path / "bad", width="three")


def test_default_figure_size_is_unchanged(results, tmp_path, monkeypatch):
    figures = _capture_figures(monkeypatch)
    plot_runs(results, tmp_path / "p")
    assert {tuple(fig.get_size_inches()) for fig in figures.values()} == {(7.0, 4.5)}
    assert all(fig.get_layout_engine() is None for fig in figures.values())  # cropped tight on save


def test_bytes_axis_is_the_workers_own_bytes_in_a_run_with_a_server(tmp_path, monkeypatch):
    """A parameter-server run (1 server + 2 workers): its records' wire_bytes averages the server's N
    messages per step in; the bytes figure's x is wire_bytes_workers, what one worker put on the
    wire, as the report's bytes column (issue 22 item 6; wire bytes since issue 42). A server run
    that lacks it is left out with a warning."""
    n = PARAM_BYTES
    ps = write_run(tmp_path / "r", "ps", {"name": "param_server"}, 0.009, 1.0, 1.0, world=3)
    lines = [json.loads(line) for line in (ps / "metrics.jsonl").read_text().splitlines()]
    for rec in lines:  # per step: the server sends 2 n, each worker n -> all-rank mean 4n/3, workers' n
        rec["wire_bytes"] = rec["step"] * 4 * n / 3
        rec["wire_bytes_workers"] = rec["step"] * n
    (ps / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    summary = json.loads((ps / "summary.json").read_text())
    (ps / "summary.json").write_text(json.dumps({**summary, "num_workers": 2}))
    write_run(tmp_path / "r", "ddp", {"name": "ddp"}, 0.009, 1.0, 1.0, world=2)
    old = write_run(tmp_path / "r", "old_ps", {"name": "param_server"}, 0.009, 1.0, 1.0, world=3)
    figures = _capture_figures(monkeypatch)
    with pytest.warns(UserWarning, match="old_ps"):
        plot_runs(tmp_path / "r", tmp_path / "p")
    lines = _lines(figures[f"{EXP}_test_acc_vs_wire_bytes"].axes[0])
    steps = list(range(EVAL_EVERY, STEPS + 1, EVAL_EVERY))
    by_label = {lab: line for lab, line in lines.items()}
    ps_line = next(line for lab, line in by_label.items() if "world" not in lab and lab.startswith("parameter server"))
    assert list(ps_line.get_xdata()) == [step * n for step in steps]  # not 4n/3 per step
    # every rank a worker: wire_bytes (write_run's ring all-reduce: 2 (p-1)/p of the payload, p = 2)
    assert list(by_label["DDP"].get_xdata()) == [step * n for step in steps]
    assert len(by_label) == 2 and old.exists()  # the run without wire_bytes_workers is not drawn


#: Debian's Chromium (package ``chromium``; `make test` installs it as root), started as the machine
#: notes say: headless, no sandbox (root), nothing that reaches the network.
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars", "--force-device-scale-factor=1"]  # fmt: skip

#: Injected into a copy of report.html: once the page has loaded, each image and table records its
#: box in page pixels and each image its decoded (natural) size, for --dump-dom to print.
PROBE = """<script>
window.addEventListener("load", () => {
  for (const el of document.querySelectorAll("img, table")) {
    const r = el.getBoundingClientRect();
    el.setAttribute("data-box", [r.left, r.top + window.scrollY, r.width, r.height].map(Math.round).join(","));
    if (el.tagName === "IMG") el.setAttribute("data-natural", el.naturalWidth + "x" + el.naturalHeight);
  }
  document.body.setAttribute("data-probed", "1");
});
</script>"""


def chromium(tmp_path, *args) -> str:
    import shutil
    import subprocess
    import tempfile

    exe = shutil.which("chromium")
    if exe is None:
        pytest.fail("Debian's chromium is not installed: `make test` installs it as root "
                    "(apt-get install chromium), or install it yourself")  # fmt: skip
    profile = tempfile.mkdtemp(dir=tmp_path)  # a new empty profile per start
    res = subprocess.run([exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args], capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout


def test_report_html_is_self_contained_and_renders_in_chromium(results, tmp_path):
    """report.html beside report.md: one page with the tables and the figures (embedded, no other
    file needed), written atomically; headless Chromium loads it, decodes every figure at the PNG's
    own size, and its screenshot shows the first table's text and the first figure's colored lines."""
    import base64
    from html.parser import HTMLParser

    import numpy as np
    from PIL import Image

    out = tmp_path / "report"
    write_report(results, out)
    page = (out / "report.html").read_text()
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]  # no temporary file left

    class Parts(HTMLParser):
        def __init__(self):
            super().__init__()
            self.imgs, self.tables, self.scripts, self.links, self.cells, self._cell = [], 0, 0, [], [], None

        def handle_starttag(self, tag, attrs):
            attrs = dict(attrs)
            if tag == "img":
                self.imgs.append(attrs["src"])
            self.tables += tag == "table"
            self.scripts += tag == "script"
            if tag == "link":
                self.links.append(attrs)
            if tag in ("td", "th"):
                self._cell = ""

        def handle_data(self, data):
            if self._cell is not None:
                self._cell += data

        def handle_endtag(self, tag):
            if tag in ("td", "th"):
                self.cells.append(self._cell.strip())
                self._cell = None

    parts = Parts()
    parts.feed(page)
    md = (out / "report.md").read_text()
    pngs = re.findall(r"!\[[^\]]*\]\((figures/[^)]+\.png)\)", md)
    assert len(pngs) == len(FIGURES) and parts.tables == len(parse_markdown_tables(md)) == 2
    assert parts.scripts == 0 and parts.links == []  # nothing loaded from elsewhere
    # each figure embedded as its PNG file's own bytes, in the report's order
    prefix = "data:image/png;base64,"
    assert all(src.startswith(prefix) for src in parts.imgs) and len(parts.imgs) == len(pngs)
    assert [base64.b64decode(src[len(prefix):]) for src in parts.imgs] == [(out / p).read_bytes() for p in pngs]
    main = parse_markdown_tables(md)[0]
    for row in main:  # the main table's cells, as in report.md
        assert all(cell.replace("\\|", "|") in parts.cells for cell in row.values())

    # rendered: every image decoded at its PNG's size; boxes of the images and tables
    (out / "probe.html").write_text(page.replace("</body>", PROBE + "</body>"))
    dom = chromium(tmp_path, "--window-size=1200,1600", "--virtual-time-budget=5000", "--dump-dom",
                   (out / "probe.html").as_uri())  # fmt: skip
    assert 'data-probed="1"' in dom
    natural = re.findall(r'data-natural="(\d+)x(\d+)"', dom)
    assert [(int(w), int(h)) for w, h in natural] == [Image.open(out / p).size for p in pngs]
    boxes = [tuple(map(int, b.split(","))) for b in re.findall(r'data-box="([-\d,]+)"', dom)]
    table_box, image_box = boxes[0], boxes[2]  # the main table, the first figure
    assert table_box[2] > 300 and table_box[3] > 20 * (len(main) + 1) and image_box[3] > 200

    bottom = image_box[1] + image_box[3] + 20
    shot = tmp_path / "shot.png"
    chromium(tmp_path, f"--window-size=1200,{bottom}", f"--screenshot={shot}", (out / "report.html").as_uri())
    pixels = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    assert pixels.shape[:2] == (bottom, 1200)

    def region(box):
        x, y, w, h = box
        return pixels[y : y + h, x : x + w]

    table = region(table_box)
    assert (table.max(axis=2) < 90).sum() > 500  # its text
    figure = region(image_box)
    colored = (figure.max(axis=2) - figure.min(axis=2)) > 100  # the arms' lines (tab10), not gray text
    assert colored.sum() > 1000
    assert (pixels[:, :, :].std() > 20)  # not a blank page

    # every figure at its print size: the default ones at 150 dpi, so a PNG n px wide is n / 150 in,
    # n / 150 * 96 CSS px (CSS: 1 in = 96 px); within the 1200 px window none is capped
    shown = rendered_images(dom)
    assert [natural for _, natural in shown] == [Image.open(out / p).size for p in pngs]
    for box, (w, _) in shown:
        assert abs(box[2] - w / 150 * 96) <= 1, (box, w)


#: --width one / two: 3.25 in and 6.75 in, in CSS px (96 per inch)
PRINT_PX = {"one": 3.25 * 96, "two": 6.75 * 96}


def rendered_images(dom: str) -> list[tuple[tuple[int, ...], tuple[int, int]]]:
    """(box, natural size) of every image of a page PROBE ran in, in page order."""
    found = re.findall(r"<img [^>]*>", dom)
    out = []
    for tag in found:
        box = tuple(map(int, re.search(r'data-box="([-\d,]+)"', tag).group(1).split(",")))
        natural = tuple(map(int, re.search(r'data-natural="(\d+)x(\d+)"', tag).groups()))
        out.append((box, natural))
    return out


@pytest.mark.parametrize("width", ["one", "two"])
def test_report_html_shows_paper_figures_at_their_print_width(results, tmp_path, width):
    """`--width one|two`: report.html shows each figure as wide as the paper prints it, 3.25 in
    (312 CSS px) or 6.75 in (648 CSS px), not at its 300 dpi pixel width (975 / 2025 px, which
    showed a one-column figure three times too big); measured in headless Chromium."""
    from PIL import Image

    out = tmp_path / "report"
    write_report(results, out, width=width)
    pngs = re.findall(r"!\[[^\]]*\]\((figures/[^)]+\.png)\)", (out / "report.md").read_text())
    (out / "probe.html").write_text((out / "report.html").read_text().replace("</body>", PROBE + "</body>"))
    dom = chromium(tmp_path, "--window-size=1200,1600", "--virtual-time-budget=5000", "--dump-dom",
                   (out / "probe.html").as_uri())  # fmt: skip
    shown = rendered_images(dom)
    assert len(shown) == len(pngs) == len(FIGURES)
    for (box, (w, h)), png in zip(shown, pngs):
        assert (w, h) == Image.open(out / png).size and w == round(PRINT_PX[width] / 96 * 300)  # 300 dpi
        assert abs(box[2] - PRINT_PX[width]) <= 1, (png, box)
        assert abs(box[3] - PRINT_PX[width] * h / w) <= 1, (png, box)  # the aspect ratio kept


def test_width_option_of_lsgd_plot_and_report(results, tmp_path, monkeypatch, capsys):
    """`lsgd plot|report --width one|two` reaches the figures; another value is refused by argparse."""
    seen = []
    monkeypatch.setattr("lsgd.analysis.report.plot_frames", lambda *a, width=None, **k: seen.append(width) or {})
    monkeypatch.setattr("lsgd.analysis.plots.plot_frames", lambda *a, width=None, **k: seen.append(width) or {})
    assert lsgd_cli(["report", str(results), "--out", str(tmp_path / "r"), "--width", "two"]) == 0
    assert (tmp_path / "r" / "report.html").exists() and "report.html" in capsys.readouterr().out
    assert lsgd_cli(["plot", str(results), "--out", str(tmp_path / "p"), "--width", "one"]) == 0
    assert lsgd_cli(["plot", str(results), "--out", str(tmp_path / "p")]) == 0
    assert seen == ["two", "one", None]
    with pytest.raises(SystemExit):
        lsgd_cli(["plot", str(results), "--width", "three"])
    assert "invalid choice: 'three'" in capsys.readouterr().err


@pytest.mark.filterwarnings("ignore:bytes per worker")  # the fake records carry no wire_bytes_workers
def test_bytes_per_worker_vs_workers_counts_the_workers_of_a_server_run(tmp_path, monkeypatch):
    """Parameter-server runs of 1 server + 2 and 1 + 4 workers: the scaling figure puts them at 2 and
    4 workers with what one worker puts on the wire per step (n per step: its gradient), not at 3 and
    5 ranks with the all-rank mean (the server's N messages averaged in)."""
    n = PARAM_BYTES
    for workers in (2, 4):
        run = write_run(tmp_path / "r", f"ps{workers}", {"name": "param_server"}, 0.009, 1.0, 1.0, world=workers + 1)
        summary = json.loads((run / "summary.json").read_text())
        summary.update(num_workers=workers, wire_bytes=STEPS * (workers * n + workers * n) / (workers + 1),
                       wire_bytes_workers=STEPS * n)  # fmt: skip
        (run / "summary.json").write_text(json.dumps(summary))
    figures = _capture_figures(monkeypatch)
    plot_runs(tmp_path / "r", tmp_path / "p")
    (container,) = figures[f"{EXP}_wire_bytes_per_step_vs_nodes"].axes[0].containers
    line = container.lines[0]
    assert list(line.get_xdata()) == [2, 4] and list(line.get_ydata()) == [n, n]


def test_suboptimality_table_compares_the_runs_at_equal_server_iterations(tmp_path):
    """lsgd.analysis.suboptimality (scripts/adsaga_table.py): f - f* at the smallest final iteration
    count among the runs, log-linear between records: 10^-1.5 halfway between 10^-1 and 10^-2."""
    from lsgd.analysis.suboptimality import at_iterations, load, suboptimality_table

    for run, arm, its, gaps in (("a", "async", (10, 20, 30), (1e-1, 1e-2, 1e-3)), ("b", "sync", (10, 25), (1e-1, 1e-4))):
        d = tmp_path / run
        d.mkdir()
        (d / "config.yaml").write_text(yaml.safe_dump({"seed": 0, "study": {"arm": arm}, "optim": {"lr": 0.5}}))
        recs = [{"step": i, "iterations": it, "gradients": 4 * it, "suboptimality": g, "comm_bytes": 2e6 * i,
                 "modeled_time_s": 0.5 * i} for i, (it, g) in enumerate(zip(its, gaps), 1)]
        recs.insert(1, {"kind": "adsaga_step", "step": 1})  # per-step rows are left out
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    runs = load(tmp_path)
    assert [r["arm"] for r in runs] == ["async", "sync"] and [len(r["records"]) for r in runs] == [3, 2]
    assert at_iterations(runs[0]["records"], 15) == pytest.approx(10**-1.5)
    lines = suboptimality_table(runs).splitlines()
    assert "f - f* at 25 iterations" in lines[0] and len(lines) == 4
    # async at 25 iterations: 10^-2.5, between its records at 20 and 30; its final: 1e-3 at 30
    assert lines[2] == "| async | 0 | 0.5 | 1.000e-03 | 3.162e-03 | 30 | 120 | 6.0 / 6.0 | 1.500 | nan |"
    assert lines[3].startswith("| sync | 0 | 0.5 | 1.000e-04 | 1.000e-04 | 25 | 100 | 4.0 / 4.0 |")


# -- what a report's numbers are (issue 42: a newcomer's first hour; issue 40: peak bytes) ---------
def patch_summary(run_dir, **fields):
    path = run_dir / "summary.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


def patch_records(run_dir, fn):
    """Rewrite every regular record of run_dir's metrics.jsonl with fn(record)."""
    path = run_dir / "metrics.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps(r if "kind" in r else fn(r)) + "\n" for r in lines))


#: A target cluster as config.yaml writes it: an h100 preset at the default MFU, 4 workers per node,
#: a 10 Gbps / 10 us inter-node link with 2 ports, what-if links at 1 and 100 Gbps.
H100 = {"compute": "profile", "device": "h100", "mfu": None, "step_time_s": None, "speeds": None, "gpus_per_node": 4}
NET10 = {"name": "10gbps", "bandwidth_gbps": 10, "latency_us": 10, "wire_overhead": None, "ports": 2,
         "intra_node": {"bandwidth_gbps": 2400, "latency_us": 2}, "report_gbps": [1, 100]}  # fmt: skip
H100_TEXT = ("compute: `h100` preset at MFU 0.4; 4 workers / node (intra-node link 2400 Gbps, 2 us latency); "
             "inter-node link 10 Gbps, 10 us latency, 2 ports (`network.ports`); what-if links 1 Gbps (50 us), "
             "100 Gbps (2 us)")  # fmt: skip


def test_the_report_names_the_modeled_cluster_of_every_modeled_number(tmp_path, monkeypatch):
    """issue 42 item 1: the header names the cluster that modeled time models (compute preset and MFU,
    workers per node, the inter-node link and its ports, the what-if links), read from each run's
    config.yaml (a null cluster.mfu: the MFU summary.json's profile applied); the modeled-time
    figure's caption and axis name it too; the modeled speedup has the wall speedup beside it.
    Where arms differ in cluster, each arm's is named."""
    root = tmp_path / "res"
    for run in (DDP, H8):
        d = write_run(root, *run, cluster=H100, network=NET10)
        patch_summary(d, profile_mode="profile", profile_device="h100", profile_mfu=0.4)
    write_run(root, "run_h8_running", {**H8[1], "local_steps": 4}, 0.008, 0.5, 0.5, cluster=H100, network=NET10,
              with_summary=False)  # no summary (no profile_mfu): the same cluster all the same  # fmt: skip
    write_run(root, "run_h2", {**H8[1], "local_steps": 2}, 0.008, 0.5, 0.5, cluster={**H100, "mfu": 0.4},
              network=NET10)  # the MFU the others' default gives, written out: the same cluster  # fmt: skip
    text = write_report(root, tmp_path / "r").read_text()
    header = text[: text.index("## Definitions")]
    assert f"**Modeled cluster** (what every modeled time and modeled speedup below models): {H100_TEXT}." in header
    main = parse_markdown_tables(text)[0]
    columns = list(main[0])
    assert columns.index(WALL) == columns.index(MODELED) + 1  # beside it, named
    rows = {r["method"]: r for r in main}
    assert rows["local SGD, H=8"][MODELED] == "3.60" and rows["local SGD, H=8"][WALL] == "1.80"  # HAND_SPEEDUP
    captions = [line for line in text.splitlines() if line.startswith(f"*{EXP}: ")]
    modeled = [c for c in captions if "modeled time" in c]
    assert len(modeled) == 1 and f"Modeled cluster: {H100_TEXT}." in modeled[0]
    assert not any("Modeled cluster" in c for c in captions if c not in modeled)
    svg = (tmp_path / "r" / "figures" / f"{EXP}_test_acc_vs_modeled_time_s.svg").read_text()
    assert "modeled time on the modeled cluster (s)" in svg and "h100 at MFU 0.4, 4 workers / node, 10 Gbps, 10 us" in svg

    # arms on different clusters: each named; a run made before cluster.* says so
    monkeypatch.setattr("lsgd.analysis.report.plot_frames", lambda *args, **kwargs: {})
    write_run(root, "run_h16", *H16[1:], cluster={**H100, "step_time_s": 0.05}, network={**NET10, "bandwidth_gbps": 100})
    write_run(root, "run_measured", {**H8[1], "local_steps": 32}, 0.008, 0.5, 0.5, cluster={**H100, "compute": "measured"},
              network=NET10)  # fmt: skip
    write_run(root, "run_old", {**H8[1], "local_steps": 64}, 0.008, 0.5, 0.5)
    text = write_report(root, tmp_path / "r2").read_text()
    header = text[: text.index("## Definitions")]
    assert "the arms differ, each on its own:" in header
    assert f"- `{EXP}`: DDP, local SGD, H=2, local SGD, H=4 (running), local SGD, H=8: {H100_TEXT}." in header
    assert ("- `fmnist_demo`: local SGD, H=16: compute: 50 ms / step (`cluster.step_time_s`); 4 workers / node "
            "(intra-node link 2400 Gbps, 2 us latency); inter-node link 100 Gbps, 10 us latency") in header  # fmt: skip
    assert "local SGD, H=32: compute: measured on the machine that ran it (`cluster.compute=measured`)" in header
    assert ("local SGD, H=64: compute: not recorded (a run made before `cluster.*`); inter-node link 10 Gbps, "
            "50 us latency; what-if links 1 Gbps (50 us), 10 Gbps (10 us).") in header  # fmt: skip


def test_a_figure_with_fewer_than_three_points_per_arm_warns(results, tmp_path, capsys):
    """issue 42 item 2: a run with one evaluation (steps = EVAL_EVERY) is a dot in every accuracy
    figure: the report warns under each such figure, naming the arm and the keys to change, and on
    stderr; the arms with curves are not named."""
    from lsgd.analysis.plots import SparseCurveWarning

    root = tmp_path / "res"
    write_run(root, *DDP)  # 10 evaluations
    write_run(root, "run_short", *H8[1:], steps=EVAL_EVERY)  # 1 evaluation, 2 records
    with pytest.warns(SparseCurveWarning) as caught:
        text = write_report(root, tmp_path / "r").read_text()
    warned = [line for line in text.splitlines() if line.startswith("**Warning:**")]
    accuracy = [w for w in warned if "test accuracy vs" in w]
    assert len(accuracy) == 3  # wire bytes, wall time, modeled time
    for w in accuracy:
        assert ("local SGD, H=8 (1 point) has fewer than 3 evaluated points, drawn as dots, not a curve; set "
                "`eval_unit=step eval_every=1` (about 10 over their 10 steps; now `eval_unit=steps eval_every=10`)") in w
        assert "DDP" not in w
    (loss,) = [w for w in warned if "training loss vs step" in w]
    assert "local SGD, H=8 (2 points) has fewer than 3 logged records" in loss and "`log_every=1`" in loss
    assert len(caught) == len(warned) and all(str(w.message).startswith(f"{EXP}: figure ") for w in caught)
    # each warning under its figure's caption
    lines = text.splitlines()
    for w in warned:
        i = lines.index(w)
        assert lines[i - 2].startswith(f"*{EXP}: ") and lines[i - 2].split(".*")[0].split(": ", 1)[1] in w
    # the CLI prints them on stderr, one plain line each
    assert lsgd_cli(["report", str(root), "--out", str(tmp_path / "cli")]) == 0
    err = capsys.readouterr().err
    printed = [line for line in err.splitlines() if line.startswith("lsgd report: warning: ")]
    assert len(printed) == len(warned) and all(f"{EXP}: figure " in line for line in printed)
    # enough evaluations: no warning
    with warnings_as_errors(SparseCurveWarning):
        write_report(results, tmp_path / "quiet")


def warnings_as_errors(category):
    import warnings

    class _Ctx:
        def __enter__(self):
            self._w = warnings.catch_warnings()
            self._w.__enter__()
            warnings.simplefilter("error", category)

        def __exit__(self, *exc):
            return self._w.__exit__(*exc)

    return _Ctx()


def test_the_headline_has_one_byte_measure_the_wire(tmp_path, monkeypatch):
    """issue 42 item 3: an all-reduce method that hands twice DDP's payload to its collectives but
    puts the same bytes on the wire (as Adasum's recursive halving does): the main table shows wire
    bytes and their ratio to DDP's (1), nothing of the payload; the details show the payload ratio
    (2) under its own name, defined; the accuracy-vs-communication figure's x axis is wire bytes."""
    root = tmp_path / "res"
    write_run(root, *DDP)
    ada = write_run(root, "run_ada", {"name": "adasum", "target": "gradient"}, 0.0088, 1.0, 2.0,
                    bytes_per_round=2 * PARAM_BYTES)  # fmt: skip
    ring = lambda step: step * PARAM_BYTES * 2 * (WORLD - 1) // WORLD  # noqa: E731 (DDP's wire bytes)
    patch_records(ada, lambda r: {**r, "wire_bytes": ring(r["step"])})
    patch_summary(ada, wire_bytes=ring(STEPS))
    figures = _capture_figures(monkeypatch)
    plot_runs(root, tmp_path / "p")
    ax = figures[f"{EXP}_test_acc_vs_wire_bytes"].axes[0]
    assert ax.get_xlabel().startswith("wire bytes sent per worker (wire_bytes)")
    lines = _lines(ax)
    (other,) = [k for k in lines if k != "DDP"]
    assert list(lines[other].get_xdata()) == list(lines["DDP"].get_xdata())  # equal wire bytes, not 2x

    monkeypatch.setattr("lsgd.analysis.report.plot_frames", lambda *args, **kwargs: {})
    text = write_report(root, tmp_path / "r").read_text()
    main, details = parse_markdown_tables(text)
    assert not any("dense" in c or "payload" in c for c in main[0])
    rows = {r["method"]: r for r in main}
    assert rows[other]["GB on the wire / worker"] == rows["DDP"]["GB on the wire / worker"] == "0.6"
    assert rows[other]["wire bytes vs ddp"] == rows["DDP"]["wire bytes vs ddp"] == "1"
    rows = {r["method"]: r for r in details}
    assert rows[other]["payload vs dense"] == "2" and rows[other]["wire bytes vs ddp"] == "1"
    assert "**payload vs dense** = the payload a worker handed to collectives and sends (`comm_bytes`" in text
    assert "**wire bytes vs ddp** = that / the same of the run's baseline run" in text


def test_peak_bytes_per_step_column_with_its_ratio_and_a_dash_for_old_runs(results, tmp_path, no_figures):
    """issue 40: summary.json's peak_step_bytes (the most wire bytes any rank sent in one step) is a
    column of the details, MB, with its ratio to the baseline's; a run folder made before the key
    shows a dash and the report is written all the same; a running run reads it from its last record."""
    patch_summary(results / EXP / "run_ddp", peak_step_bytes=6_000_000)  # DDP: 2 x 3/4 x 4 MB per step
    patch_summary(results / EXP / "run_h8", peak_step_bytes=1_500_000)
    running = write_run(results, "run_h4", {**H8[1], "local_steps": 4}, 0.008, 0.5, 0.5, with_summary=False)
    patch_records(running, lambda r: {**r, "peak_step_bytes": 3_000_000})
    t = experiment_tables(results)[EXP].table
    assert by_run(t, "peak_step_bytes")["run_h4"] == 3e6 and math.isnan(by_run(t, "peak_step_bytes")["run_h16"])
    assert by_run(t, "peak_vs_baseline") == pytest.approx({"run_ddp": 1.0, "run_h8": 0.25, "run_h4": 0.5,
                                                           "run_h16": math.nan}, nan_ok=True)  # fmt: skip
    details = parse_markdown_tables(write_report(results, tmp_path / "r").read_text())[1]
    rows = {r["method"]: r for r in details}
    got = {m: (r["peak bytes / step (MB)"], r["peak vs ddp"]) for m, r in rows.items()}
    assert got == {"DDP": ("6", "1"), "local SGD, H=4 (running)": ("3", "0.5"), "local SGD, H=8": ("1.5", "0.25"),
                   "local SGD, H=16": ("-", "-")}  # fmt: skip
    # no run has it: dashes, no crash
    details = parse_markdown_tables(write_report(results / EXP / "run_h16", tmp_path / "old").read_text())[1]
    assert details[0]["peak bytes / step (MB)"] == "-" and details[0]["peak vs ddp"] == "-"
