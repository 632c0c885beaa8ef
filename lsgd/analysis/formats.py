"""How the report writes its tables: a cell ``m ± h`` (:func:`format_stat`: the mean over an arm's
runs and the half-width of its 95% t interval, :mod:`lsgd.analysis.tables` defines both), the main
and the detailed table of an :class:`lsgd.analysis.tables.ExperimentTable` as strings
(:func:`format_main_table`, :func:`format_table`), the batch-scaling table
(:func:`format_batch_scaling`), and any such frame as a Markdown table (:func:`markdown_table`) or
a LaTeX table with booktabs rules (:func:`latex_table`). The CSV files beside report.md hold the
unformatted numbers (:func:`lsgd.analysis.report.write_report`).
"""

from __future__ import annotations

import math

import pandas as pd

from lsgd.analysis.load import _num
from lsgd.analysis.tables import (
    REPORT_BANDWIDTHS_GBPS,
    ExperimentTable,
    effective_batch,
    method_labels,
    modeled_time_column,
)
from lsgd.core.labels import format_value
from lsgd.core.labels import is_missing as _is_missing

#: Header of the tables' bytes column (``gb_sent_per_worker``: wire bytes per worker, workers only).
GB_SENT = "GB on the wire / worker"

#: Header of the peak column (``peak_step_bytes`` / 1e6), and its cell for a run that predates it.
PEAK = "peak bytes / step (MB)"
NOT_RECORDED = "-"

#: Header of the payload ratio (``bytes_vs_dense``; the detailed table only).
PAYLOAD_VS_DENSE = "payload vs dense"


def wire_vs(baseline: str) -> str:
    """Header of the wire-bytes ratio (``wire_vs_baseline``)."""
    return f"wire bytes vs {baseline}"


def peak_vs(baseline: str) -> str:
    """Header of the peak ratio (``peak_vs_baseline``)."""
    return f"peak vs {baseline}"


def modeled_speedup(baseline: str) -> str:
    """Header of the speedup on modeled time (the cluster the report's header names)."""
    return f"modeled speedup vs {baseline} (cluster above)"


def wall_speedup(baseline: str) -> str:
    """Header of the speedup on wall time (measured where the runs ran)."""
    return f"wall speedup vs {baseline} (this machine)"

#: Separator of a mean and its interval's half-width in the tables (LaTeX: ``$\pm$``).
PM = " ± "


def _fmt(value, digits: str) -> str:
    x = _num(value)
    return "n/a" if math.isnan(x) else format(x, digits)


def format_stat(mean, ci=math.nan, n_value=None, n=None, digits: str = ".3g") -> str:
    """A table cell: ``"m ± h"`` (mean and half-width of its interval, both formatted with
    ``digits``), ``"m"`` when there is no interval (one run) or it is exactly 0 (a deterministic
    quantity, the same in every run: bytes, modeled time), ``"n/a"`` when there is no mean;
    ``" (k of n)"`` appended when only ``n_value`` = k of the arm's ``n`` runs have a value."""
    m = _num(mean)
    if math.isnan(m):
        return "n/a"
    text = format(m, digits)
    h = _num(ci)
    if math.isfinite(h) and h != 0:
        text += f"{PM}{format(h, digits)}"
    k, total = _num(n_value), _num(n)
    if math.isfinite(k) and math.isfinite(total) and 0 < k < total:
        text += f" ({int(k)} of {int(total)})"
    return text


def _stat_cells(arms: pd.DataFrame, column: str, digits: str, scale: float = 1.0) -> pd.Series:
    """:func:`format_stat` of ``column`` (times ``scale``) for each arm of an ``ExperimentTable.arms`` frame."""
    if f"{column}_mean" not in arms:
        return pd.Series("n/a", index=arms.index, dtype=object)
    return pd.Series(
        [
            format_stat(_num(m) * scale, _num(h) * scale, k, n, digits)
            for m, h, k, n in zip(arms[f"{column}_mean"], arms[f"{column}_ci"], arms[f"{column}_n"], arms["n"])
        ],
        index=arms.index,
        dtype=object,
    )


