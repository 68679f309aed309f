"""Ratios, targets, the printed side-by-side table and the PNG plots of the CPU engine benchmark."""

from __future__ import annotations

from pathlib import Path

from bench.cpu.oracle import static_k

TARGETS = {"vs_best_static": 1.00, "vs_oracle": 0.98, "vs_no_spec_every_category": 1.00}


def _g(runs: dict, name: str, c: str) -> float | None:
    ph = runs.get(name, {}).get("phases", {}).get(c)
    return ph["goodput"] if ph else None


def _per(runs: dict, name: str, c: str) -> dict[str, float]:
    ph = runs.get(name, {}).get("phases", {}).get(c)
    return ph["per_category"] if ph else {}


def ratios(runs: dict, concurrency: str, oracle_name: str | None) -> dict:
    """specctl against every baseline at one concurrency (overall and per category)."""
    statics = [n for n in runs if static_k(n) is not None and n != "no_spec" and _g(runs, n, concurrency)]
    base = _g(runs, "no_spec", concurrency)
    s = _g(runs, "specctl", concurrency)
    out: dict = {"vs_no_spec": {}, "per_category": {}}
    for name in runs:
        g = _g(runs, name, concurrency)
        if g and base:
            out["vs_no_spec"][name] = g / base
    if not s or not base:
        return out
    best_static = max(statics, key=lambda n: _g(runs, n, concurrency)) if statics else None
    out["best_static"] = best_static
    out["specctl_vs_best_static"] = s / _g(runs, best_static, concurrency) if best_static else None
    out["oracle"] = oracle_name
    out["specctl_vs_oracle"] = s / _g(runs, oracle_name, concurrency) if oracle_name else None
    for other in ("batch_table", "ema_tiers"):
        if _g(runs, other, concurrency):
            out[f"specctl_vs_{other}"] = s / _g(runs, other, concurrency)
    sp, bp = _per(runs, "specctl", concurrency), _per(runs, "no_spec", concurrency)
    op = _per(runs, oracle_name, concurrency) if oracle_name else {}
    for cat in sorted(sp):
        best_cat = max((_per(runs, n, concurrency).get(cat, 0.0), n) for n in [*statics, "no_spec"])
        out["per_category"][cat] = {
            "vs_no_spec": sp[cat] / bp[cat] if bp.get(cat) else None,
            "vs_oracle": sp[cat] / op[cat] if op.get(cat) else None,
            "vs_best_static_for_category": sp[cat] / best_cat[0] if best_cat[0] else None,
            "best_static_for_category": best_cat[1],
        }
    return out


def check_targets(r: dict) -> dict:
    per = [v["vs_no_spec"] for v in r.get("per_category", {}).values() if v["vs_no_spec"] is not None]
    worst_cat = min(per) if per else None
    got = {"vs_best_static": r.get("specctl_vs_best_static"), "vs_oracle": r.get("specctl_vs_oracle"),
           "vs_no_spec_every_category": worst_cat}
    met = {k: (v is not None and v >= TARGETS[k]) for k, v in got.items()}
    return {"targets": TARGETS, "measured": got, "met": met}


def print_tables(runs: dict, rat: dict, concurrencies: list[str]) -> None:
    for c in concurrencies:
        r = rat.get(c, {})
        cats = sorted(next((p["phases"][c]["per_category"] for p in runs.values() if c in p.get("phases", {})), {}))
        base = runs.get("no_spec", {}).get("phases", {}).get(c)
        head = f"{'config':<18} {'tok/s':>7} {'x nospec':>8} " + " ".join(f"{x[:9]:>9}" for x in cats)
        print(f"\nconcurrency {c}: goodput (tok/s) and per-category goodput / no speculation")
        print(head)
        print("-" * len(head))
        for name, run in runs.items():
            ph = run.get("phases", {}).get(c)
            if not ph:
                continue
            ratio = ph["goodput"] / base["goodput"] if base else float("nan")
            per = [ph["per_category"].get(x, 0) / base["per_category"][x] if base and base["per_category"].get(x)
                   else float("nan") for x in cats]
            print(f"{name:<18} {ph['goodput']:>7.1f} {ratio:>8.3f} " + " ".join(f"{v:>9.3f}" for v in per))
        if r.get("specctl_vs_best_static") is not None:
            t = check_targets(r)
            m = t["measured"]
            print(f"specctl / best static ({r['best_static']}) {m['vs_best_static']:.3f} (target >= 1.00); "
                  f"/ oracle ({r.get('oracle')}) {m['vs_oracle'] or float('nan'):.3f} (>= 0.98); "
                  f"worst category / no spec {m['vs_no_spec_every_category']:.3f} (>= 1.00); met: {t['met']}")


def plot(runs: dict, rat: dict, concurrencies: list[str], out_dir: Path, stem: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    names = [n for n in runs if any(c in runs[n].get("phases", {}) for c in concurrencies)]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    width = 0.8 / max(len(concurrencies), 1)
    for i, c in enumerate(concurrencies):
        ys = [rat.get(c, {}).get("vs_no_spec", {}).get(n, 0.0) for n in names]
        ax.bar([x + i * width for x in range(len(names))], ys, width, label=f"concurrency {c}")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks([x + width * (len(concurrencies) - 1) / 2 for x in range(len(names))])
    ax.set_xticklabels(names, rotation=35, ha="right", fontsize=8)
    ax.set_ylabel("goodput / no speculation")
    ax.set_title("CPU engine (vLLM 0.32, SmolLM2-135M, n-gram): overall goodput")
    ax.legend(fontsize=8)
    fig.tight_layout()
    p = out_dir / f"{stem}_overall.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(str(p))

    fig, axes = plt.subplots(1, len(concurrencies), figsize=(6 * len(concurrencies), 4.5), squeeze=False)
    for ax, c in zip(axes[0], concurrencies):
        r = rat.get(c, {})
        cats = sorted(r.get("per_category", {}))
        series = [("specctl", "specctl")]
        if r.get("oracle"):
            series.append((r["oracle"], "oracle"))
        if r.get("best_static"):
            series.append((r["best_static"], f"best static ({r['best_static']})"))
        for other in ("ema_tiers", "batch_table"):
            if other in runs:
                series.append((other, other))
        w = 0.8 / max(len(series), 1)
        base = runs.get("no_spec", {}).get("phases", {}).get(c, {}).get("per_category", {})
        for i, (name, label) in enumerate(series):
            per = runs.get(name, {}).get("phases", {}).get(c, {}).get("per_category", {})
            ax.bar([x + i * w for x in range(len(cats))], [per.get(x, 0) / base[x] if base.get(x) else 0 for x in cats],
                   w, label=label)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xticks([x + w * (len(series) - 1) / 2 for x in range(len(cats))])
        ax.set_xticklabels(cats, rotation=35, ha="right", fontsize=8)
        ax.set_title(f"per category, concurrency {c}")
        ax.set_ylabel("category goodput / no speculation")
        ax.legend(fontsize=7)
    fig.tight_layout()
    p = out_dir / f"{stem}_categories.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(str(p))
    return paths
