"""The vLLM contract check: its AST checks, its release list, its sources (wheel / cache / installed), exit codes."""

from __future__ import annotations

import importlib.util
import os
import sys
import zipfile
from pathlib import Path

import pytest

from specctl_vllm.engine_patch import versions

ROOT = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("vllm_contract", ROOT / "scripts" / "vllm_contract.py")
contract = importlib.util.module_from_spec(spec)
sys.modules["vllm_contract"] = contract
spec.loader.exec_module(contract)

#: Folder of downloaded vLLM wheels (``pip download --no-deps vllm==X -d DIR``); tests skip the absent ones.
WHEELS = Path(os.environ.get("SPECCTL_VLLM_WHEELS", ROOT / ".cache" / "vllm-wheels"))


def test_release_list_covers_every_supported_minor() -> None:
    (major, low), (_, high) = versions.MIN_VERSION, versions.MAX_VERSION
    minors = {versions.parse_version(r) for r in contract.supported_releases()}
    assert minors == {(major, m) for m in range(low, high)}
    assert all(versions.is_supported(r) for r in contract.supported_releases())


def test_check_ids_are_unique() -> None:
    ids = [c.id for c in contract.CHECKS]
    assert len(ids) == len(set(ids))


def test_installed_vllm_passes() -> None:
    src = contract.from_installed()
    if src is None:
        pytest.skip("no vLLM installed")
    outcomes = contract.run_checks(src)
    assert [o.check.id for o in outcomes if o.failed] == []


SCHED_OK = '''
class Scheduler(SchedulerInterface):
    def __init__(self, vllm_config, kv_cache_config):
        self.running = []
        self.requests: dict = {}
        self.dynamic_sd_lookup = None

    def schedule(self, throttle_prefills=False):
        if self.dynamic_sd_lookup is None:
            pass
        spec_token_ids = request.spec_token_ids[:3]
        out = SchedulerOutput(num_spec_tokens_to_schedule=self.dynamic_sd_lookup[1])
        self._update_after_schedule(out)
'''


def sources(files: dict[str, str], version: str = "0.33.0") -> object:
    return contract.Sources("test", version, files)


def test_ast_checks_find_names_and_lines() -> None:
    src = sources({contract.SCHED: SCHED_OK})
    by_id = {o.check.id: o for o in contract.run_checks(src)}
    assert by_id["Scheduler.running"].result.ok
    assert by_id["Scheduler.requests"].result.where == f"{contract.SCHED}:5"
    assert by_id["padding skipped when dynamic_sd_lookup is set"].result.ok
    assert by_id["schedule() slices request.spec_token_ids"].result.ok
    assert by_id["schedule() calls self._update_after_schedule"].result.ok
    assert by_id["schedule() passes num_spec_tokens_to_schedule to SchedulerOutput"].result.ok
    assert by_id["Scheduler.__init__(self, vllm_config, ...)"].result.ok
    assert not by_id["Scheduler.update_from_output(self, scheduler_output, model_runner_output)"].result.ok


def test_a_renamed_parameter_fails() -> None:
    src = sources({contract.SCHED: SCHED_OK.replace("def schedule(self, throttle_prefills=False)",
                                                    "def schedule(self, budget)")})
    by_id = {o.check.id: o for o in contract.run_checks(src)}
    result = by_id["Scheduler.schedule(self)"].result
    assert not result.ok and "requires more than" in result.detail


def test_checks_with_since_are_na_before_it() -> None:
    check = next(c for c in contract.CHECKS if c.id.startswith("V2 model runner"))
    assert check.since == (0, 32)
    assert not check.required_for("0.31.0") and check.required_for("0.32.0") and check.required_for("0.33.0")
    outcome = contract.run_checks(sources({}, "0.31.0"), [check])[0]
    assert not outcome.result.ok and not outcome.failed
    outcome = contract.run_checks(sources({}, "0.33.0"), [check])[0]
    assert outcome.failed


def test_checks_with_until_are_na_from_it() -> None:
    check = next(c for c in contract.CHECKS if c.id.startswith("V1 model runner"))
    assert check.until == (0, 34)
    assert check.required_for("0.33.0") and not check.required_for("0.34.0")
    outcome = contract.run_checks(sources({}, "0.34.0"), [check])[0]
    assert not outcome.result.ok and not outcome.failed
    assert contract.run_checks(sources({}, "0.33.0"), [check])[0].failed


