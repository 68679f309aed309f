"""What every ``specctl`` subcommand shares: the help layout, the exit codes, the controller-URL option, and
:func:`invoke` (one subcommand run as a function, for tests and ``python -m``).

Kept free of heavy imports (no pydantic, numpy, httpx): ``specctl --help`` loads every subcommand's module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

import typer

EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3

DEFAULT_URL = "http://127.0.0.1:8081"
URL_ENV = "SPECCTL_CONTROLLER_URL"

#: every command takes -h as well as --help; its help shows each option's default (and variable, where one is read)
CONTEXT: dict[str, Any] = {"help_option_names": ["-h", "--help"], "show_default": True}
#: click's plain help layout: a flag reads ``--off``, not ``--off <bool>`` as the rich layout draws it
TYPER_SETTINGS: dict[str, Any] = {"add_completion": False, "pretty_exceptions_enable": False,
                                  "rich_markup_mode": None, "context_settings": CONTEXT}

#: The cost presets (``specctl_vllm.kernel.cost.PRESETS``; tests/unit/test_cli_framework.py checks they
#: agree) named here so that ``-h`` lists them without importing numpy.

UrlOpt = Annotated[str, typer.Option("--url", envvar=URL_ENV, help="controller base URL")]
Preset = Literal["cpu", "h200", "mi300x", "mi355x"]
PresetOpt = Annotated[Preset, typer.Option(help="cost preset the controller's cost fit starts from")]


def invoke(command: Callable[..., Any], argv: list[str] | None, prog: str, obj: Any = None) -> int:
    """Run one subcommand on ``argv`` exactly as ``specctl`` would (usage errors print their message) and return
    its exit code instead of exiting. ``obj`` reaches the command as ``ctx.obj`` (an injected clock, for tests)."""
    one = typer.Typer(**TYPER_SETTINGS)
    one.command()(command)
    try:
        one(args=list(argv or []), prog_name=prog, obj=obj)
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    return 0
