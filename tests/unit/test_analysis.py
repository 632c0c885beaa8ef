"""lsgd.analysis on fake-but-valid run folders (docs/run_format.md) with closed-form metrics.

Every fake run logs every LOG_EVERY steps and evaluates every EVAL_EVERY steps up to STEPS, with
    test_acc(step)       = rate * step            (test_ppl = 100 - rate * step for language models)
    wall_time_s(step)    = wall * step
    modeled_time_s(step) = modeled * step
    comm_bytes(step)     = (step // H) * PARAM_BYTES   (H = 1 for ddp)
so times to a threshold and speedups can be worked out by hand below. Runs written with
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
    batch_scaling_table,
    differing_keys,
    experiment_tables,
    find_run_dirs,
    load_compression,
    load_runs,
    load_summaries,
    plot_runs,
    run_labels,
    time_to_threshold,
    write_report,
)
from lsgd.analysis.load import read_metrics
from lsgd.analysis.report import markdown_table

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
):
    """Write <root>/<experiment>/<run_id>/{config.yaml, metrics.jsonl, summary.json}; return the folder."""
    run_dir = root / experiment / run_id
    run_dir.mkdir(parents=True)
    H = algo.get("local_steps", 1)
    config = {
        "experiment_name": experiment,
        "run_id": run_id,
        "world_size": world,
        "seed": 0,
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
        "algo": {**algo, "speeds": [1.0] * world},
        "model": {"name": "gpt" if lm else "cnn"},
        "dataset": {"name": "wikitext2" if lm else "fashion_mnist", "partition": "iid", "alpha": None},
        "optim": {"name": "sgd", "lr": 0.05, "momentum": 0.9, **(optim or {})},
        "schedule": {"name": "constant"},
        "launcher": {"name": "local", "nproc_per_node": world},
        "logger": {"name": "jsonl"},
        "network": network or {"name": "ethernet", "bandwidth_gbps": 10.0, "latency_us": 50.0},
    }
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
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
    # GB per worker = comm_bytes / 1e9: 100, 12 and 6 rounds of 4 MB
    assert by_run(tab, "gb_sent_per_worker") == pytest.approx({"run_ddp": 0.4, "run_h8": 0.048, "run_h16": 0.024})
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
    assert {p.name for p in files} >= {"wt2_test_ppl_vs_comm_bytes.png", "wt2_test_ppl_vs_wall_time_s.svg"}


# -- figures and report ---------------------------------------------------------------------------
FIGURES = ("test_acc_vs_comm_bytes", "test_acc_vs_wall_time_s", "test_acc_vs_modeled_time_s", "train_loss_vs_step")


def test_plot_runs_writes_png_and_svg_per_figure(results, tmp_path):
    # a completed run without any evaluation: only in the training-loss figure
    write_run(results, "run_noeval", {"name": "local_sgd", "local_steps": 32}, 0.0, 0.5, 0.5, with_evals=False)
    out = tmp_path / "plots"
    files = plot_runs(results, out)
    expected = {f"{EXP}_{fig}.{ext}" for fig in FIGURES for ext in ("png", "svg")}
    assert {p.name for p in files} == expected
    for p in files:
        assert p.parent == out and p.stat().st_size > 1000
        if p.suffix == ".png":
            assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    svg = {fig: (out / f"{EXP}_{fig}.svg").read_text() for fig in FIGURES}
    for fig in FIGURES:
        assert "algo.name=local_sgd, algo.local_steps=8" in svg[fig]
        assert "algo.name=ddp" in svg[fig]
    assert "algo.local_steps=32" in svg["train_loss_vs_step"]
    assert all("algo.local_steps=32" not in svg[f] for f in FIGURES if f.startswith("test_acc"))


def test_plot_runs_one_set_per_experiment(results, tmp_path):
    write_run(results, "c10_ddp", {"name": "ddp"}, 0.009, 1.0, 1.0, experiment="cifar10 resnet")
    write_run(results, "c10_slowmo", {"name": "slowmo", "slow_lr": 1.0}, 0.008, 0.5, 0.5, experiment="cifar10 resnet")
    files = {p.name for p in plot_runs(results, tmp_path / "plots")}
    for prefix in (EXP, "cifar10_resnet"):
        assert {f"{prefix}_{fig}.{ext}" for fig in FIGURES for ext in ("png", "svg")} <= files
    assert len(files) == 2 * len(FIGURES) * 2
    # labels are per experiment: cifar's runs differ by algo.name only (slow_lr is slowmo's alone)
    svg = (tmp_path / "plots" / "cifar10_resnet_train_loss_vs_step.svg").read_text()
    assert "algo.name=slowmo" in svg and "algo.name=ddp" in svg
    assert "local_steps" not in svg and "slow_lr" not in svg


def test_write_report_tables_and_figures(results, tmp_path):
    write_run(results, "run_killed", {"name": "local_sgd", "local_steps": 4}, 0.007, 0.5, 0.5, steps=50, with_summary=False)
    out = tmp_path / "report"
    path = write_report(results / EXP, out)
    assert path == out / "report.md" and path.stat().st_size > 0
    text = path.read_text()
    assert f"## {EXP}" in text and "Threshold T = 0.8000" in text
    (table,) = parse_markdown_tables(text)
    rows = {r["run"]: r for r in table}
    assert set(rows) == {"run_ddp", "run_h8", "run_h16", "run_killed"}
    assert rows["run_h8"]["algo"] == "local_sgd" and rows["run_h8"]["algo.local_steps"] == "8"
    assert rows["run_ddp"]["algo.local_steps"] == ""
    assert rows["run_killed"]["status"] == "running"
    for run, (wall, modeled) in HAND_SPEEDUP.items():
        assert rows[run]["speedup vs ddp, wall"] == f"{wall:.2f}"
        assert rows[run]["speedup vs ddp, modeled"] == f"{modeled:.2f}"
    assert rows["run_killed"]["speedup vs ddp, wall"] == "n/a"
    assert rows["run_ddp"]["final test acc"] == "0.9000" and rows["run_h16"]["best test acc"] == "0.8500"
    assert rows["run_ddp"]["GB sent / worker"] == "0.4" and rows["run_h8"]["comm rounds"] == "12"
    # 100 steps x batch 32 x 4 workers; train_loss(100) = 2 / (1 + 0.05 * 100); test_loss(100) = 1 - rate * 100
    assert rows["run_h8"]["samples"] == "12800" and rows["run_h8"]["final train loss"] == "0.3333"
    assert rows["run_ddp"]["final test loss"] == "0.1000" and rows["run_killed"]["final test loss"] == "0.6500"
    assert rows["run_h16"]["wall time (s)"] == "25.0" and rows["run_h16"]["modeled time (s)"] == "40"  # 3 significant digits
    assert rows["run_ddp"]["time to target, wall (s)"] == "80.0"
    # figures embedded with relative links that resolve from the report's folder
    links = re.findall(r"\]\(([^)]+)\)", text)
    assert {l.rsplit(".", 1)[1] for l in links} == {"png", "svg"} and len(links) == 2 * len(FIGURES)
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
    rows = {r["run"]: r for r in parse_markdown_tables(write_report(results, tmp_path / "r1").read_text())[0]}
    assert rows["run_topk"]["bytes vs dense"] == "0.1" and rows["run_ddp"]["bytes vs dense"] == "1"

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
    rows = parse_markdown_tables(write_report([results / EXP / "run_h8"], tmp_path / "r2").read_text())[0]
    assert rows[0]["bytes vs dense"] == "n/a"


def test_modeled_time_at_1_and_10_gbps(results, tmp_path, no_figures):
    # 100 rounds of a ring all-reduce over 4 workers: a = 2 * 3 * 100 = 600 latencies,
    # b = 2 * 3/4 * 4 MB * 100 = 6e8 bytes; compute = 0.8 * wall * 100 = 80 s (wall 1 s/step).
    a, b, compute = 600, 6e8, 80.0
    write_run(results, "run_ab", {"name": "ddp", "bucket_cap_mb": 25}, 0.009, 1.0, 2.0, alpha_beta=True)  # latency 50 us
    write_run(results, "run_ab_default", {"name": "ddp", "bucket_cap_mb": 50}, 0.009, 1.0, 2.0, alpha_beta=True,
              network={"name": "custom", "bandwidth_gbps": 10.0})  # no latency_us: 10 us  # fmt: skip
    write_run(results, "run_ab_running", {"name": "ddp", "bucket_cap_mb": 100}, 0.009, 1.0, 2.0, alpha_beta=True, with_summary=False)
    t = experiment_tables(results)[EXP].table
    for run, lat_us in (("run_ab", 50), ("run_ab_default", 10), ("run_ab_running", 50)):  # running: from its last record
        assert by_run(t, "modeled_1gbps_s")[run] == pytest.approx(compute + a * lat_us * 1e-6 + b * 8 / 1e9)
        assert by_run(t, "modeled_10gbps_s")[run] == pytest.approx(compute + a * lat_us * 1e-6 + b * 8 / 10e9)
    assert by_run(t, "modeled_1gbps_s")["run_ab"] == pytest.approx(84.83)
    assert by_run(t, "modeled_10gbps_s")["run_ab"] == pytest.approx(80.51)
    assert math.isnan(by_run(t, "modeled_1gbps_s")["run_h8"])  # older run: no alpha-beta terms
    rows = {r["run"]: r for r in parse_markdown_tables(write_report(results, tmp_path / "r").read_text())[0]}
    assert rows["run_ab"]["modeled @1 Gbps (s)"] == "84.8" and rows["run_ab"]["modeled @10 Gbps (s)"] == "80.5"
    assert rows["run_h8"]["modeled @1 Gbps (s)"] == ""
    # an experiment where no run has the terms gets no such columns
    old = parse_markdown_tables(write_report(results / EXP / "run_h8", tmp_path / "old").read_text())[0]
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
    main, scaling = parse_markdown_tables(text)
    assert len(main) == 8
    cells = {r["method"]: r for r in scaling}
    assert cells[ada] == {"method": ada, "128": "0.9100", "256": "0.8700", "512": "0.8500"}
    assert cells[d]["512"] == "diverged" and cells[adag]["256"] == ""
    # the main set has one effective batch: no such table
    assert "effective batch" not in write_report(results, tmp_path / "main").read_text()
    assert experiment_tables(results)[EXP].batch_scaling is None


def test_compression_figure(results, tmp_path, monkeypatch):
    write_run(results, "run_gravac", GRAVAC, 0.0088, 0.5, 0.5, compression=gravac_row)
    write_run(results, "run_acc", ACCORDION, 0.0087, 0.5, 0.5, compression=accordion_row)
    out = tmp_path / "plots"
    files = {p.name for p in plot_runs(results, out)}
    assert {f"{EXP}_compression.png", f"{EXP}_compression.svg"} <= files
    assert len(files) == 2 * (len(FIGURES) + 1)
    assert (out / f"{EXP}_compression.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    svg = (out / f"{EXP}_compression.svg").read_text()
    assert "algo.name=gravac" in svg and "algo.name=accordion" in svg and "cf_candidate" in svg
    assert "algo.name=ddp" not in svg  # no compression rows
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
    assert "algo.name=ddp" in svg and "algo.name=swarm_sgd" in svg and "world_size" not in svg
    assert "ddp_4" not in svg  # one line per method: no run ids
    # one set of runs at one world size: no scaling figure
    single = tmp_path / "single"
    write_run(single, "a", {"name": "ddp"}, 0.01, 0.5, 0.5)
    write_run(single, "b", {"name": "local_sgd", "local_steps": 8}, 0.01, 0.5, 0.5)
    assert not any("vs_nodes" in p.name for p in plot_runs(single, tmp_path / "plots2"))
