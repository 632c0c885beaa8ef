"""GraVAC (Tyagi and Swany, CLOUD 2023, Algorithm 1) and Accordion (Agarwal et al., MLSys 2021)
controllers follow their documented rules on scripted sequences (lsgd.compression.adaptive)."""

from __future__ import annotations

import json
import math

import pytest

from lsgd.compression.adaptive import (
    AccordionController,
    GraVACController,
    GraVACDecision,
)

NAN = float("nan")


def run(ctrl: GraVACController, steps, t_iter_s: float = 1.0, samples: int = 100):
    """Feed ``(gain_min, gain_candidate)`` pairs (or ``(gmin, gcand, t_iter_s)``); return
    ``[(plan before the step, decision), ...]``."""
    out = []
    for step in steps:
        gmin, gcand, *rest = step
        plan = ctrl.plan()
        out.append((plan, ctrl.observe(gmin, gcand, rest[0] if rest else t_iter_s, samples)))
    return out


def candidates_per_window(ctrl: GraVACController, windows: int, gains=(1.0, 0.95)) -> list[float]:
    """Candidate CF planned in each window; the gains never agree within omega (no raise) and
    t_iter is NaN (no throughput recorded, so nothing settles)."""
    seen = []
    for _ in range(windows):
        seen.append(ctrl.plan()[1])
        for _ in range(ctrl.window):
            assert ctrl.plan()[1] == seen[-1]
            ctrl.observe(*gains, NAN, 100)
    return seen


# ------------------------------------------------------------------------------------ GraVAC
def test_exponential_policy_candidate_sequence():
    ctrl = GraVACController(cf_min=10, cf_max=1000, window=4, policy="exponential", ratio=2, scale_start=2, ewma=0)
    # theta_s: 2, 2*2=4, 4*4=16, 16*8=128 -> capped at 1000/10
    assert candidates_per_window(ctrl, 6) == [20.0, 40.0, 160.0, 1000.0, 1000.0, 1000.0]
    assert ctrl.cf_min == 10.0 and not ctrl.settled


def test_geometric_policy_candidate_sequence():
    ctrl = GraVACController(cf_min=10, cf_max=1000, window=4, policy="geometric", ratio=2, scale_start=2, ewma=0)
    expected = [20.0, 40.0, 80.0, 160.0, 320.0, 640.0, 1000.0, 1000.0]
    assert candidates_per_window(ctrl, 8) == expected


def test_geometric_ratio_three():
    ctrl = GraVACController(cf_min=10, cf_max=2000, window=2, policy="geometric", ratio=3, scale_start=2, ewma=0)
    assert candidates_per_window(ctrl, 6) == [20.0, 60.0, 180.0, 540.0, 1620.0, 2000.0]


def test_cap_never_plans_above_cf_max_exactly():
    ctrl = GraVACController(cf_min=1.5, cf_max=1000, window=1, policy="geometric", ratio=2, ewma=0)
    plans = [p for p, _ in run(ctrl, [(1.0, 0.5, NAN)] * 20)]
    assert all(lo <= hi <= 1000.0 for lo, hi in plans)
    assert plans[-1] == (1.5, 1000.0)  # exactly cf_max, no float drift from 1.5 * (1000 / 1.5)
    # exponential growth far past the cap stays finite and capped
    ctrl = GraVACController(cf_min=10, cf_max=1000, window=1, ewma=0)
    plans = [p for p, _ in run(ctrl, [(1.0, 0.5, NAN)] * 200)]
    assert max(hi for _, hi in plans) == 1000.0
    assert ctrl.theta_s == pytest.approx(100.0)


def test_raises_theta_min_when_gains_agree_within_omega():
    ctrl = GraVACController(cf_min=10, cf_max=1000, window=4, omega=0.01, ewma=0)
    # window 1: candidate gain low for 3 steps (throughputs differ, no settling), then the
    # smoothed gains agree within 1% at the window end -> theta_min <- 20, theta_s <- 2
    run(ctrl, [(0.95, 0.5)] * 3 + [(0.95, 0.95)], t_iter_s=1.0)
    assert ctrl.plan() == (20.0, 40.0) and not ctrl.settled
    # window 2: 5% apart -> no raise; exponential counter restarted: theta_s = 2 * 2**1
    # (iterations get faster as the CF grows, so no two throughputs agree within omega)
    run(ctrl, [(1.0, 0.5)] * 3 + [(1.0, 0.95)], t_iter_s=0.8)
    assert ctrl.plan() == (20.0, 80.0)
    # window 3: raise again (0.5% apart); window 4: no raise, theta_s = 2 * 2 again
    run(ctrl, [(1.0, 0.5)] * 3 + [(1.0, 0.995)], t_iter_s=0.6)
    assert ctrl.plan() == (80.0, 160.0)
    run(ctrl, [(1.0, 0.5)] * 3 + [(1.0, 0.9)], t_iter_s=0.5)
    assert ctrl.plan() == (80.0, 320.0)
    assert not ctrl.settled


