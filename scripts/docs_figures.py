"""Draw the figures of the study pages (docs/studies/*.md) as small SVG files.

    python scripts/docs_figures.py [--out docs/studies/figures] [--only clock_validation ...]

Each figure is drawn from the numbers in its page's table, copied here next to the page they come
from (the studies' runs are hours of work on shared machines and are not rerun by this script).
When a page's table changes, change the numbers here and rerun the script; commit the SVG files.
Text stays text in the SVG (``svg.fonttype: none``), and the files carry no date and a fixed hash
salt, so the same numbers give the same bytes. Every file stays well under 60 KB.
"""

from __future__ import annotations

import argparse
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "..", "docs", "studies", "figures")

STYLE = {
    "svg.fonttype": "none",     # text as text: small files, searchable labels
    "svg.hashsalt": "lsgd-docs",
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "legend.frameon": False,
}


def save(fig, out: str, name: str) -> str:
    path = os.path.join(out, f"{name}.svg")
    fig.savefig(path, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    return path


# docs/studies/local-vs-minibatch.md: final test loss per arm, seed 0 and the mean over seeds 0-2
def local_vs_minibatch(out: str) -> str:
    arms = ["minibatch_kb\n(batch K b, R steps)", "local_sgd_k\n(H = K, K R steps)", "minibatch_b\n(batch b, R steps)"]
    seed0 = [0.509, 0.482, 0.553]
    mean3 = [0.525, 0.493, 0.635]
    fig, ax = plt.subplots(figsize=(5.2, 2.8))
    x = range(len(arms))
    ax.bar([i - 0.18 for i in x], seed0, width=0.36, label="seed 0", color="#4c72b0")
    ax.bar([i + 0.18 for i in x], mean3, width=0.36, label="mean of seeds 0-2", color="#dd8452")
    for i in x:
        ax.text(i - 0.18, seed0[i] + 0.01, f"{seed0[i]:.3f}", ha="center", fontsize=7)
        ax.text(i + 0.18, mean3[i] + 0.01, f"{mean3[i]:.3f}", ha="center", fontsize=7)
    ax.set_xticks(list(x), arms, fontsize=8)
    ax.set_ylabel("final test loss (nats)")
    ax.set_ylim(0, 0.72)
    ax.legend(loc="upper left")
    return save(fig, out, "local_vs_minibatch")


# docs/studies/gravac.md: the compression gain GraVAC's controller saw, by compression factor
def gravac(out: str) -> str:
    cf = [10, 20, 160, 1000]
    cnn_low, cnn_high = [0.69, 0.45, 0.2, 0.1], [0.77, 0.45, 0.2, 0.1]
    cnn_mid = [(a + b) / 2 for a, b in zip(cnn_low, cnn_high)]
    lstm_cf = [10, 20, 40, 160, 1000]
    lstm = [0.77, 0.70, 0.72, 0.63, 0.18]   # LSTM, eps 0.7, medians (docs/studies/gravac-lstm.md)
    fig, ax = plt.subplots(figsize=(5.2, 2.8))
    ax.plot(cf, cnn_mid, "o-", color="#4c72b0", label="CNN, Fashion-MNIST (about)")
    ax.vlines(cf[0], cnn_low[0], cnn_high[0], color="#4c72b0", lw=3, alpha=0.5)
    ax.plot(lstm_cf, lstm, "s--", color="#c44e52", label="LSTM, Austen text, eps 0.7 (median)")
    ax.set_xscale("log")
    ax.set_xticks([10, 20, 40, 160, 1000], ["10x", "20x", "40x", "160x", "1000x"])
    ax.set_xlabel("compression factor (theta_min = 10x, then the candidates)")
    ax.set_ylabel("compression gain (smoothed)")
    ax.set_ylim(0, 1)
    ax.legend(loc="lower left")
    return save(fig, out, "gravac")


# docs/studies/gravac-lstm.md: final test perplexity vs bytes relative to dense (3 seeds, 95% interval)
GRAVAC_LSTM = [  # arm, final ppl, half-width, bytes vs dense
    ("DDP (dense)", 6.57, 1.42, 1.0),
    ("DGC 10x", 5.89, 0.62, 0.197),
    ("DGC 1000x", 6.23, 0.17, 0.00207),
    ("top-k 10x", 6.01, 0.29, 0.2),
    ("top-k 1000x", 6.47, 0.67, 0.00203),
    ("GraVAC eps 0.5", 6.07, 1.15, 0.16),
    ("GraVAC eps 0.7", 6.15, 1.13, 0.224),
    ("GraVAC eps 0.9", 6.24, 0.68, 0.654),
    ("Accordion top-k", 6.20, 1.41, 0.6),
]


def gravac_lstm(out: str) -> str:
    fig, ax = plt.subplots(figsize=(5.6, 3.2))
    colors = plt.get_cmap("tab10")
    for i, (arm, ppl, h, b) in enumerate(GRAVAC_LSTM):
        ax.errorbar(b, ppl, yerr=h, fmt="o", color=colors(i), capsize=3, label=arm)
    ax.set_xscale("log")
    ax.set_xlabel("bytes sent relative to the dense run (log scale)")
    ax.set_ylabel("final test perplexity (per byte)")
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=7)
    return save(fig, out, "gravac_lstm")


