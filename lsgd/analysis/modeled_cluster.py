"""What the modeled numbers model: the cluster each run's config describes, in words, for the
report's header and the captions (and axis label) of its modeled-time figures.

Every modeled number of a report (``modeled_time_s``, time to T on it, the modeled speedups, the
modeled @1 / @10 Gbps columns) is the cluster clock's time (docs/clock.md) on the cluster that the
run's config.yaml describes, not on the machine that ran it. :func:`cluster_text` writes that
cluster from one run's row of :func:`lsgd.analysis.load_summaries` (its config keys, and the
summary's ``profile_*`` fields for what the config left to a default):

- compute: ``cluster.compute=measured`` (this machine's measured compute), else
  ``cluster.step_time_s`` when set, else the ``cluster.device`` preset at its MFU (``cluster.mfu``,
  or where that is null the MFU the profile applied, summary.json's ``profile_mfu``);
- workers per node (``cluster.gpus_per_node``; above 1, also the intra-node link
  ``network.intra_node.*``), and relative worker speeds (``cluster.speeds``) where set;
- the inter-node link: ``network.bandwidth_gbps``, ``network.latency_us``, ``network.ports``
  (messages a port carries at once), ``network.wire_overhead`` where set and not 1;
- the what-if links of the modeled @ Gbps columns (``network.report_gbps``, each with its
  preset's latency: :func:`lsgd.clock.network.what_if_latency_us`).

A run made before ``cluster.*`` existed says so. Runs are grouped by the config values of
:data:`CLUSTER_KEYS` (:func:`cluster_groups`), so a running run (no summary yet) is on the same
cluster as its completed seeds.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

import pandas as pd

from lsgd.analysis.load import _hashable, _num
from lsgd.clock.network import what_if_latency_us
from lsgd.core.labels import format_value
from lsgd.core.labels import is_missing as _is_missing

#: The config keys that define a run's modeled cluster (its compute and its links).
CLUSTER_KEYS = (
    "cluster.compute", "cluster.device", "cluster.mfu", "cluster.step_time_s", "cluster.speeds",
    "cluster.gpus_per_node", "network.bandwidth_gbps", "network.latency_us", "network.ports",
    "network.wire_overhead", "network.intra_node.bandwidth_gbps", "network.intra_node.latency_us",
    "network.report_gbps",
)  # fmt: skip

#: What-if bandwidths (Gbps) written for a run whose config has no ``network.report_gbps``: the
#: report's modeled @1 / @10 Gbps columns (:data:`lsgd.analysis.tables.REPORT_BANDWIDTHS_GBPS`).
DEFAULT_WHAT_IF_GBPS = (1.0, 10.0)


def _seconds(s: float) -> str:
    """``0.00021`` -> ``0.21 ms``: three significant digits in s, ms or us."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(s) >= scale or unit == "us":
            return f"{s / scale:.3g} {unit}"
    return f"{s:g} s"  # unreachable


def _value(row: Mapping, key: str):
    value = row.get(key)
    return None if _is_missing(value) else value


def _bandwidths(row: Mapping) -> list[float]:
    value = _value(row, "network.report_gbps")
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            value = None
    if isinstance(value, (int, float)):
        value = [value]
    if not isinstance(value, (list, tuple)) or not value:
        return list(DEFAULT_WHAT_IF_GBPS)
    return [float(v) for v in value if math.isfinite(_num(v))]


def compute_text(row: Mapping) -> str:
    """The compute part of :func:`cluster_text`: ``compute: a100 preset at MFU 0.4``,
    ``compute: 50 ms / step (cluster.step_time_s)``, ``compute: measured on the machine that ran it
    (cluster.compute=measured)``, or that the run predates ``cluster.*``."""
    mode = _value(row, "cluster.compute") or _value(row, "profile_mode")
    device = _value(row, "cluster.device") or _value(row, "profile_device")
    if mode is None and device is None:
        return "compute: not recorded (a run made before `cluster.*`)"
    if mode == "measured":
        return "compute: measured on the machine that ran it (`cluster.compute=measured`)"
    step = _num(_value(row, "cluster.step_time_s"))
    if math.isfinite(step):
        return f"compute: {_seconds(step)} / step (`cluster.step_time_s`)"
    mfu = _num(_value(row, "cluster.mfu"))
    if not math.isfinite(mfu):
        mfu = _num(_value(row, "profile_mfu"))
    at = f"at MFU {mfu:g}" if math.isfinite(mfu) else "at its default MFU"
    what = "`cpu` profile (rates measured by `lsgd calibrate` on the machine that ran it)" if device == "cpu" \
        else f"`{format_value(device)}` preset"  # fmt: skip
    return f"compute: {what} {at}"


def _link(bandwidth, latency) -> str:
    bw, lat = _num(bandwidth), _num(latency)
    if not math.isfinite(bw):
        return "not recorded"
    return f"{bw:g} Gbps, {lat:g} us latency" if math.isfinite(lat) else f"{bw:g} Gbps"