def test_omega_boundary_is_inclusive():
    ctrl = GraVACController(cf_min=10, window=1, omega=0.5, ewma=0)
    run(ctrl, [(1.0, 0.5, NAN)])  # |1 - 0.5| / 1 == omega
    assert ctrl.cf_min == 20.0


def test_epsilon_rule_candidate_min_dense():
    ctrl = GraVACController(cf_min=10, cf_max=1000, epsilon=0.9, window=1000, ewma=0)
    d = ctrl.observe(0.95, 0.92, 1.0, 64)
    assert d == GraVACDecision("candidate", 20.0, 10.0, 20.0, 0.95, 0.92, 0.92, False)
    d = ctrl.observe(0.95, 0.5, 1.0, 64)
    assert d == GraVACDecision("min", 10.0, 10.0, 20.0, 0.95, 0.5, 0.95, False)
    d = ctrl.observe(0.5, 0.4, 1.0, 64)
    assert d == GraVACDecision("dense", 1.0, 10.0, 20.0, 0.5, 0.4, 1.0, True)
    # epsilon itself passes (>=)
    assert ctrl.observe(0.9, 0.9, 1.0, 64).sent == "candidate"
    assert ctrl.observe(0.9, 0.89, 1.0, 64).sent == "min"


def test_epsilon_rule_uses_smoothed_gains():
    ctrl = GraVACController(epsilon=0.9, window=1000, ewma=0.5)
    assert ctrl.observe(1.0, 1.0, 1.0, 1).sent == "candidate"
    # raw candidate gain 0.7 is below epsilon, smoothed 0.85 too; min smoothed 1.0 passes
    assert ctrl.observe(1.0, 0.7, 1.0, 1).sent == "min"
    d = ctrl.observe(0.6, 1.0, 1.0, 1)  # smoothed: min 0.8, candidate 0.925
    assert d.sent == "candidate" and d.gain == pytest.approx(0.925)


def test_ewma_matches_hand_computation_and_resets_on_cf_change():
    ctrl = GraVACController(cf_min=10, window=3, ewma=0.9, epsilon=0.5)
    mins, cands = [0.8, 1.0, 0.6], [0.7, 0.3, 0.9]
    ds = [ctrl.observe(m, c, NAN, 1) for m, c in zip(mins, cands)]
    s_min = [0.8, 0.9 * 0.8 + 0.1 * 1.0, 0.9 * (0.9 * 0.8 + 0.1 * 1.0) + 0.1 * 0.6]
    s_cand = [0.7, 0.9 * 0.7 + 0.1 * 0.3, 0.9 * (0.9 * 0.7 + 0.1 * 0.3) + 0.1 * 0.9]
    assert [d.gain_min for d in ds] == pytest.approx(s_min)
    assert [d.gain_candidate for d in ds] == pytest.approx(s_cand)
    # window end without a raise: the candidate CF changed (20 -> 40), theta_min did not
    assert ctrl.plan() == (10.0, 40.0)
    d = ctrl.observe(0.5, 0.25, NAN, 1)
    assert d.gain_min == pytest.approx(0.9 * s_min[-1] + 0.1 * 0.5)
    assert d.gain_candidate == 0.25  # re-initialized by the first observation of CF 40


def test_ewma_reset_when_theta_min_raised():
    ctrl = GraVACController(cf_min=10, window=2, ewma=0.5, omega=0.01)
    run(ctrl, [(0.9, 0.9, NAN)] * 2)
    assert ctrl.plan() == (20.0, 40.0)
    d = ctrl.observe(0.7, 0.6, NAN, 1)
    assert (d.gain_min, d.gain_candidate) == (0.7, 0.6)


def test_throughput_table_running_mean_per_window():
    ctrl = GraVACController(cf_min=10, window=2, ewma=0, omega=0.01)
    ctrl.observe(1.0, 0.5, 2.0, 100)  # T_system = 50 samples/s
    ctrl.observe(1.0, 0.7, 1.0, 100)  # T_system = 100
    assert ctrl.throughput == pytest.approx({10.0: (50 + 100) / 2, 20.0: (25 + 70) / 2})
    ctrl.observe(0.8, 0.4, 1.0, 100)  # new window: CF 10's entry is the new window's mean
    assert ctrl.throughput == pytest.approx({10.0: 80.0, 20.0: 47.5, 40.0: 40.0})