def _peak_cells(arms: pd.DataFrame, column: str, digits: str, scale: float = 1.0) -> pd.Series:
    """:func:`_stat_cells` of a peak column, :data:`NOT_RECORDED` for an arm none of whose runs
    recorded ``peak_step_bytes`` (made before it)."""
    cells = _stat_cells(arms, column, digits, scale)
    if "peak_step_bytes_n" not in arms:
        return pd.Series(NOT_RECORDED, index=arms.index, dtype=object)
    return cells.where(arms["peak_step_bytes_n"].fillna(0) > 0, NOT_RECORDED)


def arm_names(arms: pd.DataFrame) -> pd.Series:
    """Row labels of the tables: the arm's label, with its status appended when that is not
    ``completed`` (``"local SGD, H=4 (running)"``)."""
    return pd.Series(
        [str(a) if st == "completed" else f"{a} ({st})" for a, st in zip(arms["arm"], arms["status"])],
        index=arms.index,
        dtype=object,
    )


def _metric_words(metric: str) -> tuple[str, str]:
    """(column word, digits) of the eval metric."""
    return ("test acc", ".4f") if metric == "test_acc" else ("test ppl", ".2f")


def _paired_cells(arms: pd.DataFrame, column: str, digits: str) -> pd.Series:
    """Cells of the paired difference (:func:`lsgd.analysis.tables._with_paired_differences`):
    ``baseline``, ``+m ± h``, ``+m (1 pair)`` or ``n/a`` (no seed in common)."""
    def cell(m, h, n, with_):
        if with_ == "baseline":
            return "baseline"
        if not n or not math.isfinite(m):
            return "n/a"
        if n == 1:
            return f"{format(m, '+' + digits)} (1 pair)"
        return f"{format(m, '+' + digits)}{PM}{format(h, digits)}"

    pre = f"paired_diff_{column}"
    return pd.Series([cell(*v) for v in zip(arms[f"{pre}_mean"], arms[f"{pre}_ci"], arms[f"{pre}_n"],
                                           arms["paired_with"])], index=arms.index, dtype=object)  # fmt: skip


def format_main_table(t: ExperimentTable) -> pd.DataFrame:
    """The report's main table: one row per arm, cells ``mean ± half-width`` (strings).

    Columns: ``method`` (the arm's label, :func:`arm_names`), ``n`` (runs = seeds), final and best
    test accuracy (or perplexity), one byte measure: ``GB on the wire / worker`` and ``wire bytes
    vs <baseline>`` (its ratio to the baseline run's), then ``modeled time (s)``, ``time to T,
    modeled (s)``, ``modeled speedup vs <baseline> (cluster above)`` with ``wall speedup vs
    <baseline> (this machine)`` beside it (the same baseline runs and T, on wall time), and ``Δ
    final <metric> vs <baseline>, paired`` (the mean difference from the baseline over the seeds
    both have, with the paired t interval; :func:`lsgd.analysis.tables._with_paired_differences`),
    as :mod:`lsgd.analysis.tables` defines them.
    """
    a = t.arms
    m, acc_digits = _metric_words(t.metric)
    out = pd.DataFrame({"method": arm_names(a), "n": a["n"].map(lambda n: str(int(n)))})
    out[f"final {m}"] = _stat_cells(a, f"final_{t.metric}", acc_digits)
    out[f"best {m}"] = _stat_cells(a, f"best_{t.metric}", acc_digits)
    out[GB_SENT] = _stat_cells(a, "gb_sent_per_worker", ".4g")
    out[wire_vs(t.baseline)] = _stat_cells(a, "wire_vs_baseline", ".3g")
    out["modeled time (s)"] = _stat_cells(a, "modeled_time_s", ".3g")
    out["time to T, modeled (s)"] = _stat_cells(a, "time_to_T_modeled_s", ".3g")
    out[modeled_speedup(t.baseline)] = _stat_cells(a, "speedup_modeled", ".2f")
    out[wall_speedup(t.baseline)] = _stat_cells(a, "speedup_wall", ".2f")
    out[f"Δ final {m} vs {t.baseline}, paired"] = _paired_cells(a, f"final_{t.metric}", acc_digits)
    return out