# docs/studies/adasum.md: Adasum / all-reduce time, latest make bench run (docs/benchmarks.md)
def adasum(out: str) -> str:
    lists = ["ResNet-50 list\n(161 tensors, 25.6M floats)", "1M-float list\n(57 tensors)"]
    w4, w8, goals = [1.15, 1.53], [1.16, 1.29], [1.3, 1.8]
    fig, ax = plt.subplots(figsize=(5.0, 2.8))
    x = range(len(lists))
    ax.bar([i - 0.18 for i in x], w4, width=0.36, label="4 ranks", color="#4c72b0")
    ax.bar([i + 0.18 for i in x], w8, width=0.36, label="8 ranks", color="#dd8452")
    for i in x:
        ax.hlines(goals[i], i - 0.42, i + 0.42, color="k", linestyles="dashed", lw=1)
        ax.text(i + 0.44, goals[i], f"goal <= {goals[i]}", va="center", fontsize=7)
        ax.text(i - 0.18, w4[i] + 0.03, f"{w4[i]:.2f}", ha="center", fontsize=7)
        ax.text(i + 0.18, w8[i] + 0.03, f"{w8[i]:.2f}", ha="center", fontsize=7)
    ax.set_xticks(list(x), lists, fontsize=8)
    ax.set_ylabel("Adasum time / all-reduce time")
    ax.set_ylim(0, 2.0)
    ax.set_xlim(-0.6, 1.9)
    ax.legend(loc="upper left")
    return save(fig, out, "adasum")


# docs/studies/swarmsgd.md: speedup of modeled time to T over DDP, swarm_fmnist at 1 Gbps
def swarmsgd(out: str) -> str:
    n = [4, 8, 16]
    arms = [("SwarmSGD, complete, H=4", [16.5, 19.8, 22.2]), ("SwarmSGD, complete, H=1", [5.38, 6.45, 7.29]),
            ("D-PSGD, ring", [0.79, 0.94, 1.07])]
    fig, ax = plt.subplots(figsize=(5.0, 2.8))
    for (arm, s), m in zip(arms, "os^"):
        ax.plot(n, s, m + "-", label=arm)
    ax.axhline(1.0, color="k", lw=0.8, ls="--")
    ax.text(16.3, 1.0, "DDP", va="center", fontsize=7)
    ax.set_yscale("log")
    ax.set_xticks(n)
    ax.set_xlabel("workers n")
    ax.set_ylabel("speedup over DDP\n(modeled time to T, log scale)")
    ax.legend(loc="center right", fontsize=7)
    return save(fig, out, "swarmsgd")


# docs/studies/gossip.md: D-PSGD on a ring, speedup over DDP, the clock before and after ports
def gossip(out: str) -> str:
    n = [4, 8, 16]
    before, after = [1.55, 1.86, 2.11], [0.79, 0.94, 1.07]
    fig, ax = plt.subplots(figsize=(5.0, 2.6))
    ax.plot(n, before, "o--", color="#999999", label="clock without ports (before)")
    ax.plot(n, after, "o-", color="#4c72b0", label="clock with ports, roofline (now)")
    ax.axhline(1.0, color="k", lw=0.8, ls=":")
    ax.text(16.3, 1.0, "DDP", va="center", fontsize=7)
    ax.set_xticks(n)
    ax.set_ylim(0, 2.4)
    ax.set_xlabel("workers n")
    ax.set_ylabel("D-PSGD (ring) speedup over DDP\n(modeled time to T)")
    ax.legend(loc="upper left", fontsize=7)
    return save(fig, out, "gossip")