def test_settles_on_lower_of_two_cfs_within_omega_and_stays():
    ctrl = GraVACController(cf_min=10, cf_max=1000, epsilon=0.9, window=4, omega=0.01, ewma=0)
    # window 1: T(10) = 100, T(20) = 95 -> 5% apart, no settling, no raise
    run(ctrl, [(1.0, 0.95)] * 4)
    assert not ctrl.settled and ctrl.plan() == (10.0, 40.0)
    # window 2: T(10) = 90, T(40) = 95: the two best are 20 and 40 (both 95) -> settle on 20
    run(ctrl, [(0.9, 0.95)] * 4)
    assert ctrl.settled and ctrl.cf_ideal == 20.0
    assert ctrl.plan() == (20.0, 20.0)
    # stays: window ends change nothing, gains agreeing would otherwise raise theta_min
    decisions = run(ctrl, [(0.95, 0.95)] * 12 + [(0.5, 0.5)] * 20)
    assert all(plan == (20.0, 20.0) for plan, _ in decisions)
    first = decisions[0][1]
    assert first == GraVACDecision("min", 20.0, 20.0, 20.0, 0.95, 0.95, 0.95, False)
    last = decisions[-1][1]
    assert last == GraVACDecision("dense", 1.0, 20.0, 20.0, 0.5, 0.5, 1.0, True)
    assert ctrl.cf_ideal == 20.0


def test_settling_resets_ewma_when_cf_changes():
    ctrl = GraVACController(cf_min=10, window=4, omega=0.01, ewma=0.5)
    run(ctrl, [(1.0, 0.95)] * 4)
    run(ctrl, [(0.9, 0.95)] * 4)
    assert ctrl.cf_ideal == 20.0
    d = ctrl.observe(0.3, 0.2, 1.0, 1)
    assert (d.gain_min, d.gain_candidate) == (0.3, 0.2)


def test_settles_on_cf_max_when_nothing_left_to_explore():
    ctrl = GraVACController(cf_min=10, cf_max=40, window=1, ewma=0)
    run(ctrl, [(0.95, 0.95, NAN)])
    assert ctrl.plan() == (20.0, 40.0) and not ctrl.settled
    run(ctrl, [(0.95, 0.95, NAN)])
    assert ctrl.settled and ctrl.cf_ideal == 40.0 and ctrl.plan() == (40.0, 40.0)
    assert GraVACController(cf_min=50, cf_max=50).plan() == (50.0, 50.0)
    assert GraVACController(cf_min=50, cf_max=50).settled


def test_state_dict_round_trip_reproduces_future_decisions():
    kwargs = {"cf_min": 10, "cf_max": 1000, "window": 4, "omega": 0.01, "ewma": 0.5, "epsilon": 0.8}
    script = (
        [(1.0, 0.95, 1.0)] * 3
        + [(0.98, 0.6, 0.5)] * 3  # snapshot in the middle of window 2
        + [(1.0, 0.99, 0.5)] * 2
        + [(0.7, 0.4, 0.25)] * 4
        + [(0.9, 0.95, 0.25)] * 12
        + [(0.95, 0.95, 0.25)] * 8
    )
    a = GraVACController(**kwargs)
    run(a, script[:6])
    saved = json.loads(json.dumps(a.state_dict(), allow_nan=False))
    b = GraVACController(**kwargs)
    b.load_state_dict(saved)
    rest_a, rest_b = run(a, script[6:]), run(b, script[6:])
    assert rest_a == rest_b
    assert a.state_dict() == b.state_dict()
    assert {d.sent for _, d in rest_a} >= {"min", "dense"}
    assert a.cf_min != 10.0 or a.settled  # the tail crosses window ends that change the state
    with pytest.raises(ValueError, match="window"):
        GraVACController(**{**kwargs, "window": 8}).load_state_dict(saved)


@pytest.mark.parametrize(
    "key, value",
    [
        ("cf_min", 0.5),
        ("cf_max", 5.0),
        ("epsilon", 0.0),
        ("epsilon", 1.5),
        ("window", 0),
        ("window", 2.5),
        ("omega", -0.1),
        ("policy", "linear"),
        ("ratio", 1.0),
        ("scale_start", 1.0),
        ("ewma", 1.0),
        ("ewma", -0.1),
        ("cf_min", math.inf),
    ],
)
def test_bad_constructor_values_name_the_key(key, value):
    with pytest.raises(ValueError, match=key):
        GraVACController(**{key: value})


