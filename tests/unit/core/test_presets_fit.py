"""The cost presets are what their documented derivations give (no hand-edited numbers)."""

import json

import pytest

from bench.sim.fit_presets import DATA, as_preset, fit_runs
from specctl_vllm.kernel.cost import H200, PRESETS, roofline_from_h200


def test_h200_preset_is_the_fit_of_the_measured_runs():
    rows = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]
    assert len(rows) == 40
    fit = fit_runs(rows)
    got = as_preset(fit)
    for name in ("base", "per_request", "per_token", "per_token_above_knee", "draft_fixed",
                 "draft_fixed_per_request", "draft_pass", "draft_pass_per_request", "knee"):
        assert getattr(H200, name) == pytest.approx(getattr(got, name), rel=2e-3), name
    assert fit["rms_rel_error"] < 0.10


@pytest.mark.parametrize("name, bw, flops", [("mi300x", 5.3e12, 1.3e15), ("mi355x", 8.0e12, 2.5e15)])
def test_roofline_presets_follow_public_specs(name, bw, flops):
    assert PRESETS[name] == roofline_from_h200(bw, flops)
