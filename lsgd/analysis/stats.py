"""Statistics over seeds: the mean of each arm with a Student t confidence interval.

For a quantity measured once per run (final accuracy, GB sent, time to T, ...), an arm of n runs
(its seeds, :mod:`lsgd.analysis.arms`) with values x_1..x_n has

- mean  m = (1/n) sum_i x_i,
- sample standard deviation  s = sqrt(sum_i (x_i - m)^2 / (n - 1)),
- confidence interval  m +- h  with half-width  h = t_{(1+c)/2, n-1} * s / sqrt(n)  (Student t with
  n - 1 degrees of freedom, c = 0.95 by default: t_{0.975, 2} = 4.303 for three seeds),

computed with pandas (mean, std) and scipy (the t quantile). One run gives no interval (NaN).

Curves (accuracy vs bytes, loss vs step, ...) are aggregated point by point
(:func:`aggregate_curves`): where the arm's runs were recorded at the same x values (steps; the
deterministic bytes and modeled time) the values at each point are aggregated as above; where the x
values differ between seeds (wall time), each run's curve is linearly interpolated onto one grid, the
union of the runs' x values inside the range every run covers, and aggregated there.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import pandas as pd
from scipy import stats

from lsgd.analysis.arms import arm_keys, is_seed_key
from lsgd.analysis.load import ID_COLUMNS, _hashable, config_columns, format_value

#: Confidence level of the intervals.
CONFIDENCE = 0.95

#: Statistics :func:`aggregate_seeds` writes per value column, as ``<column>_<stat>``.
STATS = ("mean", "ci", "sd", "n", "min", "max")

#: Fewest runs of an arm for which figures draw the t interval as the band; below, min-max.
MIN_RUNS_FOR_CI_BAND = 3


def t_halfwidth(sd, n, confidence: float = CONFIDENCE):
    """Half-width of the Student t confidence interval of a mean: t_{(1+c)/2, n-1} * sd / sqrt(n).

    Args:
        sd: sample standard deviation(s) (ddof = 1), scalar or array.
        n: number(s) of values the mean is over.
        confidence: c, e.g. 0.95.

    Returns:
        The half-width(s), in the unit of the values; NaN where n < 2.
    """
    sd = np.asarray(sd, dtype=float)
    n = np.asarray(n, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = stats.t.ppf((1.0 + confidence) / 2.0, np.where(n >= 2, n - 1, np.nan))
        out = np.where(n >= 2, t * sd / np.sqrt(n), np.nan)
    return out if out.ndim else float(out)


def _group_codes(frame: pd.DataFrame, by: list[str]) -> np.ndarray:
    """One integer per row: the index of its combination of ``by`` values, in order of first
    appearance (a missing value is one value of its own; lists as their JSON text)."""
    if not by:
        return np.zeros(len(frame), dtype=int)
    seen: dict[tuple, int] = {}
    rows = zip(*([_hashable(v) for v in frame[c].tolist()] for c in by))  # NaN -> None: one value
    return np.array([seen.setdefault(tuple(r), len(seen)) for r in rows], dtype=int)


def aggregate_seeds(
    df: pd.DataFrame,
    by: str | Iterable[str] | None = None,
    values: Iterable[str] | None = None,
    confidence: float = CONFIDENCE,
) -> pd.DataFrame:
    """Aggregate the runs of each arm (runs equal in ``by``, i.e. differing only in seed): the
    mean of each value column over the arm's runs with its confidence interval.

    Args:
        df: one row per run, e.g. :func:`lsgd.analysis.load_summaries` or
            ``ExperimentTable.table``.
        by: the columns that define an arm. Default: ``experiment_name`` (when present) and
            :func:`lsgd.analysis.arms.arm_keys` of ``df`` (the config keys that differ, seeds
            excluded; meant for frames of :func:`lsgd.analysis.load_summaries`: give ``by`` for
            frames of your own). Missing values group together.
        values: numeric columns to aggregate. Default: every numeric column that is not in
            ``by``, not a seed key and not an identity column, and, for a frame of
            :mod:`lsgd.analysis` (its ``attrs["config_keys"]``), not a config key: for summaries
            ``final_test_acc``, ``comm_bytes``, ``modeled_time_s``, ...
        confidence: level c of the intervals.

    Returns:
        One row per arm, in order of first appearance: the ``by`` columns; ``n`` (runs in the
        arm); ``seeds`` (the runs' ``seed`` values, ``"0, 1, 2"``) and ``run_ids`` when ``df`` has
        those columns; then for each value column v: ``v_mean``, ``v_ci`` (half-width h of the
        interval, see the module docstring; NaN when fewer than 2 runs have a value), ``v_sd``
        (sample standard deviation), ``v_n`` (runs with a finite value: a run that never reached a
        threshold has NaN there and is left out of the mean), ``v_min``, ``v_max``.
        ``attrs``: ``by``, ``values``, ``confidence``.

    Example::

        runs = load_summaries("results/fmnist_demo")
        arms = aggregate_seeds(runs, by=["algo.name", "algo.local_steps"], values=["final_test_acc"])
        arms[["algo.name", "algo.local_steps", "n", "final_test_acc_mean", "final_test_acc_ci"]]
    """
    if by is None:
        by = (["experiment_name"] if "experiment_name" in df else []) + arm_keys(df)
    by = [by] if isinstance(by, str) else list(by)
    missing = [c for c in by if c not in df]
    if missing:
        raise KeyError(f"aggregate_seeds: no column {missing} in the frame")
    if values is None:
        skip = set(by) | set(ID_COLUMNS) | {c for c in df.columns if is_seed_key(str(c))}
        if df.attrs.get("config_keys") is not None:  # a frame of lsgd.analysis: leave its config out
            skip |= set(config_columns(df))
        values = [
            c for c in df.columns
            if c not in skip and pd.api.types.is_numeric_dtype(df[c]) and not pd.api.types.is_bool_dtype(df[c])
        ]  # fmt: skip
    values = [values] if isinstance(values, str) else list(values)
    missing = [c for c in values if c not in df]
    if missing:
        raise KeyError(f"aggregate_seeds: no column {missing} in the frame")

    codes = _group_codes(df, by)
    out = df[by].groupby(codes, sort=True).first() if by else pd.DataFrame(index=np.unique(codes))
    out = out.reindex(np.unique(codes))
    out["n"] = np.bincount(codes) if len(codes) else []
    for col, name in (("seed", "seeds"), ("run_id", "run_ids")):
        if col in df and col not in by:
            out[name] = df[col].groupby(codes).agg(lambda s: ", ".join(format_value(v) for v in s))
    num = df[values].apply(pd.to_numeric, errors="coerce").astype(float).replace([np.inf, -np.inf], np.nan)
    grouped = num.groupby(codes)
    mean, sd, count = grouped.mean(), grouped.std(ddof=1), grouped.count()
    lo, hi = grouped.min(), grouped.max()
    ci = pd.DataFrame(t_halfwidth(sd.to_numpy(), count.to_numpy(), confidence), index=sd.index, columns=values)
    parts = {"mean": mean, "ci": ci, "sd": sd, "n": count, "min": lo, "max": hi}
    columns = {f"{v}_{stat}": parts[stat][v] for v in values for stat in STATS}
    out = pd.concat([out, pd.DataFrame(columns, index=out.index)], axis=1).reset_index(drop=True)
    out.attrs = {"by": by, "values": values, "confidence": confidence}
    return out


def paired_differences(
    values: pd.Series,
    seeds: pd.Series,
    base_values: pd.Series,
    base_seeds: pd.Series,
    confidence: float = CONFIDENCE,
) -> dict[str, float]:
    """Mean difference of an arm's runs from a baseline arm's runs of the same seed, with the
    paired Student t interval.

    Runs of one seed share the data order and initialization, so much of their run-to-run spread
    cancels in the difference: d_i = x_i - b_i over the seeds i both arms have (n pairs), and
    ``mean`` = mean(d), ``ci`` = t_{(1+c)/2, n-1} sd(d) / sqrt(n) (:func:`t_halfwidth`). The
    difference is real at level c when the interval excludes 0. Pairs with a missing or infinite
    value are left out.

    Args:
        values, seeds: the arm's runs' values and seeds (aligned, one per run).
        base_values, base_seeds: the baseline arm's, likewise.
        confidence: level c.

    Returns:
        ``{"mean": m, "ci": h, "n": n}`` (NaN mean and h when no pair; NaN h when n = 1).

    Raises:
        ValueError: the arm or the baseline has two runs with the same seed (no pairing).
    """
    def by_seed(v, s, who):
        s = pd.Series(list(s)).map(_hashable)
        if s.duplicated().any():
            raise ValueError(f"paired_differences: the {who} has several runs of seed {format_value(s[s.duplicated()].iloc[0])}")
        x = pd.to_numeric(pd.Series(list(v)), errors="coerce").astype(float)
        return pd.Series(x.to_numpy(), index=s.to_numpy()).replace([np.inf, -np.inf], np.nan)

    a, b = by_seed(values, seeds, "arm"), by_seed(base_values, base_seeds, "baseline")
    d = (a - b.reindex(a.index)).dropna()
    n = len(d)
    mean = float(d.mean()) if n else float("nan")
    ci = float(t_halfwidth(d.std(ddof=1), n, confidence)) if n >= 2 else float("nan")
    return {"mean": mean, "ci": ci, "n": n}


def _last_per_x(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)`` sorted by x with one point per x value, the last recorded (the state reached once
    that many bytes or seconds were spent): the form :func:`numpy.interp` needs."""
    order = np.argsort(x, kind="stable")
    x, y = x[order], y[order]
    keep = np.r_[x[1:] != x[:-1], True] if len(x) else np.zeros(0, dtype=bool)
    return x[keep], y[keep]


def aggregate_curves(
    records: pd.DataFrame,
    x: str,
    y: str,
    arms: Mapping[str, str],
    confidence: float = CONFIDENCE,
    gaps: bool = False,
) -> pd.DataFrame:
    """Mean curve of ``y`` against ``x`` per arm, with a band, from the runs' metrics records.

    Each run's curve is its records with both ``x`` and ``y`` present. When all the arm's runs have
    the same x values (one list, in order) the values at each point are aggregated directly;
    otherwise each run's curve (sorted by x, the last point of a repeated x kept) is linearly
    interpolated (:func:`numpy.interp`) onto the union of the runs' x values that lie inside the
    range every run covers (no extrapolation), and aggregated there.

    Args:
        records: :func:`lsgd.analysis.load_runs` rows (filter them first, e.g. ``x > 0`` for a log
            axis).
        x, y: column names (``comm_bytes``, ``wall_time_s``, ``modeled_time_s``, ``step``; ``test_acc``,
            ``train_loss``, ...).
        arms: ``{run_dir: arm label}`` (:func:`lsgd.analysis.arms.arm_labels`); fixes the arms'
            order. Runs not in ``arms`` are ignored.
        confidence: level of the t interval.
        gaps: keep the records whose ``y`` is missing (NaN) as points of the run's curve: the
            arm's mean and band are NaN at a point where any of its runs lacks ``y`` (interpolated
            points next to one included), so a line drawn from the result breaks there instead
            of joining the points either side.

    Returns:
        Long frame, one row per arm and point: ``arm``, ``x``, ``mean`` (mean of y over the runs),
        ``low``, ``high`` (the band: mean -+ the t interval's half-width when the arm has at least
        :data:`MIN_RUNS_FOR_CI_BAND` runs, the min and max over runs when it has 2, NaN for 1),
        ``band`` (``"ci"``, ``"minmax"`` or ``"none"``), ``n`` (runs), ``interpolated`` (bool).
        Arms none of whose runs has a point are left out.
    """
    members: dict[str, list[str]] = {}
    for run_dir, label in arms.items():
        members.setdefault(label, []).append(run_dir)
    frames = []
    for label, dirs in members.items():
        curves = []
        for d in dirs:
            r = records.loc[records["run_dir"] == d, [x, y]].apply(pd.to_numeric, errors="coerce")
            r = r.dropna(subset=[x]) if gaps else r.dropna()
            if len(r) and r[y].notna().any():
                curves.append((r[x].to_numpy(float), r[y].to_numpy(float)))
        if not curves:
            continue
        first = curves[0][0]
        same = all(len(cx) == len(first) and np.array_equal(cx, first) for cx, _ in curves)
        if same:
            grid, ys = first, [cy for _, cy in curves]
        else:
            lo, hi = max(cx.min() for cx, _ in curves), min(cx.max() for cx, _ in curves)
            grid = np.unique(np.concatenate([cx for cx, _ in curves]))
            grid = grid[(grid >= lo) & (grid <= hi)]
            ys = [np.interp(grid, *_last_per_x(cx, cy)) for cx, cy in curves]
        if not len(grid):
            continue
        long = pd.DataFrame(
            {"point": np.tile(np.arange(len(grid)), len(ys)), "x": np.tile(grid, len(ys)), "y": np.concatenate(ys)}
        )
        agg = aggregate_seeds(long, by=["point"], values=["y"], confidence=confidence)
        if gaps:  # a point some run did not measure: no mean, no band (the line breaks)
            missing = np.isnan(np.vstack(ys)).any(axis=0)
            agg.loc[missing, ["y_mean", "y_ci", "y_min", "y_max"]] = np.nan
        n = len(ys)
        if n >= MIN_RUNS_FOR_CI_BAND:
            band, low, high = "ci", agg["y_mean"] - agg["y_ci"], agg["y_mean"] + agg["y_ci"]
        elif n == 2:
            band, low, high = "minmax", agg["y_min"], agg["y_max"]
        else:
            band, low, high = "none", np.nan, np.nan
        columns = {"arm": label, "x": grid, "mean": agg["y_mean"].to_numpy(), "low": low, "high": high,
                   "band": band, "n": n, "interpolated": not same}  # fmt: skip
        frames.append(pd.DataFrame(columns))
    if not frames:
        return pd.DataFrame(columns=["arm", "x", "mean", "low", "high", "band", "n", "interpolated"])
    return pd.concat(frames, ignore_index=True)