def test_bad_observations_raise():
    ctrl = GraVACController()
    with pytest.raises(ValueError, match="gain_min"):
        ctrl.observe(-0.1, 0.5, 1.0, 1)
    with pytest.raises(ValueError, match="gain_candidate"):
        ctrl.observe(0.5, NAN, 1.0, 1)
    with pytest.raises(ValueError, match="t_iter_s"):
        ctrl.observe(0.5, 0.5, 0.0, 1)
    with pytest.raises(ValueError, match="samples"):
        ctrl.observe(0.5, 0.5, 1.0, -1)
    assert ctrl.observations == 0


# ------------------------------------------------------------------------------------ Accordion
def test_accordion_switches_exactly_at_eta():
    acc = AccordionController(num_layers=3, eta=0.5)
    assert acc.low == [True, True, True]  # first period forced low
    assert acc.end_period([2.0, 4.0, 0.0]) == [True, True, True]  # no previous norms
    # |2-1|/2 = 0.5 (edge, critical); |4-3|/4 = 0.25; 0 -> 0 is not critical
    assert acc.end_period([1.0, 3.0, 0.0]) == [True, False, False]
    assert acc.low == [True, False, False]
    # 1 -> 1: 0; |3-1.5|/3 = 0.5 (edge); 0 -> 2: critical
    assert acc.end_period([1.0, 1.5, 2.0]) == [False, True, True]
    # growth counts too: |1-1.5|/1 = 0.5; 1.5 -> 1.5: 0; |2-2.999|/2 < 0.5
    assert acc.end_period([1.5, 1.5, 2.999]) == [True, False, False]
    # just below the edge
    assert acc.end_period([0.7500001, 1.5, 2.999]) == [False, False, False]


def test_accordion_lr_decay_forces_low_and_updates_prev():
    acc = AccordionController(num_layers=2)
    acc.end_period([1.0, 1.0])
    assert acc.end_period([1.0, 1.0]) == [False, False]
    assert acc.end_period([1.1, 1.0], lr_decayed=True) == [True, True]
    # compared with the decayed period's norms, not the older ones
    assert acc.end_period([1.1, 0.4]) == [False, True]


def test_accordion_force_low_until_next_period():
    acc = AccordionController(num_layers=2)
    acc.end_period([1.0, 1.0])
    acc.end_period([1.0, 1.0])
    assert acc.low == [False, False]
    acc.force_low()
    assert acc.low == [True, True]
    assert acc.end_period([1.0, 1.0]) == [False, False]


def test_accordion_errors_and_state_round_trip():
    with pytest.raises(ValueError, match="num_layers"):
        AccordionController(num_layers=0)
    with pytest.raises(ValueError, match="eta"):
        AccordionController(num_layers=2, eta=0.0)
    acc = AccordionController(num_layers=2)
    with pytest.raises(ValueError, match="num_layers"):
        acc.end_period([1.0])
    with pytest.raises(ValueError, match="norms"):
        acc.end_period([1.0, -1.0])
    acc.end_period([1.0, 2.0])
    acc.end_period([0.2, 2.0])
    other = AccordionController(num_layers=2)
    other.load_state_dict(json.loads(json.dumps(acc.state_dict())))
    assert other.low == acc.low == [True, False]
    assert other.end_period([0.2, 0.5]) == acc.end_period([0.2, 0.5]) == [False, True]
    with pytest.raises(ValueError, match="num_layers"):
        AccordionController(num_layers=3).load_state_dict(acc.state_dict())


def test_per_cf_iteration_times_give_separate_throughputs():
    ctl = GraVACController(cf_min=10, cf_max=1000, epsilon=0.5, window=100, ewma=0.0)
    # theta_min (10x) takes 2 s per iteration, the candidate (20x) 1 s: T = samples / t * gain
    ctl.observe(0.8, 0.6, 2.0, 100, t_iter_candidate_s=1.0)
    assert ctl.throughput[10.0] == pytest.approx(100 / 2.0 * 0.8)
    assert ctl.throughput[20.0] == pytest.approx(100 / 1.0 * 0.6)
    with pytest.raises(ValueError, match="t_iter_candidate_s"):
        ctl.observe(0.8, 0.6, 2.0, 100, t_iter_candidate_s=0.0)


