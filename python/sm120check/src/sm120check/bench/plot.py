"""The crossover plot (matplotlib is optional: imported here only, with a clear message when missing)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from sm120check.bench.crossover import Analysis, ModeAnalysis, model_throughput
from sm120check.bench.crossover_report import SweepFacts

if TYPE_CHECKING:
    from matplotlib.figure import Figure


class PlotUnavailable(RuntimeError):
    pass


def _pyplot() -> Any:  # matplotlib.pyplot, imported only when a plot is drawn
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotUnavailable(
            "--png needs matplotlib, which is not installed: `pip install matplotlib` (the rest works without it)"
        ) from None
    return plt


def build_figure(analysis: Analysis, facts: SweepFacts) -> Figure:
    """Throughput of both servers, then the speedup (spec / base) with its line at 1.0; ticks at the measured levels,
    the crossover marked, and the levels above the speculative server's running-request cap shaded."""
    plt = _pyplot()
    cs = [lv.concurrency for lv in analysis.levels]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 8), sharex=True)
    for side, label, marker in (("base", "plain", "o"), ("spec", "EAGLE-3", "s")):
        spreads = [getattr(lv, side) for lv in analysis.levels]
        top.errorbar(cs, [s.mean for s in spreads], yerr=[s.std for s in spreads], marker=marker, capsize=3,
                     label=label)  # fmt: skip
    model = analysis.model
    if model is not None:
        dense = [cs[0] * (cs[-1] / cs[0]) ** (i / 100) for i in range(101)]
        top.plot(dense, [model_throughput(model, c, False) for c in dense], "--", color="C0", alpha=0.5,
                 label="plain, cost model")  # fmt: skip
        top.plot(dense, [model_throughput(model, c, True) for c in dense], "--", color="C1", alpha=0.5,
                 label="EAGLE-3, cost model")  # fmt: skip
    top.set_ylabel("Total output throughput (tok/s)")
    bottom.errorbar(cs, [lv.speedup for lv in analysis.levels], yerr=[lv.speedup_std for lv in analysis.levels],
                    marker="s", color="C1", capsize=3, label="speedup")  # fmt: skip
    bottom.axhline(1.0, color="k", linewidth=1, label="break-even (1.0)")
    bottom.set_ylabel("Speedup (EAGLE-3 / plain)")
    cross = analysis.crossover
    for ax in (top, bottom):
        ax.set_xscale("log")
        ax.set_xticks(cs)
        ax.set_xticklabels([str(c) for c in cs])
        ax.minorticks_off()
        ax.grid(True, alpha=0.3)
        if cross.value is not None:
            ax.axvline(cross.value, color="k", linestyle=":", label=f"crossover C={cross.value:.1f}")
            if cross.low is not None and cross.high is not None:
                ax.axvspan(cross.low, cross.high, color="k", alpha=0.08)
        if facts.spec_cap is not None and cs[-1] > facts.spec_cap:
            ax.axvspan(facts.spec_cap, cs[-1] * 1.15, color="C3", alpha=0.1,
                       label=f"above the EAGLE-3 server's cap ({facts.spec_cap} running)")  # fmt: skip
    top.set_title(facts.title() or "Speculation crossover")
    top.legend(fontsize="small")
    bottom.legend(fontsize="small")
    bottom.set_xlabel("Concurrency (requests in flight)")
    fig.tight_layout()
    figure: Figure = fig
    return figure


_X_LABELS = {"concurrency": "Concurrency (requests in flight)", "rate": "Offered request rate (requests/s)"}
_Y_LABELS = {
    "throughput": "Total output throughput (tok/s)",
    "goodput": "Goodput (requests/s meeting --slo)",
    "token-goodput": "Token goodput (tok/s of requests meeting --slo)",
}


def build_mode_figure(mode: ModeAnalysis, facts: SweepFacts) -> Figure:
    """The same two panels for another axis or metric (`crossover --x rate`, `--metric goodput`): the metric of both
    servers, then their ratio with its line at 1.0; ticks at the measured levels."""
    plt = _pyplot()
    xs = [lv.x for lv in mode.levels]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 8), sharex=True)
    for side, label, marker in (("base", "plain", "o"), ("spec", "EAGLE-3", "s")):
        spreads = [getattr(lv, side) for lv in mode.levels]
        top.errorbar(xs, [s.mean for s in spreads], yerr=[s.std for s in spreads], marker=marker, capsize=3,
                     label=label)  # fmt: skip
    bottom.errorbar(xs, [lv.ratio for lv in mode.levels], yerr=[lv.ratio_std for lv in mode.levels], marker="s",
                    color="C1", capsize=3, label="ratio")  # fmt: skip
    bottom.axhline(1.0, color="k", linewidth=1, label="break-even (1.0)")
    top.set_ylabel(_Y_LABELS.get(mode.metric, mode.metric))
    bottom.set_ylabel("EAGLE-3 / plain")
    for ax in (top, bottom):
        ax.set_xscale("log")
        ax.set_xticks(xs)
        ax.set_xticklabels([f"{x:g}" for x in xs])
        ax.minorticks_off()
        ax.grid(True, alpha=0.3)
        if mode.crossover.value is not None:
            ax.axvline(mode.crossover.value, color="k", linestyle=":", label=f"crossover {mode.crossover.value:.3g}")
    top.set_title(facts.title() or "Speculation crossover")
    top.legend(fontsize="small")
    bottom.legend(fontsize="small")
    bottom.set_xlabel(_X_LABELS.get(mode.x_axis, mode.x_axis))
    fig.tight_layout()
    figure: Figure = fig
    return figure


def write_png(analysis: Analysis | ModeAnalysis, path: Path, facts: SweepFacts) -> None:
    plt = _pyplot()
    fig = build_mode_figure(analysis, facts) if isinstance(analysis, ModeAnalysis) else build_figure(analysis, facts)
    try:
        fig.savefig(path, dpi=120)
    finally:
        plt.close(fig)
