"""PNG figures for compare and simulate results (matplotlib, Agg backend: no display needed).

* `compare_plots(results, dir)`: one figure per workload with three panels - TTFT CDF per setup
  (log x), fleet prefix-cache hit rate per setup, requests per replica per setup (grouped bars;
  a flat group is an even load). Returns the written paths.
* `simulate_plot(results, path)`: hit rate and TTFT p50/p99 per policy of a simulate run.
* `goodput_plot(result, path)`: TTFT p99 against the request rate per replica, one line per
  setup (a failed step as an x), the SLO as a horizontal line (`loadtest.goodput`).

Inputs are the JSON dicts compare/simulate write, so figures can be redrawn from saved results.
Cost: one matplotlib figure per call; dominated by PNG encoding (~0.2 s each).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # after use("Agg"): the backend must be chosen first

from loadtest.report import slug

__all__ = ["compare_plots", "goodput_plot", "simulate_plot"]


def _ttft_cdf(ax: Any, ttft: Mapping[str, Sequence[float]]) -> None:
    cmap = plt.get_cmap("tab20")  # one colour per setup (the default cycle has 10)
    for i, (name, values) in enumerate(ttft.items()):
        if not values:
            continue
        xs = [v * 1000 for v in sorted(values)]
        ys = [(i + 1) / len(xs) for i in range(len(xs))]
        # setups behind the splitter (-xN) dashed, so they read as variants of their router
        ax.step(xs, ys, where="post", label=name, color=cmap((2 * i) % 20 + (2 * i) // 20 % 2),
                linestyle="--" if "-x" in name else "-")
    ax.set_xscale("log")
    ax.set_xlabel("TTFT (ms, log)")
    ax.set_ylabel("fraction of requests")
    ax.set_title("TTFT CDF")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)


def _hit_rates(ax: Any, setups: Mapping[str, Mapping[str, Any]]) -> None:
    names = list(setups)
    values = [100 * (setups[n].get("hit_rate") or 0.0) for n in names]
    ax.barh(names, values, color="tab:green")
    for i, v in enumerate(values):
        ax.text(v + 1, i, f"{v:.0f}%", va="center", fontsize=7)
    ax.set_xlim(0, 110)
    ax.invert_yaxis()
    ax.set_xlabel("fleet prefix-cache hit rate (%)")
    ax.set_title("hit rate")
    ax.tick_params(axis="y", labelsize=7)


def _load(ax: Any, setups: Mapping[str, Mapping[str, Any]]) -> None:
    names = list(setups)
    replicas = sorted({r for s in setups.values() for r in (s.get("per_replica") or {})})
    width = 0.8 / max(len(replicas), 1)
    for j, rep in enumerate(replicas):
        vals = [((setups[n].get("per_replica") or {}).get(rep) or {}).get("requests") or 0
                for n in names]
        ax.bar([i + j * width for i in range(len(names))], vals, width, label=rep)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(names))])
    ax.set_xticklabels(names, rotation=35, ha="right", fontsize=7)
    ax.set_ylabel("requests")
    ax.set_title("requests per replica")
    ax.legend(fontsize=7)


def compare_plots(results: Mapping[str, Any], out_dir: Path, prefix: str = "compare") -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for wl, block in results.get("workloads", {}).items():
        setups = block.get("setups") or {}
        if not setups:
            continue
        fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
        _ttft_cdf(axes[0], block.get("ttft") or {})
        _hit_rates(axes[1], setups)
        _load(axes[2], setups)
        fig.suptitle(f"{wl}: {len(setups)} setups, same requests, cold fleet each")
        fig.tight_layout()
        path = out_dir / f"{prefix}-{slug(wl)}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        paths.append(path)
    return paths


def simulate_plot(results: Sequence[Mapping[str, Any]], path: Path, title: str = "") -> Path:
    """``results``: `SimResult.to_json()` dicts, one per policy."""
    path.parent.mkdir(parents=True, exist_ok=True)
    names = [str(r["config"]["policy"]) for r in results]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    a.bar(names, [100 * r["hit_rate"] for r in results], color="tab:green")
    a.set_ylabel("fleet prefix-cache hit rate (%)")
    a.set_ylim(0, 100)
    x = range(len(names))
    b.bar([i - 0.2 for i in x], [1000 * r["ttft"]["p50"] for r in results], 0.4, label="p50")
    b.bar([i + 0.2 for i in x], [1000 * r["ttft"]["p99"] for r in results], 0.4, label="p99")
    b.set_xticks(list(x))
    b.set_xticklabels(names)
    b.set_yscale("log")
    b.set_ylabel("TTFT (ms, log)")
    b.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def goodput_plot(result: Mapping[str, Any], path: Path) -> Path:
    """One goodput cell (`loadtest.goodput.measure`'s JSON): TTFT p99 against rate per setup."""
    n = result["replicas"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, s in result["setups"].items():
        ok = [(st["rate"] / n, st["ttft_p99"] * 1000) for st in s["steps"]
              if st["ttft_p99"] is not None and not st["errors"]]
        bad = [(st["rate"] / n, st["ttft_p99"] * 1000 if st["ttft_p99"] is not None
                else result["slo"] * 1000) for st in s["steps"]
               if st["errors"] or st["ttft_p99"] is None]
        line = ax.plot([x for x, _ in ok], [y for _, y in ok], marker="o", label=name)
        if bad:
            ax.scatter([x for x, _ in bad], [y for _, y in bad], marker="x", s=60,
                       color=line[0].get_color() if line else None)
    ax.axhline(result["slo"] * 1000, color="black", linestyle=":", label="SLO")
    ax.set_yscale("log")
    ax.set_xlabel("request rate (requests/s per replica)")
    ax.set_ylabel("TTFT p99 (ms, log)")
    ax.set_title(f"goodput: {result['workload']['name']}, {n} replicas "
                 f"(x: a step with errors)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