# docs/studies/async-local-sgd.md: async_text, DN + DyLU against synchronous DiLoCo by heterogeneity
def async_local_sgd(out: str) -> str:
    levels = ["none", "slight", "moderate", "very"]
    t_async, t_sync = [30, 40, 50, 61], [30, 45, 90, 180]
    delta, half = [-0.01, 0.20, -0.62, -2.26], [0.01, 4.44, 2.49, 1.63]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(7.0, 2.7))
    x = range(len(levels))
    a1.bar([i - 0.18 for i in x], t_sync, width=0.36, label="sync DiLoCo", color="#999999")
    a1.bar([i + 0.18 for i in x], t_async, width=0.36, label="async DN + DyLU", color="#4c72b0")
    a1.set_xticks(list(x), levels)
    a1.set_xlabel("heterogeneity level")
    a1.set_ylabel("modeled time of the run (s)")
    a1.legend(loc="upper left", fontsize=7)
    a2.errorbar(list(x), delta, yerr=half, fmt="o", color="#4c72b0", capsize=3)
    a2.axhline(0, color="k", lw=0.8, ls="--")
    a2.set_xticks(list(x), levels)
    a2.set_xlabel("heterogeneity level")
    a2.set_ylabel("final test ppl, DN + DyLU\nminus sync DiLoCo (paired)")
    fig.tight_layout()
    return save(fig, out, "async_local_sgd")


# docs/studies/adsaga.md: suboptimality reached by each arm (seed 0, 96,000 gradients per arm)
def adsaga(out: str) -> str:
    arms = ["ADSAGA\n(async)", "async SGD", "sync SAGA"]
    subopt = [3.2e-7, 1.1e-2, 1.1e-6]
    fig, ax = plt.subplots(figsize=(4.6, 2.8))
    bars = ax.bar(arms, subopt, color=["#4c72b0", "#999999", "#dd8452"])
    ax.set_yscale("log")
    ax.set_ylim(1e-8, 1e-1)
    for b, v in zip(bars, subopt):
        ax.text(b.get_x() + b.get_width() / 2, v * 1.6, f"{v:.1e}", ha="center", fontsize=7)
    ax.set_ylabel("final f - f* (log scale)")
    return save(fig, out, "adsaga")


# docs/studies/clock-validation.md: modeled vs measured time over the window, 60 runs (4 and 8 workers)
CLOCK_VALIDATION = {  # arm: [(workers, Mbit/s, measured s, modeled s)], o calibrated per rank count
    "DDP": [(4, 50, 9.408, 9.552), (4, 200, 3.094, 3.042), (4, 1000, 1.256, 1.267), (8, 50, 11.810, 12.341), (8, 200, 4.877, 4.830), (8, 1000, 2.512, 2.686)],
    "local SGD, H=8": [(4, 50, 3.838, 3.830), (4, 200, 2.150, 2.084), (4, 1000, 1.597, 1.526), (8, 50, 5.912, 5.962), (8, 200, 3.959, 3.850), (8, 1000, 3.335, 3.304)],
    "SlowMo, H=8": [(4, 50, 3.890, 3.882), (4, 200, 2.117, 2.050), (4, 1000, 1.722, 1.639), (8, 50, 6.002, 6.015), (8, 200, 4.010, 3.859), (8, 1000, 3.365, 3.316)],
    "top-k, CF=10": [(4, 50, 4.508, 4.655), (4, 200, 2.074, 2.071), (4, 1000, 1.556, 1.362), (8, 50, 11.609, 11.589), (8, 200, 6.246, 5.500), (8, 1000, 4.054, 3.736)],
    "D-PSGD, ring": [(4, 50, 12.438, 11.704), (4, 200, 3.569, 3.116), (4, 1000, 1.218, 0.954), (8, 50, 12.992, 11.843), (8, 200, 4.376, 3.726), (8, 1000, 2.216, 1.801)],
    "D-PSGD, complete": [(4, 50, 14.623, 14.010), (4, 200, 4.151, 3.670), (4, 1000, 1.086, 0.937), (8, 50, 34.175, 32.772), (8, 200, 10.201, 8.695), (8, 1000, 2.780, 2.452)],
    "SwarmSGD, blocking": [(4, 50, 6.509, 6.511), (4, 200, 2.440, 2.312), (4, 1000, 1.124, 1.027), (8, 50, 7.408, 7.294), (8, 200, 4.067, 3.627), (8, 1000, 2.209, 1.932)],
    "SwarmSGD, non-blocking": [(4, 50, 6.432, 5.939), (4, 200, 2.256, 1.878), (4, 1000, 1.102, 0.891), (8, 50, 6.783, 5.963), (8, 200, 4.327, 3.525), (8, 1000, 2.197, 1.871)],
    "parameter server": [(4, 50, 18.116, 18.566), (4, 200, 4.993, 4.723), (4, 1000, 0.969, 1.025), (8, 50, 36.866, 37.270), (8, 200, 9.557, 9.587), (8, 1000, 2.204, 2.198)],
    "async local SGD (DN), real": [(4, 50, 4.904, 4.416), (4, 200, 3.404, 3.310), (4, 1000, 2.948, 2.901), (8, 50, 6.602, 5.800), (8, 200, 3.459, 3.312), (8, 1000, 2.964, 3.018)],
}