def format_table(t: ExperimentTable) -> pd.DataFrame:
    """The report's detailed table: one row per arm with every number (``mean ± half-width``),
    readable headers, ``n/a`` for missing.

    Columns: ``method``, ``algo`` and the other differing config keys as written in the configs,
    ``status``, ``n``, ``seeds``, final and best metric, final test and train loss, GB on the
    wire per worker and its ratio to the baseline's, peak bytes / step (MB, ``-`` for runs made
    before it) and its ratio, payload vs dense (``comm_bytes`` / the dense run's), comm rounds,
    samples, wall and modeled time (s), modeled time at 1 and 10 Gbps (when runs log the
    alpha-beta terms), time to T on wall and modeled time, the modeled and the wall speedup,
    the paired-by-seed difference of the final metric from the baseline and the baseline arm it is
    paired with, and the target columns when runs have ``target_acc``.
    """
    a = t.arms
    m, acc_digits = _metric_words(t.metric)
    out = pd.DataFrame({"method": arm_names(a), "algo": a["algo"].map(format_value)})
    for k in t.keys:
        if k != "algo.name":
            out[k] = a[k].map(format_value)
    out["status"] = a["status"].astype(str)
    out["n"] = a["n"].map(lambda n: str(int(n)))
    out["seeds"] = a["seeds"].astype(str) if "seeds" in a else ""
    out[f"final {m}"] = _stat_cells(a, f"final_{t.metric}", acc_digits)
    out[f"best {m}"] = _stat_cells(a, f"best_{t.metric}", acc_digits)
    out["final test loss"] = _stat_cells(a, "final_test_loss", ".4f")
    out["final train loss"] = _stat_cells(a, "final_train_loss", ".4f")
    out[GB_SENT] = _stat_cells(a, "gb_sent_per_worker", ".4g")
    out[wire_vs(t.baseline)] = _stat_cells(a, "wire_vs_baseline", ".3g")
    out[PEAK] = _peak_cells(a, "peak_step_bytes", ".4g", scale=1e-6)
    out[peak_vs(t.baseline)] = _peak_cells(a, "peak_vs_baseline", ".3g")
    out[PAYLOAD_VS_DENSE] = _stat_cells(a, "bytes_vs_dense", ".3g")
    out["comm rounds"] = _stat_cells(a, "comm_rounds", ".0f")
    out["samples"] = _stat_cells(a, "samples", ".0f")
    out["wall time (s)"] = _stat_cells(a, "wall_time_s", ".1f")
    out["modeled time (s)"] = _stat_cells(a, "modeled_time_s", ".3g")
    for bw in REPORT_BANDWIDTHS_GBPS:  # only for runs that log the alpha-beta terms; blank otherwise
        col = modeled_time_column(bw)
        if f"{col}_mean" in a and a[f"{col}_mean"].notna().any():
            cells = _stat_cells(a, col, ".3g")
            out[f"modeled @{format_value(bw)} Gbps (s)"] = cells.where(a[f"{col}_mean"].notna(), "")
    out["time to T, wall (s)"] = _stat_cells(a, "time_to_T_wall_s", ".1f")
    out["time to T, modeled (s)"] = _stat_cells(a, "time_to_T_modeled_s", ".3g")
    out[modeled_speedup(t.baseline)] = _stat_cells(a, "speedup_modeled", ".2f")
    out[wall_speedup(t.baseline)] = _stat_cells(a, "speedup_wall", ".2f")
    out[f"Δ final {m} vs {t.baseline}, paired"] = _paired_cells(a, f"final_{t.metric}", acc_digits)
    out["paired with"] = a["paired_with"].astype(str)
    if "time_to_target_s_mean" in a:
        out["target acc"] = _stat_cells(a, "target_acc", ".4f")
        out["time to target, wall (s)"] = _stat_cells(a, "time_to_target_s", ".1f")
        out["time to target, modeled (s)"] = _stat_cells(a, "modeled_time_to_target_s", ".3g")
    return out


