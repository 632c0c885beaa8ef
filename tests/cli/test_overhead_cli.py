"""LogGP's per-message overhead o (``network.overhead_us``, issue 41) from the command line: a real
run's modeled time grows by exactly its messages x 2 o, and ``lsgd calibrate --network`` measures
this host's o with two gloo ranks and writes what ``network.overhead_us=measured`` reads."""

from __future__ import annotations

import json
import math
import re

import pytest
from runner import lsgd, metrics, run_dirs, summary

O_US = 500.0
#: local SGD averages every 4 steps: 20 steps (debug=default) -> 5 synchronous all-reduces of the
#: model on 2 workers, 2 (p - 1) = 2 message steps each, on the critical path (nothing overlaps them)
RUN = ["debug=default", "algo=local_sgd", "algo.local_steps=4", "launcher=inprocess", "seed=5"]
ROUNDS, STEPS_PER_ALL_REDUCE = 5, 2


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("overhead_cli")
    env = {"XDG_CACHE_HOME": str(tmp / "cache")}  # no network calibration on this "host"
    out = {}
    for o in (0.0, O_US):
        res = lsgd(["train", *RUN, f"network.overhead_us={o:g}", f"results_dir={tmp}/o{o:g}"], tmp, env=env)
        assert res.returncode == 0, res.stderr[-3000:]
        (out[o],) = run_dirs(tmp / f"o{o:g}")
    return out


def test_overhead_adds_messages_times_two_o_to_the_modeled_time(runs):
    """network.overhead_us=500 against 0, the same run otherwise: modeled_time_s (and each what-if
    entry: o is the host's, kept at every bandwidth) grows by model_alpha_terms x 2 o at every
    record, model_alpha_terms being the closed-form count of message steps (rounds x 2 (p - 1));
    bytes and the training itself do not move. The value used is in summary.json, config.yaml and
    environment.json."""
    base, with_o = runs[0.0], runs[O_US]
    a, b = ([r for r in metrics(run) if "modeled_time_s" in r] for run in (base, with_o))
    assert [r["step"] for r in a] == [r["step"] for r in b] and len(a) >= 4
    for ra, rb in zip(a, b):
        assert ra["model_alpha_terms"] == rb["model_alpha_terms"]
        assert ra["comm_bytes"] == rb["comm_bytes"] and ra.get("train_loss") == rb.get("train_loss")
        delta = rb["model_alpha_terms"] * 2 * O_US * 1e-6
        for key in [k for k in ra if k.startswith("modeled_time_") and k.endswith("_s") and k != "modeled_time_s_mean"]:
            assert rb[key] - ra[key] == pytest.approx(delta, rel=1e-9, abs=1e-15), (ra["step"], key)
    sa, sb = summary(base), summary(with_o)
    assert sa["comm_rounds"] == sb["comm_rounds"] == ROUNDS
    assert sb["model_alpha_terms"] == ROUNDS * STEPS_PER_ALL_REDUCE
    assert sb["modeled_time_s"] - sa["modeled_time_s"] == pytest.approx(ROUNDS * STEPS_PER_ALL_REDUCE * 2 * O_US * 1e-6,
                                                                        rel=1e-9)
    assert sa["network_overhead_us"] == 0.0 and sb["network_overhead_us"] == O_US
    assert "overhead_us: 500" in (with_o / "config.yaml").read_text()
    env = json.loads((with_o / "environment.json").read_text())
    assert env["network"] == {"overhead_us": O_US, "calibration": None}


def test_calibrate_network_measures_a_positive_overhead(tmp_path):
    """``lsgd calibrate --network --nproc 3 --repeats 5`` (a quick version: 5 of each size): three
    local gloo ranks all-reduce (ranks 0 and 1 also play ping-pong); it prints the override to paste
    and writes the record beside the cpu profile, whose median is a positive finite number of
    microseconds (the all-reduce's time / (2 (3 - 1)) / 2), the p90 no smaller."""
    res = lsgd(["calibrate", "--network", "--nproc", "3", "--repeats", "5"], tmp_path,
               env={"XDG_CACHE_HOME": str(tmp_path)})
    assert res.returncode == 0, res.stderr[-3000:]
    line = re.search(r"^network\.overhead_us=([0-9.]+)$", res.stdout, re.M)
    assert line, res.stdout
    record = json.loads((tmp_path / "lsgd" / "network.json").read_text())["record"]
    o = record["overhead_us"]
    assert math.isfinite(o) and o > 0 and record["overhead_us_p90"] >= o
    assert float(line.group(1)) == pytest.approx(o, abs=0.05)
    assert record["repeats"] == 5 and record["sizes"] == [1, 64, 1024]
    assert record["one_way_us"]["n"] == 15 and record["pingpong_overhead_us"] > 0 and record["nproc"] == 3
    assert o == pytest.approx(record["allreduce_us"]["median"] / 8)  # 2 (p - 1) = 4 steps of 2 o