def clock_validation(out: str) -> str:
    fig, ax = plt.subplots(figsize=(5.8, 4.0))
    colors = {50: "#c44e52", 200: "#dd8452", 1000: "#4c72b0"}
    markers = "osD^v<>ph*"
    lo, hi = 0.7, 45
    ax.fill_between([lo, hi], [lo / 1.15, hi / 1.15], [lo * 1.15, hi * 1.15], color="#dddddd", alpha=0.6,
                    label="within 15%")
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8, label="modeled = measured")
    for (arm, runs), m in zip(CLOCK_VALIDATION.items(), markers):
        for workers, bw, meas, mod in runs:  # 8 workers: hollow
            ax.plot(meas, mod, m, color=colors[bw] if workers == 4 else "none", ms=5,
                    mec="k" if workers == 4 else colors[bw], mew=0.3 if workers == 4 else 0.9)
        ax.plot([], [], m, color="#777777", label=arm)
    for bw, c in colors.items():
        ax.plot([], [], "s", color=c, label=f"{bw} Mbit/s")
    ax.plot([], [], "o", color="none", mec="#777777", mew=0.9, label="8 workers (hollow)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured time over the window (s, log scale)")
    ax.set_ylabel("modeled time (s, log scale)")
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=7)
    return save(fig, out, "clock_validation")


# docs/studies/time-claims.md: time to target, measured on the 100 Mbit/s emulated link and modeled
def time_claims(out: str) -> str:
    demo = [("DDP", 25.5, 21.7), ("local SGD, H=8", 7.7, 3.4), ("SlowMo, H=12", 6.4, 2.3)]
    asyn = [("async DN+DyLU", 43.0, 42.6), ("sync DiLoCo", 121.1, 120.9)]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(7.2, 2.9), gridspec_kw={"width_ratios": [3, 2]})
    for ax, rows, title in ((a1, demo, "fmnist_demo: to test accuracy 0.85"),
                            (a2, asyn, "async_text, level very: to perplexity 14")):
        x = range(len(rows))
        ax.bar([i - 0.18 for i in x], [r[1] for r in rows], width=0.36, label="measured", color="#4c72b0")
        ax.bar([i + 0.18 for i in x], [r[2] for r in rows], width=0.36, label="modeled", color="#dd8452")
        ax.set_xticks(list(x), [r[0] for r in rows], rotation=35, ha="right", fontsize=7)
        ax.set_ylabel("time to target (s)")
        ax.set_title(title, fontsize=8)
    a1.legend(loc="upper right", fontsize=7)
    fig.tight_layout()
    return save(fig, out, "time_claims")


