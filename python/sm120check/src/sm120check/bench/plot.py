"""The crossover plot (matplotlib is optional: imported here only, with a clear message when missing)."""

from __future__ import annotations

from pathlib import Path

from sm120check.bench.crossover import Analysis, model_throughput


class PlotUnavailable(RuntimeError):
    pass


def write_png(analysis: Analysis, path: Path, names: tuple[str, str]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotUnavailable(
            "--png needs matplotlib, which is not installed: `pip install matplotlib` (the rest works without it)"
        ) from None
    cs = [lv.concurrency for lv in analysis.levels]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 8), sharex=True)
    for ax, key, title in ((top, "", "Total output throughput (tok/s)"), (bottom, "_per_req", "Per-request tok/s")):
        for side, name, marker in (("base", names[0], "o"), ("spec", names[1], "s")):
            spreads = [getattr(lv, side + key) for lv in analysis.levels]
            ax.errorbar(cs, [s.mean for s in spreads], yerr=[s.std for s in spreads], marker=marker, capsize=3,
                        label=f"{side}: {name}")  # fmt: skip
        ax.set_ylabel(title)
        ax.set_xscale("log")
        ax.grid(True, which="both", alpha=0.3)
    model = analysis.model
    if model is not None:
        dense = [cs[0] * (cs[-1] / cs[0]) ** (i / 100) for i in range(101)]
        top.plot(dense, [model_throughput(model, c, False) for c in dense], "--", color="C0", alpha=0.6,
                 label="base model")  # fmt: skip
        top.plot(dense, [model_throughput(model, c, True) for c in dense], "--", color="C1", alpha=0.6,
                 label="spec model")  # fmt: skip
    cross = analysis.crossover
    if cross.value is not None:
        for ax in (top, bottom):
            ax.axvline(cross.value, color="k", linestyle=":", label=f"crossover C={cross.value:.1f}")
            if cross.low is not None and cross.high is not None:
                ax.axvspan(cross.low, cross.high, color="k", alpha=0.08)
    top.set_title("Speculation crossover")
    top.legend()
    bottom.set_xlabel("Concurrency (requests in flight)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