# ---------------------------------------------- GraVAC Algorithm 1 on scripted regimes (paper)
def comm_bound_time(cf: float) -> float:
    """Seconds of an iteration sending CF ``cf``: 1 s of compute plus 10 s of dense
    communication shrunk by the CF (a communication-bound regime)."""
    return 1.0 + 10.0 / cf


#: gains stay close (equal) at every CF, the candidate always passes epsilon, omega 5%. By
#: Algorithm 1, with T(cf) = N / t(cf) * 0.95 and t(cf) = 1 + 10 / cf:
#:   T(10) = 0.475 N, T(20) = 0.633 N, T(40) = 0.760 N, T(80) = 0.844 N, T(160) = 0.894 N,
#:   T(320) = 0.921 N. At every window end the gains agree, so theta_min rises to the candidate;
#:   the two best throughputs differ by 25%, 16.7%, 10%, 5.6% (> omega) after windows 1-4 and by
#:   2.9% (<= omega) after window 5, which settles on the lower CF of that pair, 160.
RISING_PLANS = [(10.0, 20.0), (20.0, 40.0), (40.0, 80.0), (80.0, 160.0), (160.0, 320.0)]


def close_gains_controller(window: int) -> GraVACController:
    return GraVACController(cf_min=10, cf_max=1000, epsilon=0.5, window=window, omega=0.05,
                            policy="exponential", ratio=2, scale_start=2, ewma=0)


def test_close_gains_raise_theta_min_until_throughputs_agree_modeled_times():
    """Each CF's own iteration time (throughput_time=modeled): theta_min must rise while a larger
    CF still buys throughput, then settle on the lower CF of the two best."""
    ctrl = close_gains_controller(window=2)
    plans = []
    for _ in range(len(RISING_PLANS)):
        plans.append(ctrl.plan())
        for _ in range(ctrl.window):
            cf_min, cf_cand = ctrl.plan()
            d = ctrl.observe(0.95, 0.95, comm_bound_time(cf_min), 1, t_iter_candidate_s=comm_bound_time(cf_cand))
            assert d.sent == "candidate"
    assert plans == RISING_PLANS
    assert ctrl.settled and ctrl.plan() == (160.0, 160.0)


def test_close_gains_raise_theta_min_until_throughputs_agree_measured_times():
    """The paper's measured throughput: each iteration's time counts only for the CF it sent,
    and is known one iteration later (then the last iteration of a window counts in none)."""
    ctrl = close_gains_controller(window=3)
    plans, pending = [], None
    for _ in range(len(RISING_PLANS)):
        plans.append(ctrl.plan())
        for _ in range(ctrl.window):
            if pending is not None:
                ctrl.record_throughput(*pending)
            d = ctrl.observe(0.95, 0.95, NAN, 1)
            assert d.sent == "candidate"
            pending = (d.cf, comm_bound_time(d.cf), d.gain, 1, ctrl.observations)
    assert plans == RISING_PLANS
    assert ctrl.settled and ctrl.plan() == (160.0, 160.0)
    # theta_min itself was never sent, so the table holds only the candidates' CFs
    assert sorted(ctrl.throughput) == [20.0, 40.0, 80.0, 160.0, 320.0]
    assert ctrl.throughput[20.0] == pytest.approx(0.95 / comm_bound_time(20.0))


def test_measured_sample_of_an_ended_window_or_of_dense_is_dropped():
    ctrl = close_gains_controller(window=2)
    ctrl.observe(0.95, 0.95, NAN, 1)
    ctrl.observe(0.95, 0.95, NAN, 1)  # window end at observation 2
    assert not ctrl.record_throughput(20.0, 1.5, 0.95, 1, observation=2)  # belonged to window 1
    assert not ctrl.record_throughput(1.0, 1.0, 1.0, 1, observation=3)    # dense: never a candidate CF
    assert ctrl.record_throughput(40.0, 1.25, 0.95, 1, observation=3)
    assert ctrl.throughput == {40.0: pytest.approx(0.95 / 1.25)}
    with pytest.raises(ValueError, match="t_iter_s"):
        ctrl.record_throughput(40.0, 0.0, 0.95, 1, observation=3)


def test_equal_times_for_both_cfs_settle_on_the_old_theta_min():
    """Why one shared t_iter cannot work (the old reading of measured mode): with equal times
    and gains within omega the throughputs agree too, and Algorithm 1 settles on the lower CF at
    the very first window end: theta_min never gets to rise."""
    ctrl = close_gains_controller(window=2)
    for _ in range(2):
        ctrl.observe(0.95, 0.95, 1.0, 1)
    assert ctrl.settled and ctrl.plan() == (10.0, 10.0)
