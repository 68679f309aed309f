"""Ratios, targets, the printed side-by-side table and the PNG plots of the CPU engine benchmark."""

from __future__ import annotations

from pathlib import Path

from bench.cpu.oracle import static_k

TARGETS = {"vs_best_static": 1.00, "vs_oracle": 0.98, "vs_no_spec_every_category": 1.00}


# --- paired figures -----------------------------------------------------------------------------------------
# Every configuration X ran its measured prompts in chunks alternating with the always-on specctl stack, so
#   paired(X)     = G_specctl(during X) / G_X                 -- specctl against X, same minutes of the machine
#   normalized(X) = G_X * G_specctl(all) / G_specctl(during X) -- X on a common scale, for ranking baselines
def _phase(runs: dict, name: str, c: str, key: str = "phases") -> dict | None:
    return runs.get(name, {}).get(key, {}).get(c)


def normalized(runs: dict, name: str, c: str) -> dict | None:
    ref = _phase(runs, "specctl", c)
    if name == "specctl":
        return ref
    ph, sp = _phase(runs, name, c), _phase(runs, name, c, "paired_specctl")
    if not (ph and sp and ref) or not sp["goodput"]:
        return None
    per = {cat: v * ref["per_category"][cat] / sp["per_category"][cat] for cat, v in ph["per_category"].items()
           if sp["per_category"].get(cat) and ref["per_category"].get(cat)}
    return {"goodput": ph["goodput"] * ref["goodput"] / sp["goodput"], "per_category": per, "tokens": ph["tokens"]}


def paired(runs: dict, name: str, c: str) -> dict | None:
    """specctl over X in the same minutes: overall and per category."""
    ph, sp = _phase(runs, name, c), _phase(runs, name, c, "paired_specctl")
    if not (ph and sp) or not ph["goodput"]:
        return None
    per = {cat: sp["per_category"][cat] / v for cat, v in ph["per_category"].items() if v and cat in sp["per_category"]}
    return {"overall": sp["goodput"] / ph["goodput"], "per_category": per}


def oracle_name(runs: dict, c: str) -> str | None:
    """The best per-category static configuration measured (normalised): oracle runs and uniform static runs."""
    cands = [n for n in runs if (n.startswith("oracle") or static_k(n) is not None) and normalized(runs, n, c)]
    if not any(n.startswith("oracle") for n in cands):
        return None
    return max(cands, key=lambda n: normalized(runs, n, c)["goodput"])


def ratios(runs: dict, c: str) -> dict:
    """specctl against every baseline at one concurrency (overall and per category)."""
    names = [n for n in runs if n != "specctl" and normalized(runs, n, c)]
    out: dict = {"vs_no_spec": {}, "specctl_vs": {}, "per_category": {}}
    base = normalized(runs, "no_spec", c)
    for n in [*names, "specctl"]:
        norm = normalized(runs, n, c)
        if base and norm and base["goodput"]:
            out["vs_no_spec"][n] = norm["goodput"] / base["goodput"]
    for n in names:
        out["specctl_vs"][n] = paired(runs, n, c)["overall"]
    if "no_spec" in names:
        out["vs_no_spec"]["specctl"] = out["specctl_vs"]["no_spec"]  # paired beats normalised for the headline
    statics = [n for n in names if (static_k(n) or 0) > 0]
    if not statics or "no_spec" not in names:
        return out
    best_static = max(statics, key=lambda n: normalized(runs, n, c)["goodput"])
    orc = oracle_name(runs, c)
    out.update(best_static=best_static, specctl_vs_best_static=out["specctl_vs"][best_static], oracle=orc,
               specctl_vs_oracle=out["specctl_vs"].get(orc) if orc else None)
    for other in ("batch_table", "ema_tiers"):
        if other in out["specctl_vs"]:
            out[f"specctl_vs_{other}"] = out["specctl_vs"][other]
    nospec = paired(runs, "no_spec", c)["per_category"]
    orc_p = paired(runs, orc, c)["per_category"] if orc else {}
    for cat in sorted(nospec):
        best_cat = max((normalized(runs, n, c)["per_category"].get(cat, 0.0), n) for n in [*statics, "no_spec"])
        out["per_category"][cat] = {
            "vs_no_spec": nospec.get(cat),
            "vs_oracle": orc_p.get(cat),
            "best_static_for_category": best_cat[1],
            "vs_best_static_for_category": paired(runs, best_cat[1], c)["per_category"].get(cat),
        }
    out["worst_category_vs_no_spec"] = worst_categories(runs, c)
    pairings = {n: _phase(runs, n, c, "paired_specctl")["goodput"] for n in names}
    vals = list(pairings.values())
    if len(vals) > 1:
        mean = sum(vals) / len(vals)
        out["specctl_goodput_by_pairing"] = pairings
        out["specctl_goodput_cv"] = (sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) ** 0.5 / mean
    again = normalized(runs, "no_spec-again", c)
    if again and base:
        out["repeatability_no_spec_again_over_no_spec"] = again["goodput"] / base["goodput"]
    return out


