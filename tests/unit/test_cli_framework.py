"""One CLI framework for every subcommand: each is a typer command with its own options (no argparse behind a
pass-through), every option's help shows its default and the variable it reads, flags read as flags, and
``report --url`` honours SPECCTL_CONTROLLER_URL like every other command that talks to the controller."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from specctl_vllm.controller import cli, cli_common, replay_cli
from tests.unit.service.test_cli import help_options
from tests.unit.service.test_report import recording

runner = CliRunner()
COMMANDS = [("serve",), ("status",), ("replay",), ("bench",), ("report",), ("override", "set"),
            ("override", "clear"), ("override", "list")]


def _command(path: tuple[str, ...]):
    command = typer.main.get_command(cli.app)
    for name in path:
        command = command.commands[name]
    return command


@pytest.mark.parametrize("path", COMMANDS, ids=" ".join)
def test_every_subcommand_parses_its_own_options(path):
    """No subcommand hands its arguments on unparsed (replay, bench and report went to argparse before)."""
    command = _command(path)
    assert not command.context_settings.get("ignore_unknown_options"), path
    assert not command.context_settings.get("allow_extra_args"), path
    result = runner.invoke(cli.app, [*path, "--no-such-option"])
    assert result.exit_code == 2 and "No such option" in result.output


@pytest.mark.parametrize("path", COMMANDS, ids=" ".join)
def test_every_option_shows_its_default_and_variable(path):
    result = runner.invoke(cli.app, [*path, "-h"], env={"COLUMNS": "200"}, prog_name="specctl")
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"Usage: specctl {' '.join(path)} ")
    shown = help_options(result.output)
    for param in _command(path).params:
        if param.param_type_name != "option" or param.name == "help":
            continue
        long = next(o for o in param.opts if o.startswith("--"))
        text = shown[long]
        if param.is_flag:
            assert "<bool>" not in text, f"{long} is a flag: {text}"
        elif not param.required:
            assert "default" in text, f"{long} does not show its default: {text}"
        for variable in ([param.envvar] if isinstance(param.envvar, str) else param.envvar or []):
            assert variable in text, f"{long} reads {variable} and does not say so: {text}"


def test_the_controller_url_is_one_option_everywhere():
    for path in [("status",), ("report",), ("bench",), ("override", "set"), ("override", "list")]:
        params = {p.name: p for p in _command(path).params}
        url = params.get("url") or params.get("controller")
        assert url.envvar == cli_common.URL_ENV, path


def test_report_url_honours_the_variable(tmp_path: Path):
    """With the variable set and no recording, the report goes to that controller (here: nothing listens)."""
    result = runner.invoke(cli.app, ["report", "--out", str(tmp_path / "r.html")],
                           env={cli_common.URL_ENV: "http://127.0.0.1:9"})
    assert result.exit_code == cli_common.EXIT_UNREACHABLE, result.output
    assert "cannot reach the controller at http://127.0.0.1:9" in result.output


def test_a_recording_on_the_command_line_beats_the_variable(tmp_path: Path):
    rec = tmp_path / "r.jsonl"
    rec.write_text("\n".join(b.model_dump_json() for b in recording(4)) + "\n")
    result = runner.invoke(cli.app, ["report", str(rec), "--out", str(tmp_path / "r.html")],
                           env={cli_common.URL_ENV: "http://127.0.0.1:9"})
    assert result.exit_code == 0, result.output
    assert (tmp_path / "r.html").exists()


def test_flags_display_as_flags():
    result = runner.invoke(cli.app, ["override", "set", "-h"], env={"COLUMNS": "200"})
    rows = [line.strip("│ ").split() for line in result.output.splitlines()]
    lines = {row[0]: " ".join(row) for row in rows if row and row[0].startswith("--")}
    assert lines["--off"].split()[:3] == ["--off", "force", "speculation"]
    assert lines["--json"].split()[:2] == ["--json", "print"]


def test_the_help_constants_are_the_models():
    from specctl_vllm.controller.core.offline.replay import DEFAULT_KS, DEFAULT_POLICIES
    from specctl_vllm.kernel.cost import PRESETS

    assert set(typing.get_args(cli_common.Preset)) == set(PRESETS)
    assert replay_cli.DEFAULT_POLICIES == ",".join(DEFAULT_POLICIES)
    assert replay_cli.DEFAULT_KS == ",".join(map(str, DEFAULT_KS))