def test_every_backport_target_is_a_check_of_its_release() -> None:
    from specctl_vllm.engine_patch import backports

    ids = {c.id: c for c in contract.CHECKS}
    for release, table in backports.RELEASES.items():
        minor = versions.parse_version(release)
        for name, targets in table.targets.items():
            for module, qualname, _ in targets:
                check = ids[f"backport {name} ({release}): {qualname}"]
                assert contract.module_path(module) in contract.FILES
                assert check.required_for(release) and not check.required_for(f"0.{minor[1] + 1}.0")


METHOD = '''
class VllmConfig:
    def get_decode_cudagraph_query_lens(self, decode_query_len):
        if not speculative_config.uses_dynamic_speculative_decoding():
            return {decode_query_len: max_num_seqs}
'''


def test_a_backport_line_that_moved_fails_its_release() -> None:
    run = contract.method_holds("vllm/config/vllm.py", "VllmConfig.get_decode_cudagraph_query_lens",
                                ("return {decode_query_len: max_num_seqs}",))
    assert run(sources({"vllm/config/vllm.py": METHOD})).ok
    moved = run(sources({"vllm/config/vllm.py": METHOD.replace("max_num_seqs}", "max_reqs}")}))
    assert not moved.ok and "no longer holds" in moved.detail


def fake_wheel(path: Path, files: dict[str, str], version: str = "0.33.0") -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
        archive.writestr(f"vllm-{version}.dist-info/METADATA", f"Name: vllm\nVersion: {version}\n")
    return path


def test_incomplete_wheel_exits_1(tmp_path: Path, capsys) -> None:
    wheel = fake_wheel(tmp_path / "vllm-0.33.0-x.whl", {contract.SCHED: SCHED_OK})
    assert contract.main(["--wheel", str(wheel)]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "update_from_output" in out


def test_unreadable_wheel_exits_2_without_traceback(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "vllm.whl"
    bad.write_bytes(b"not a zip")
    assert contract.main(["--wheel", str(bad)]) == 2
    assert "cannot read it as a wheel" in capsys.readouterr().err
    assert contract.main(["--wheel", str(tmp_path / "missing.whl")]) == 2


def test_cached_release_is_read_offline(tmp_path: Path) -> None:
    folder = tmp_path / "0.33.0"
    (folder / contract.SCHED).parent.mkdir(parents=True)
    (folder / contract.SCHED).write_text(SCHED_OK)
    (folder / ".complete").write_text("\n".join(["x", *contract.FILES]) + "\n")
    src = contract.from_release("0.33.0", tmp_path)
    assert src.version == "0.33.0" and contract.SCHED in src.files


def cached_sources(version: str) -> Path:
    """The release's sources as cached by ``scripts/vllm_contract.py`` (``make test`` runs it first)."""
    folder = contract.CACHE / version
    stamp = folder / ".complete"
    assert stamp.is_file() and stamp.read_text().splitlines()[1:] == list(contract.FILES), (
        f"vllm {version} sources not cached: run scripts/vllm_contract.py (make test and make check do)")
    return folder


@pytest.mark.parametrize("version", ["0.26.0", "0.32.0", "0.33.0", "0.34.0"])
def test_real_wheels_pass(version: str, tmp_path: Path) -> None:
    """The wheel reader on a wheel holding the release's real sources (the cached files, zipped as in a wheel)."""
    import zipfile

    folder = cached_sources(version)
    wheel = tmp_path / f"vllm-{version}-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name in contract.FILES:
            if (folder / name).is_file():
                archive.write(folder / name, name)
        archive.writestr(f"vllm-{version}.dist-info/METADATA", f"Name: vllm\nVersion: {version}\n")
    src = contract.from_wheel(wheel)
    assert [o.check.id for o in contract.run_checks(src) if o.failed] == []


@pytest.mark.parametrize("version", contract.RELEASES)
def test_cached_release_sources_pass(version: str) -> None:
    """The sources `make check` cached (.cache/vllm-sources/): every supported release passes, offline."""
    cached_sources(version)
    src = contract.from_release(version)
    assert [o.check.id for o in contract.run_checks(src) if o.failed] == []
