"""Rendering of the steady-load tables from result rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.gpu.steady_table import (
    best_static,
    cell,
    median_coverage,
    pair_noise,
    premise_table,
    render,
    spread_statement,
)


def row(engine: str, profile: str, c: int, med: float, lo: float, hi: float, **extra) -> dict:
    return {"kind": "row", "engine": engine, "profile": profile, "concurrency": c, "tok_per_s_median": med,
            "tok_per_s_min": lo, "tok_per_s_max": hi, "tok_per_s_spread": (hi - lo) / med,
            "rounds": [{}, {}, {}], **extra}


def results(tmp_path: Path, rows: list[dict]) -> Path:
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


ROWS = [
    row("plain", "high", 1, 200.0, 198.0, 202.0, mean_step_ms_median=5.0, full_share=1.0),
    row("k4", "high", 1, 500.0, 480.0, 550.0, mean_step_ms_median=7.0, full_share=1.0),
    row("k2", "high", 1, 420.0, 410.0, 425.0, mean_step_ms_median=6.0, full_share=1.0),
    row("specctl", "high", 1, 510.0, 500.0, 520.0),
    row("plain", "mixed", 1, 200.0, 199.0, 201.0),
    row("k4", "mixed", 1, 300.0, 290.0, 310.0),
    row("oracle", "mixed", 1, 350.0, 340.0, 360.0, pins={"high": 4, "low": 0},
        tok_per_s_by_category={"high": {"median": 250.0}, "low": {"median": 100.0}}),
    row("premise-k4", "high", 1, 480.0, 470.0, 490.0, mean_step_ms_median=7.07, full_share=0.99),
]


def test_cell_has_median_range_and_both_ratios(tmp_path):
    from bench.gpu.steady_plan import load_results

    rows, _ = load_results(results(tmp_path, ROWS))
    assert best_static(rows, "high", 1) == ("k4", 500.0)
    assert cell(rows, "specctl", "high", 1) == "510 (500-520) 2.55 / 1.02"
    assert cell(rows, "k7", "high", 1) == "-"


def test_render_orders_engines_adds_oracle_to_mixed_and_keeps_premise_apart(tmp_path):
    text = render(results(tmp_path, ROWS + [{"kind": "engine_error", "engine": "ktable", "rc": 1,
                                              "error": "AssertionError: 0 < num_reqs"}]))
    high = text.split("**high**")[1].split("**mixed**")[0]
    assert [ln.split("|")[1].strip() for ln in high.splitlines() if ln.startswith("| ") and "engine" not in ln] == [
        "plain", "k2", "k4", "specctl", "best static"]
    mixed = text.split("**mixed**")[1].split("spread")[0]
    assert "| oracle | 350 (340-360) 1.75 / 1.17 | - |" in mixed
    assert "oracle pins: c=1: high k=4, low k=0" in text
    assert "| oracle | 250 / 100 | - |" in text.split("by category")[1]
    assert "premise-k4" not in high
    assert "ktable: did not start (exit 1): AssertionError" in text


def test_spread_statement_names_the_widest_point(tmp_path):
    from bench.gpu.steady_plan import load_results

    rows, _ = load_results(results(tmp_path, ROWS))
    text = spread_statement(rows)
    assert "largest 14.0% (k4, high, c=1)" in text
    assert "above 5%: k4 high c=1" in text and "3 timed rounds" in text


def test_premise_table_compares_step_times(tmp_path):
    from bench.gpu.steady_plan import load_results

    rows, _ = load_results(results(tmp_path, ROWS))
    table = premise_table(rows)
    assert table.startswith("high:")
    assert "| 4 | 7.07 / 7.00 (1.01), 99%/100%; 480 |" in table
    assert "c=64" not in table  # only the concurrencies the premise rows cover


def test_premise_table_covers_every_profile_and_width_pinned(tmp_path):
    from bench.gpu.steady_plan import load_results

    extra = [row("premise-k1", "mixed", 256, 9600.0, 9500.0, 9700.0, mean_step_ms_median=50.0),
             row("premise-k2", "mixed", 256, 10300.0, 10200.0, 10400.0, mean_step_ms_median=55.0, full_share=0.0),
             row("k2", "mixed", 256, 10351.0, 10300.0, 10400.0, mean_step_ms_median=54.0, full_share=0.0)]
    rows, _ = load_results(results(tmp_path, ROWS + extra))
    high, mixed = premise_table(rows).split("\n\nmixed:")
    assert high.startswith("high:") and "| 4 | 7.07 / 7.00 (1.01), 99%/100%; 480 |" in high
    assert "| 1 | 50.00 / -, -/-; 9600 |" in mixed
    assert "| 2 | 55.00 / 54.00 (1.02), 0%/0%; 10300 |" in mixed
    assert "c=256" in mixed and "c=1" not in mixed


def test_empty_results(tmp_path):
    assert render(tmp_path / "none.jsonl").startswith("no rows")


def test_plain_rows_stand_for_every_profile_when_measured_once() -> None:
    from bench.gpu.steady_plan import share_plain_rows

    rows = {("plain", "high", 4): {"tok_per_s_median": 766.0}, ("k4", "low", 4): {"tok_per_s_median": 867.0}}
    shared = share_plain_rows(rows)
    assert shared[("plain", "low", 4)]["tok_per_s_median"] == 766.0
    assert shared[("plain", "mixed", 4)]["shared_from"] == "high"
    assert ("plain", "high", 1) not in shared


def test_cold_start_compares_each_specctl_run_s_first_warm_up_with_the_k_max_engine_s(tmp_path):
    from bench.gpu.steady_plan import load_results
    from bench.gpu.steady_table import cold_start_text

    rows, _ = load_results(results(tmp_path, [
        row("k7", "high", 1, 520.0, 510.0, 530.0, warmup_tok_per_s=500.0, warmup_s=8.0, point_index=0),
        row("specctl_skip", "high", 1, 515.0, 505.0, 525.0, warmup_tok_per_s=450.0, warmup_s=10.0, point_index=0),
        row("specctl_skip", "high", 4, 1800.0, 1700.0, 1900.0, warmup_tok_per_s=1000.0, warmup_s=8.0,
            point_index=1),
        row("specctl", "low", 4, 900.0, 880.0, 910.0, warmup_tok_per_s=800.0, warmup_s=10.0, point_index=0),
    ]))
    text = cold_start_text(rows)
    assert "specctl_skip high c=1: warm-up 450 tok/s over 10.0 s; k7 500 over 8.0 s: 0.90x" in text
    assert "specctl low c=4: warm-up 800 tok/s over 10.0 s; no k7 warm-up at this point" in text
    assert "c=4: warm-up 1000" not in text  # not a first point: its controller had learned
    assert cold_start_text({k: v for k, v in rows.items() if k[0] == "k7"}) is None


def test_paired_rows_show_the_median_of_their_per_pair_ratios(tmp_path):
    pair = {"engine": "plain", "ratios": [0.97, 0.99, 0.98], "ratio_median": 0.98, "ratio_min": 0.97,
            "ratio_max": 0.99}
    path = results(tmp_path, [row("plain", "low", 64, 7700, 7600, 7800, paired_with="premise-k0"),
                              row("premise-k0", "low", 64, 7546, 7400, 7600, pair=pair),
                              row("k2", "low", 64, 7000, 6900, 7100)])
    text = render(path)
    assert "| premise-k0 | low | 64 | plain | 0.980 (0.970-0.990) | 7546 / 7700 |" in text
    assert "| k2 | low | 64 |" not in text  # measured alone: no paired line


def test_a_reference_paired_with_two_engines_gives_each_pairing_its_own_median(tmp_path):
    """Plain measured beside specctl and then beside premise-k0 at one point: each paired line shows the plain
    rounds of its own pairing (not the last one), and the note says the profile tables use the last."""
    pair = {"engine": "plain", "ratio_median": 0.96, "ratio_min": 0.9, "ratio_max": 1.0}
    path = results(tmp_path, [row("plain", "low", 64, 6000, 5900, 6100, paired_with="specctl_skip"),
                              row("specctl_skip", "low", 64, 5760, 5700, 5800, pair=pair),
                              row("plain", "low", 64, 6800, 6700, 6900, paired_with="premise-k0"),
                              row("premise-k0", "low", 64, 6290, 6200, 6300, pair={**pair, "ratio_median": 0.925})])
    text = render(path)
    assert "| specctl_skip | low | 64 | plain | 0.960 (0.900-1.000) | 5760 / 6000 |" in text
    assert "| premise-k0 | low | 64 | plain | 0.925 (0.900-1.000) | 6290 / 6800 |" in text
    assert "plain at low c=64 was measured beside premise-k0, specctl_skip" in text


@pytest.mark.parametrize(("n", "want"), [(1, 0.0), (2, 0.5), (3, 0.75), (6, 0.96875)])
def test_min_max_of_n_pairs_hold_the_median_with_one_minus_two_halves_to_the_n(n, want):
    assert median_coverage(n) == pytest.approx(want)


@pytest.mark.parametrize(("ratios", "want"), [
    ([], (0, None, None)),
    ([0.97], (1, None, None)),
    ([1.0, 1.0, 1.0], (3, 0.0, 2)),                    # no noise: the floor of two pairs
    ([0.96, 1.0, 1.04], (3, 0.04, 16)),                # (1.96 * 0.04 / 0.02)^2 = 15.4
    ([0.8, 1.0, 1.2], (3, 0.2, 385)),
])
def test_the_pairs_a_point_needs_follow_from_the_spread_of_its_pair_ratios(ratios, want):
    n, sd, need = pair_noise(ratios)
    assert (n, need) == (want[0], want[2])
    assert sd == (None if want[1] is None else pytest.approx(want[1]))


def test_the_paired_line_states_its_pairs_coverage_noise_and_the_pairs_needed(tmp_path):
    pair = {"engine": "plain", "ratios": [0.96, 1.0, 1.04], "ratio_median": 1.0, "ratio_min": 0.96,
            "ratio_max": 1.04}
    path = results(tmp_path, [row("plain", "low", 64, 7700, 7600, 7800, paired_with="premise-k0"),
                              row("premise-k0", "low", 64, 7700, 7400, 7900, pair=pair)])
    assert "| premise-k0 | low | 64 | plain | 1.000 (0.960-1.040) | 7700 / 7700 | 3 | 75.0% | 0.040 | 16 |" \
        in render(path)


def test_av_table_gives_each_engine_over_vllm_s_adaptive_verification(tmp_path):
    from bench.gpu.steady_table import av_table

    rows = [row("av", "mixed", 1, 400.0, 390.0, 410.0), row("specctl", "mixed", 1, 440.0, 430.0, 450.0),
            row("specctl_av", "mixed", 1, 380.0, 370.0, 390.0), row("k4", "mixed", 16, 900.0, 890.0, 910.0)]
    text = av_table({(r["engine"], r["profile"], r["concurrency"]): r for r in rows}, concurrency=(1, 16))
    assert "| mixed | specctl | 1.100 | - |" in text
    assert "| mixed | specctl_av | 0.950 | - |" in text
    assert "k4" not in text  # no av row at its point
    assert "against vLLM's adaptive verification" in render(results(tmp_path, rows))


def test_av_table_is_empty_without_av_rows():
    from bench.gpu.steady_table import av_table

    rows = [row("specctl", "mixed", 1, 440.0, 430.0, 450.0)]
    assert av_table({(r["engine"], r["profile"], r["concurrency"]): r for r in rows}) == ""