# docs/studies/swarm-at-scale.md: final accuracy, bytes per node and step, consensus distance against n
def swarm_at_scale(out: str) -> str:
    # seed 0 (docs/studies/swarm-at-scale.md); None: not run
    n = [16, 64, 256]
    acc = {
        "all-reduce SGD": [0.8625, 0.8772, 0.8730],
        "SwarmSGD H=1, ring": [0.8554, 0.7622, 0.1000],
        "SwarmSGD H=1, 4-regular": [0.8618, 0.8308, 0.7629],
        "SwarmSGD H=1, complete": [0.8663, 0.8439, 0.7890],
    }
    mb = {  # MB a worker puts on the wire per step
        "all-reduce SGD": [1.62, 1.70, 1.72],
        "SwarmSGD H=1 (complete)": [0.216, 0.218, 0.223],
        "SwarmSGD H=4 (complete)": [0.0547, 0.0831, 0.172],
        "D-PSGD (4-regular)": [3.45, 3.45, 3.45],
    }
    consensus = {
        "ring": [0.472, 24.5, 146],
        "4-regular": [0.0476, 0.123, 0.2],
        "complete": [0.0328, 0.0631, 0.0729],
    }

    def line(ax, values, **kw):
        pts = [(x, y) for x, y in zip(n, values) if y is not None]
        ax.plot(*zip(*pts), marker="o", ms=3, **kw)

    fig, (a, b, c) = plt.subplots(1, 3, figsize=(9.0, 2.6))
    for label, values in acc.items():
        line(a, values, label=label)
    a.set(xscale="log", xlabel="nodes n", ylabel="final test accuracy", xticks=n, xticklabels=[str(x) for x in n])
    a.legend(fontsize=6)
    for label, values in mb.items():
        line(b, values, label=label)
    b.set(xscale="log", yscale="log", xlabel="nodes n", ylabel="MB on the wire / node / step", xticks=n,
          xticklabels=[str(x) for x in n])
    b.legend(fontsize=6)
    for label, values in consensus.items():
        line(c, values, label=f"SwarmSGD H=1, {label}")
    c.set(xscale="log", yscale="log", xlabel="nodes n", ylabel="consensus distance (last record)", xticks=n,
          xticklabels=[str(x) for x in n])
    c.legend(fontsize=6)
    for ax in (a, b, c):
        ax.minorticks_off()  # the log axes' minor ticks: a third of the file
    fig.tight_layout()
    return save(fig, out, "swarm_at_scale")


def local_sgd_at_scale(out: str) -> str:
    n = [4, 16, 64, 256]
    # mean and 95% t half-width over seeds 0-2 (docs/studies/local-sgd-at-scale.md)
    acc = {
        "H = 1": ([0.9031, 0.8992, 0.8795, 0.4741], [0.0066, 0.0027, 0.0027, 0.4309]),
        "H = 4": ([0.9020, 0.8893, 0.8395, 0.1363], [0.0035, 0.0062, 0.0219, 0.1294]),
        "H = 16": ([0.8963, 0.8745, 0.7430, 0.1000], [0.0048, 0.0056, 0.0169, 0]),
        "H = 64": ([0.8909, 0.8523, 0.1000, 0.1000], [0.0009, 0.0132, 0, 0]),
        "SlowMo, H = 16": ([0.8989, 0.8823, 0.7522, 0.1000], [0.0031, 0.0015, 0.0161, 0]),
    }
    gb = {
        "H = 1": [2.423, 0.7565, 0.1969, 0.04809],
        "H = 4": [0.6052, 0.1891, 0.04922, 0.01202],
        "H = 16": [0.1513, 0.04687, 0.01188, 0.001717],
        "H = 64": [0.0375, 0.01131, 0.001697, None],
    }
    fig, (a, b) = plt.subplots(1, 2, figsize=(7.0, 2.8))
    for label, (values, half) in acc.items():
        a.errorbar(n, values, yerr=half, marker="o", ms=3, capsize=2, ls="--" if "SlowMo" in label else "-", label=label)
    a.set(xscale="log", xlabel="workers n", ylabel="final test accuracy", xticks=n, xticklabels=[str(x) for x in n])
    a.legend(fontsize=7)
    for label, values in gb.items():
        pts = [(x, y) for x, y in zip(n, values) if y]
        b.plot(*zip(*pts), marker="o", ms=3, label=label)
    b.set(xscale="log", yscale="log", xlabel="workers n", ylabel="GB on the wire / worker", xticks=n,
          xticklabels=[str(x) for x in n])
    fig.tight_layout()
    return save(fig, out, "local_sgd_at_scale")


