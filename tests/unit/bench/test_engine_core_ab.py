"""``bench engine_core_ab``: vLLM's own scheduler stepped plain, at static K = 7 and under the patch at K = 0."""

from __future__ import annotations

import pytest

from bench import engine_core_ab as ab


def test_a_pinned_policy_holds_every_category_and_the_default_at_one_width() -> None:
    policy = ab.pinned_policy(0)
    pinned = [policy.default, *policy.categories.values()]
    assert len(pinned) > 1
    assert all((cp.k, cp.adapt.k_min, cp.adapt.k_max, cp.source) == (0, 0, 0, "override") for cp in pinned)


@pytest.mark.parametrize(("arm", "drafts", "width"), [
    ("plain", 0, None),
    ("static_k7", 4 * ab.K_MAX, None),
    ("patched_k0", 0, 0),
])
def test_each_arm_runs_vllms_scheduler_at_the_width_it_names(arm, drafts, width) -> None:
    """Four requests, a few all-decode steps: the patched arm's hook pins K = 0 without an error, the static
    arm verifies 7 drafts a request, plain none."""
    if not (ab.MODEL_DIR / "config.json").is_file():
        pytest.fail(f"no model config at {ab.MODEL_DIR}: run `make model` first")
    row = ab.run_arm(arm, 4, 5, seed=0, model_dir=ab.MODEL_DIR)
    assert row["step_us"] > 0
    assert row["drafts_last_step"] == drafts
    if width is not None:
        assert row["width_last_step"] == width
        assert row["errors"] == {}


@pytest.mark.parametrize("argv", [["--arms", "plain,fast"], ["--rounds", "0"], ["--sizes", "x"], ["--sizes", "0"],
                                  ["--steps", str(ab.MAX_STEPS + 1)]])
def test_bad_arguments_exit_2_with_a_reason(argv, capsys) -> None:
    with pytest.raises(SystemExit) as stop:
        ab.main(argv)
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip()


@pytest.mark.parametrize("before", [None, "http://controller:8081"])
def test_building_a_scheduler_leaves_the_environment_as_it_was(before, monkeypatch) -> None:
    """The patch's runtime is built with its reporter off, and the process's controller setting comes back
    unchanged (later engines in the same process must not inherit 'off')."""
    if before is None:
        monkeypatch.delenv(ab.CONTROLLER_URL_ENV, raising=False)
    else:
        monkeypatch.setenv(ab.CONTROLLER_URL_ENV, before)
    scheduler = ab.build_scheduler("patched_k0", 2, ab.MODEL_DIR)
    assert scheduler._specctl.reporter is None
    assert ab.os.environ.get(ab.CONTROLLER_URL_ENV) == before