def worst_categories(runs: dict, c: str) -> dict[str, dict]:
    """Per configuration (normalised): its slowest category against no speculation, and how many are below it.

    Shows whether "every category at least as fast as without speculation" is reachable at all at ``c``: in a
    shared batch every request waits for the drafts of the step, so a category that gains nothing from its
    own drafts is slowed by the others'.
    """
    base = normalized(runs, "no_spec", c)
    if not base:
        return {}
    out = {}
    for n in runs:
        norm = normalized(runs, n, c) if n != "no_spec" else None
        if not norm:
            continue
        per = {cat: v / base["per_category"][cat] for cat, v in norm["per_category"].items()
               if base["per_category"].get(cat)}
        if per:
            worst = min(per, key=per.get)
            out[n] = {"category": worst, "ratio": per[worst], "below": sum(v < 1.0 for v in per.values()),
                      "overall": norm["goodput"] / base["goodput"]}
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
        base = normalized(runs, "no_spec", c)
        cats = sorted((base or {}).get("per_category", {}))
        head = (f"{'config':<16} {'tok/s':>7} {'norm':>7} {'x nospec':>8} {'specctl/x':>9} | "
                + " ".join(f"{x[:9]:>9}" for x in cats))
        print(f"\nconcurrency {c}: measured tok/s, normalised tok/s (paired with specctl), ratio to no speculation,"
              f" specctl over the configuration in the same minutes | per category: specctl / configuration")
        print(head)
        print("-" * len(head))
        for name in runs:
            norm = normalized(runs, name, c)
            if not norm:
                continue
            ph = _phase(runs, name, c)
            pr = paired(runs, name, c) if name != "specctl" else None
            x = r.get("vs_no_spec", {}).get(name, float("nan"))
            per = [pr["per_category"].get(cat, float("nan")) if pr else float("nan") for cat in cats]
            print(f"{name:<16} {ph['goodput']:>7.1f} {norm['goodput']:>7.1f} {x:>8.3f} "
                  f"{pr['overall'] if pr else float('nan'):>9.3f} | " + " ".join(f"{v:>9.3f}" for v in per))
        if r.get("specctl_vs_best_static") is not None:
            t = check_targets(r)
            m = t["measured"]
            print(f"specctl / best static ({r['best_static']}) {m['vs_best_static']:.3f} (target >= 1.00); "
                  f"/ oracle ({r.get('oracle')}) {m['vs_oracle'] or float('nan'):.3f} (>= 0.98); "
                  f"worst category / no spec {m['vs_no_spec_every_category']:.3f} (>= 1.00); met: {t['met']}")
        if r.get("specctl_goodput_cv") is not None:
            print(f"specctl's own goodput across its pairings varied by {r['specctl_goodput_cv']:.1%} (coefficient of "
                  "variation): the machine's drift that the pairing removes")


def plot(runs: dict, rat: dict, concurrencies: list[str], out_dir: Path, stem: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    names = [n for n in runs if any(normalized(runs, n, c) for c in concurrencies)]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    width = 0.8 / max(len(concurrencies), 1)
    for i, c in enumerate(concurrencies):
        ys = [rat.get(c, {}).get("vs_no_spec", {}).get(n, 0.0) for n in names]
        ax.bar([x + i * width for x in range(len(names))], ys, width, label=f"concurrency {c}")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks([x + width * (len(concurrencies) - 1) / 2 for x in range(len(names))])
    ax.set_xticklabels(names, rotation=35, ha="right", fontsize=8)
    ax.set_ylabel("goodput / no speculation (paired-normalised)")
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
        base = (normalized(runs, "no_spec", c) or {}).get("per_category", {})
        for i, (name, label) in enumerate(series):
            per = (normalized(runs, name, c) or {}).get("per_category", {})
            ax.bar([x + i * w for x in range(len(cats))], [per.get(x, 0) / base[x] if base.get(x) else 0 for x in cats],
                   w, label=label)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xticks([x + w * (len(series) - 1) / 2 for x in range(len(cats))])
        ax.set_xticklabels(cats, rotation=35, ha="right", fontsize=8)
        ax.set_title(f"per category, concurrency {c}")
        ax.set_ylabel("category goodput / no speculation (normalised)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    p = out_dir / f"{stem}_categories.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(str(p))
    return paths
