"""``specctl bench``'s plots: goodput per configuration and category, and latency percentiles (PNG with
matplotlib installed, else SVG)."""

from __future__ import annotations

from pathlib import Path


def plot(agg: dict, folder: Path) -> list[Path]:
    """Goodput per configuration and category (mean with min-max), and TTFT/ITL p50/p99."""
    folder.mkdir(parents=True, exist_ok=True)
    configs = list(agg)
    cats = sorted({c for v in agg.values() for c in v}, key=lambda c: (c != "overall", c))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return _plot_svg(agg, folder, configs, cats)
    paths = []
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(cats) * len(configs) / 2), 4))
    width = 0.8 / max(len(configs), 1)
    for i, config in enumerate(configs):
        means, lo, hi = [], [], []
        for c in cats:
            g = agg[config].get(c, {}).get("goodput_tok_s", {})
            means.append(g.get("mean", 0.0))
            lo.append(g.get("mean", 0.0) - g.get("min", 0.0))
            hi.append(g.get("max", 0.0) - g.get("mean", 0.0))
        xs = [j + i * width for j in range(len(cats))]
        ax.bar(xs, means, width, yerr=[lo, hi], capsize=3, label=config)
    ax.set_xticks([j + width * (len(configs) - 1) / 2 for j in range(len(cats))], cats)
    ax.set_ylabel("output tokens/s (mean, min-max over rounds)")
    ax.set_title("Goodput per category")
    ax.legend()
    fig.tight_layout()
    paths.append(folder / "goodput.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, metric, title in ((axes[0], "ttft", "TTFT (ms)"), (axes[1], "itl", "inter-token latency (ms)")):
        for i, config in enumerate(configs):
            o = agg[config].get("overall", {})
            vals = [(o.get(f"{metric}_p{q}_ms") or {}).get("mean") or 0.0 for q in (50, 90, 99)]
            ax.bar([j + i * width for j in range(3)], vals, width, label=config)
        ax.set_xticks([j + width * (len(configs) - 1) / 2 for j in range(3)], ["p50", "p90", "p99"])
        ax.set_title(f"{title}, overall")
        ax.legend()
    fig.tight_layout()
    paths.append(folder / "latency.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    return paths


def _plot_svg(agg: dict, folder: Path, configs: list[str], cats: list[str]) -> list[Path]:
    from specctl_vllm.controller.report import bar_chart

    paths = []
    for c in cats:
        values = [agg[k].get(c, {}).get("goodput_tok_s", {}).get("mean", 0.0) for k in configs]
        path = folder / f"goodput_{c}.svg"
        path.write_text(bar_chart(f"Goodput: {c}", configs, values, x_label="configuration", y_label="tokens/s"))
        paths.append(path)
    return paths