def markdown_table(frame: pd.DataFrame) -> str:
    """``frame`` (cells already strings) as a GitHub-flavoured Markdown table, ``|`` escaped.

    Uses :meth:`pandas.DataFrame.to_markdown` when ``tabulate`` is installed, else a plain writer.
    """
    cells = pd.DataFrame(
        {str(c).replace("|", "\\|"): frame[c].astype(str).str.replace("|", "\\|").str.replace("\n", " ") for c in frame.columns}
    )
    try:
        return cells.to_markdown(index=False, disable_numparse=True)
    except ImportError:
        pass
    header = list(cells.columns)
    body = cells.values.tolist()
    widths = [max([len(h)] + [len(row[i]) for row in body]) for i, h in enumerate(header)]

    def line(values):
        return "| " + " | ".join(v.ljust(w) for v, w in zip(values, widths)) + " |"

    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, body)])


#: LaTeX's special characters and how text writes them (the caption; cells are escaped by pandas).
_LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}  # fmt: skip


def latex_escape(text: str) -> str:
    """``text`` with LaTeX's special characters escaped (as pandas' ``escape="latex"`` does)."""
    return "".join(_LATEX_SPECIAL.get(ch, ch) for ch in str(text))


def latex_table(frame: pd.DataFrame, caption: str, label: str) -> str:
    """``frame`` (cells already strings, e.g. :func:`format_main_table`) as a LaTeX ``table`` with
    booktabs rules (``\\toprule``, ``\\midrule``, ``\\bottomrule``; needs ``\\usepackage{booktabs}``),
    written by :meth:`pandas.io.formats.style.Styler.to_latex`: text escaped for LaTeX, ``±`` as
    ``$\\pm$`` and ``Δ`` as ``$\\Delta$`` (pdflatex knows neither character), the first column
    left-aligned and the others right-aligned; ``caption`` is escaped too (``label`` must be a plain
    LaTeX label)."""
    styler = frame.style.hide(axis="index").format(escape="latex").format_index(escape="latex", axis=1)
    tex = styler.to_latex(
        hrules=True,
        column_format="l" + "r" * (frame.shape[1] - 1),
        caption=latex_escape(caption),
        label=label,
        position="htbp",
        position_float="centering",
    )
    return tex.replace(PM.strip(), r"$\pm$").replace("Δ", r"$\Delta$")


def format_batch_scaling(
    table: pd.DataFrame,
    summaries: pd.DataFrame | None = None,
    ci: pd.DataFrame | None = None,
    n: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """The report's view of a :func:`lsgd.analysis.tables.batch_scaling_table`: a ``method`` column, one column per
    effective batch, formatted values (``m ± h (n=k)`` when ``ci`` and ``n``, the same table with
    ``stat="ci"`` and ``stat="n"``, are given); an empty cell shows the status of the runs there
    that did not complete (e.g. ``diverged``) when ``summaries`` is given, else is blank."""
    metric = table.attrs.get("metric", "test_acc")
    digits = ".4f" if metric == "test_acc" else ".2f"
    status: dict[tuple, str] = {}
    if summaries is not None and "status" in summaries:
        cells = pd.DataFrame(
            {"method": method_labels(summaries), "batch": effective_batch(summaries), "status": summaries["status"]}
        )
        for (m, b), st in cells[cells["status"] != "completed"].groupby(["method", "batch"])["status"]:
            status[(m, float(b))] = "/".join(sorted(set(map(str, st))))

    def cell(m, b, v):
        if _is_missing(v):
            return status.get((m, float(b)), "")
        if ci is None or n is None:
            return _fmt(v, digits)
        return f"{format_stat(v, ci.at[m, b], digits=digits)} (n={int(n.at[m, b])})"

    out = pd.DataFrame({"method": [str(m) for m in table.index]})
    for b in table.columns:
        out[format_value(b)] = [cell(m, b, v) for m, v in zip(table.index, table[b])]
    return out