def adasum_at_scale(out: str) -> str:
    n = [16, 64, 256]
    # mean and 95% t half-width over seeds 0-2 (docs/studies/adasum-at-scale.md)
    acc = {
        "averaging, linear rule": ([0.8903, 0.5677, 0.1000], [0.0150, 0.1297, 0]),
        "averaging, Adasum's rate": ([0.8948, 0.7778, 0.6415], [0.0137, 0.1193, 0.1385]),
        "Adasum of the delta": ([0.8943, 0.7874, 0.5335], [0.0056, 0.0730, 0.1717]),
    }
    gain = {  # paired by seed
        "Adasum - averaging, linear rule": ([0.0040, 0.2197, 0.4335], [0.0194, 0.1421, 0.1717]),
        "Adasum - averaging, same rate": ([-0.0005, 0.0095, -0.1080], [0.0178, 0.1837, 0.2917]),
    }
    fig, (a, b) = plt.subplots(1, 2, figsize=(7.0, 2.8))
    for label, (values, half) in acc.items():
        a.errorbar(n, values, yerr=half, marker="o", ms=3, capsize=2, label=label)
    a.set(xscale="log", xlabel="workers n (64 samples each)", ylabel="final test accuracy", xticks=n,
          xticklabels=[f"{x}\n({x * 64 // 1024}K)" for x in n])
    a.legend(fontsize=7)
    for label, (values, half) in gain.items():
        b.errorbar(n, values, yerr=half, marker="o", ms=3, capsize=2, label=label)
    b.axhline(0, color="0.5", lw=0.8)
    b.set(xscale="log", xlabel="workers n", ylabel="paired accuracy difference", xticks=n,
          xticklabels=[str(x) for x in n])
    b.legend(fontsize=7)
    for ax in (a, b):
        ax.minorticks_off()
    fig.tight_layout()
    return save(fig, out, "adasum_at_scale")


def async_at_scale(out: str) -> str:
    w = [4, 16, 64]
    # means over the seeds (docs/studies/async-at-scale.md): test perplexity, modeled seconds of the run
    ppl = {  # label: (values, color, line style)
        "sync DiLoCo": ([13.41, 12.59, 13.45], "C0", "-"),
        "naive async, final": ([111.58, 644, 124.84], "C1", "-"),
        "naive async, best": ([23.83, 203.77, 106.90], "C1", "--"),
        "DN + DyLU": ([13.40, 13.23, 15.35], "C2", "-"),
    }
    time = {"sync DiLoCo": ([90.0, 90.0, 90.0], "C0"), "naive async": ([50.7, 54.1, 54.2], "C1"),
            "DN + DyLU": ([50.3, 50.4, 53.2], "C2")}
    fig, (a, b) = plt.subplots(1, 2, figsize=(7.0, 2.8))
    for label, (values, color, ls) in ppl.items():
        a.plot(w, values, marker="o", ms=3, color=color, ls=ls, label=label)
    a.set(xscale="log", yscale="log", xlabel="workers W", ylabel="test perplexity", xticks=w,
          xticklabels=[str(x) for x in w])
    a.legend(fontsize=7)
    for label, (values, color) in time.items():
        b.plot(w, values, marker="o", ms=3, color=color, label=label)
    b.set(xscale="log", xlabel="workers W", ylabel="modeled time of the run (s)", xticks=w,
          xticklabels=[str(x) for x in w], ylim=(0, None))
    b.legend(fontsize=7)
    for ax in (a, b):
        ax.minorticks_off()
    fig.tight_layout()
    return save(fig, out, "async_at_scale")