def cluster_text(row: Mapping) -> str:
    """One run's modeled cluster in words (the module docstring lists the parts), e.g.
    ``compute: `a100` preset at MFU 0.4; 1 worker / node; inter-node link 10 Gbps, 10 us latency,
    1 port (`network.ports`); what-if links 1 Gbps (50 us), 10 Gbps (10 us)``.

    Args:
        row: a row of :func:`lsgd.analysis.load_summaries` (or a mapping of flattened config keys,
            with the summary's ``profile_*`` fields where known).
    """
    parts = [compute_text(row)]
    speeds = _value(row, "cluster.speeds")
    if speeds is not None and format_value(speeds) not in ("none", "[]"):
        parts.append(f"worker speeds {format_value(speeds)} (`cluster.speeds`)")
    per_node = _num(_value(row, "cluster.gpus_per_node"))
    if math.isfinite(per_node):
        node = f"{per_node:g} worker{'s' if per_node != 1 else ''} / node"
        if per_node > 1:
            intra = _link(row.get("network.intra_node.bandwidth_gbps"), row.get("network.intra_node.latency_us"))
            node += f" (intra-node link {intra})"
        parts.append(node)
    link = f"inter-node link {_link(row.get('network.bandwidth_gbps'), row.get('network.latency_us'))}"
    ports = _num(_value(row, "network.ports"))
    if math.isfinite(ports):
        link += f", {ports:g} port{'s' if ports != 1 else ''} (`network.ports`)"
    overhead = _num(_value(row, "network.wire_overhead"))
    if math.isfinite(overhead) and overhead != 1:
        link += f", wire overhead x{overhead:.4g}"
    parts.append(link)
    latency = _num(row.get("network.latency_us"))
    what_if = []
    for bw in _bandwidths(row):  # each the preset of its bandwidth, latency included
        lat = what_if_latency_us(bw, latency)
        what_if.append(f"{bw:g} Gbps ({lat:g} us)" if math.isfinite(lat) else f"{bw:g} Gbps")
    if what_if:
        parts.append("what-if links " + ", ".join(what_if))
    return "; ".join(parts)


def short_cluster_text(row: Mapping) -> str:
    """:func:`cluster_text` in a few words, for a figure's axis label: ``a100 at MFU 0.4, 1 worker /
    node, 10 Gbps, 10 us``."""
    compute = compute_text(row).removeprefix("compute: ")
    compute = compute.split(" (")[0].replace("`", "").replace(" preset", "")
    parts = [compute]
    per_node = _num(_value(row, "cluster.gpus_per_node"))
    if math.isfinite(per_node):
        parts.append(f"{per_node:g} worker{'s' if per_node != 1 else ''} / node")
    bw, lat = _num(row.get("network.bandwidth_gbps")), _num(row.get("network.latency_us"))
    if math.isfinite(bw):
        parts.append(f"{bw:g} Gbps" + (f", {lat:g} us" if math.isfinite(lat) else ""))
    return ", ".join(parts)


def _group_key(row: Mapping) -> tuple:
    return tuple(_hashable(row.get(k)) for k in CLUSTER_KEYS)


def cluster_groups(summaries: pd.DataFrame) -> list[tuple[str, str, list[str]]]:
    """The modeled clusters of ``summaries``' runs: ``[(text, short text, [run_dir, ...])]``, one
    per distinct set of :data:`CLUSTER_KEYS` values, in order of first appearance. The text is
    that of the group's first run that has a summary (its ``profile_mfu`` fills a null
    ``cluster.mfu``)."""
    groups: dict[tuple, list] = {}
    for _, row in summaries.iterrows():
        groups.setdefault(_group_key(row), []).append(row)
    out = []
    for rows in groups.values():
        first = next((r for r in rows if math.isfinite(_num(r.get("profile_mfu")))), rows[0])
        out.append((cluster_text(first), short_cluster_text(first), [str(r["run_dir"]) for r in rows]))
    return out


def cluster_lines(summaries: pd.DataFrame, arm_of: Mapping[str, tuple[str, str]]) -> list[str]:
    """The report's "Modeled cluster" paragraph: one line when every run models one cluster, else
    one bullet per experiment and cluster naming its arms.

    Args:
        summaries: every run of the report (:func:`lsgd.analysis.load_summaries` rows).
        arm_of: ``{run_dir: (experiment, arm label)}``.
    """
    groups = cluster_groups(summaries)
    what = "what every modeled time and modeled speedup below models"
    texts = list(dict.fromkeys(text for text, _, _ in groups))
    if len(texts) == 1:
        return [f"**Modeled cluster** ({what}): {texts[0]}."]
    lines = [f"**Modeled cluster** ({what}): the arms differ, each on its own:", ""]
    for text, arms in arm_cluster_texts(groups, arm_of):
        lines.append(f"- {arms}: {text}.")
    return lines


def arm_cluster_texts(
    groups, arm_of: Mapping[str, tuple[str, str]], experiment: str | None = None
) -> list[tuple[str, str]]:
    """``[(cluster text, "experiment: arm, arm")]`` per experiment and cluster of ``groups``
    (:func:`cluster_groups`), arms in the order of ``arm_of``; only ``experiment``'s arms when
    given (then without its name)."""
    text_of = {d: text for text, _, dirs in groups for d in dirs}
    out: dict[tuple[str, str], list[str]] = {}
    for d, (exp, arm) in arm_of.items():
        if d not in text_of or (experiment is not None and exp != experiment):
            continue
        arms = out.setdefault((exp, text_of[d]), [])
        if arm not in arms:
            arms.append(arm)
    return [(text, ", ".join(arms) if experiment is not None else f"`{exp}`: {', '.join(arms)}")
            for (exp, text), arms in out.items()]  # fmt: skip