#: diloco_family (docs/studies/diloco-family.md), means over the seeds: arm -> (final test perplexity,
#: MB sent per worker, peak KB per step, modeled seconds of the run at 1 / 0.1 / 0.01 Gbit/s)
DILOCO_FAMILY = {
    'DDP': (11.31, 980.951, 3406.1, [11.16, 81.788, 788.073]),
    'DiLoCo': (13.17, 20.436, 3406.1, [3.052, 4.524, 19.238]),
    'Streaming P=2 tau=0 fp32': (11.96, 20.436, 1854.7, [3.061, 4.533, 19.247]),
    'Streaming P=2 tau=0 4-bit': (11.98, 2.679, 240.5, [2.919, 3.112, 5.041]),
    'Streaming P=2 tau=5 fp32': (12.2, 20.436, 1854.7, [2.88, 3.933, 18.647]),
    'Streaming P=2 tau=5 4-bit': (12.28, 2.679, 240.5, [2.88, 2.88, 4.441]),
    'Streaming P=4 tau=0 fp32': (12.32, 20.436, 988.8, [3.079, 4.551, 19.265]),
    'Streaming P=4 tau=0 4-bit': (12.13, 2.679, 128.4, [2.937, 3.13, 5.059]),
    'Streaming P=4 tau=5 fp32': (12.48, 20.436, 988.8, [2.88, 3.351, 18.065]),
    'Streaming P=4 tau=5 4-bit': (12.45, 2.679, 128.4, [2.88, 2.88, 3.859]),
    'eager (P=2)': (32.88, 17.03, 1854.7, [2.88, 2.88, 13.879]),
    'DeMo': (14.3, 275.374, 956.2, [6.343, 26.17, 224.439]),
    'SparseLoCo': (15.1, 2.278, 379.7, [2.903, 3.067, 4.707]),
}


def diloco_family(out: str) -> str:
    fig, (a, b) = plt.subplots(1, 2, figsize=(7.4, 3.0))
    colors = {"DDP": "C7", "DiLoCo": "C0", "eager (P=2)": "C3", "DeMo": "C4", "SparseLoCo": "C5"}
    for label, (ppl, mb, peak, times) in DILOCO_FAMILY.items():
        color = colors.get(label, "C1" if "P=2" in label else "C2")
        marker = "s" if "4-bit" in label else "o"
        filled = "tau=5" in label or not label.startswith("Streaming")
        a.scatter(mb, ppl, s=18, marker=marker, color=color if filled else "none", edgecolors=color)
        b.scatter(peak, times[1], s=18, marker=marker, color=color if filled else "none", edgecolors=color)
    for label, color in colors.items():
        ppl, mb, peak, times = DILOCO_FAMILY[label]
        a.annotate(label.replace(" (P=2)", ", P=2"), (mb, ppl), fontsize=7, xytext=(3, 3), textcoords="offset points")
        b.annotate(label.replace(" (P=2)", ", P=2"), (peak, times[1]), fontsize=7, xytext=(3, 3),
                   textcoords="offset points")
    handles = [plt.Line2D([], [], ls="", marker="o", color="C1", label="Streaming P=2"),
               plt.Line2D([], [], ls="", marker="o", color="C2", label="Streaming P=4"),
               plt.Line2D([], [], ls="", marker="s", color="0.4", label="4-bit outer gradients"),
               plt.Line2D([], [], ls="", marker="o", color="0.4", markerfacecolor="none", label="tau = 0 (open)")]
    a.legend(handles=handles, fontsize=7, loc="upper right")
    a.set(xscale="log", yscale="log", xlabel="MB sent per worker (wire bytes)", ylabel="final test perplexity",
          yticks=[12, 15, 20, 30], yticklabels=["12", "15", "20", "30"])
    b.set(xscale="log", yscale="log", xlabel="peak KB sent in one step (peak_step_bytes)",
          ylabel="modeled time at 100 Mbit/s (s)", yticks=[3, 5, 10, 30, 100], yticklabels=["3", "5", "10", "30", "100"])
    for ax in (a, b):
        ax.minorticks_off()
    fig.tight_layout()
    return save(fig, out, "diloco_family")


FIGURES = {
    "diloco_family": diloco_family,
    "local_sgd_at_scale": local_sgd_at_scale,
    "swarm_at_scale": swarm_at_scale,
    "async_at_scale": async_at_scale,
    "adasum_at_scale": adasum_at_scale,
    "local_vs_minibatch": local_vs_minibatch,
    "gravac": gravac,
    "gravac_lstm": gravac_lstm,
    "adasum": adasum,
    "swarmsgd": swarmsgd,
    "gossip": gossip,
    "async_local_sgd": async_local_sgd,
    "adsaga": adsaga,
    "clock_validation": clock_validation,
    "time_claims": time_claims,
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=DEFAULT_OUT, help="folder of the SVG files (default docs/studies/figures)")
    ap.add_argument("--only", nargs="+", choices=sorted(FIGURES), help="draw only these figures")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    plt.rcParams.update(STYLE)
    for name in args.only or FIGURES:
        path = FIGURES[name](args.out)
        print(f"{os.path.relpath(path)}: {os.path.getsize(path) / 1024:.1f} KB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
