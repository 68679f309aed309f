"""The ``specctl`` command line: run the controller, read its state, manage overrides.

Exit codes: 0 success; 1 the controller refused the request (its reason is printed); 2 bad usage or
configuration (e.g. ``serve`` without tokens); 3 the controller is unreachable or could not start.

Each command is a small function over the HTTP API (or, for ``serve``, the service package); new
commands (``replay``) are added the same way: a function decorated with ``@app.command()`` that
imports what it needs lazily, so ``specctl --help`` stays fast and needs no optional dependency.
"""

from __future__ import annotations

import getpass
import json
import math
import os
import re
import sys
import unicodedata
from pathlib import Path
from typing import Annotated, Any, NoReturn
from urllib.parse import quote

import typer

from specctl_vllm.controller import bench_cli, replay_cli, report_cli
from specctl_vllm.controller.cli_common import (
    CONTEXT,
    DEFAULT_URL,
    EXIT_REFUSED,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    TYPER_SETTINGS,
    UrlOpt,
)

__all__ = ["CONTEXT", "DEFAULT_URL", "EXIT_REFUSED", "EXIT_UNREACHABLE", "EXIT_USAGE", "app", "main"]

MAX_TTL_S = 30 * 24 * 3600.0

app = typer.Typer(help="Adaptive speculative-decoding controller for vLLM.", no_args_is_help=True, **TYPER_SETTINGS)
override_app = typer.Typer(help="Operator overrides: pin k, pin the method, or force speculation off.",
                           no_args_is_help=True, **TYPER_SETTINGS)
app.add_typer(override_app, name="override")


def _version(value: bool) -> None:
    if value:
        import specctl_vllm

        typer.echo(f"specctl ({specctl_vllm.DISTRIBUTION}) {specctl_vllm.version()}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="print the version and exit")] = False,
) -> None:
    """Adaptive speculative-decoding controller for vLLM."""


def printable(text: Any) -> str:
    """``text`` safe for a terminal: control and format characters (ESC, CR, bidi overrides...) escaped."""
    out = []
    for ch in str(text):
        if ch == "\\":
            out.append("\\\\")
        elif unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp"):
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
        else:
            out.append(ch)
    return "".join(out)


def _category(written: str) -> str:
    """The category a written name means, by the controller's own rule (``protocol.category_name``: ``SQL`` is
    ``sql``), checked before anything is sent; exits 2 when it names none."""
    from specctl_vllm.kernel.protocol import category_name

    named = category_name(written)
    if named is None:
        _fail(f"invalid category {printable(written)!s}: letters (folded to lower case), digits, '_', '.', '-', "
              "starting with a letter or digit, at most 64 characters", EXIT_USAGE)
    return named


def _segment(category: str) -> str:
    """A category as one URL path segment: named by the controller's rule, then percent-encoded."""
    return quote(_category(category), safe="")


def _ttl(value: float | None) -> float | None:
    if value is not None and (not math.isfinite(value) or not 0 < value <= MAX_TTL_S):
        _fail(f"--ttl must be a finite number of seconds in (0, {MAX_TTL_S:.0f}], got {value}", EXIT_USAGE)
    return value

JsonOpt = Annotated[bool, typer.Option("--json", help="print the raw JSON answer")]


def _fail(message: str, code: int) -> NoReturn:
    typer.echo(f"specctl: {printable(message) if code != EXIT_USAGE else message}", err=True)
    raise typer.Exit(code)


def _default_actor() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no user database entry (containers)
        user = ""
    return user if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.@:\-]{0,127}", user) else "cli"


def _request(method: str, url: str, path: str, *, admin: bool = False, **kwargs: Any) -> Any:
    """One HTTP call; prints the controller's reason and exits non-zero on any failure."""
    import httpx

    headers = {}
    if admin:
        token = os.environ.get("SPECCTL_ADMIN_TOKEN", "")
        if token:
            headers["Authorization"] = f"Bearer {token}"
    try:
        response = httpx.request(method, url.rstrip("/") + path, headers=headers, timeout=10.0, **kwargs)
    except httpx.HTTPError as exc:
        _fail(f"cannot reach the controller at {url}: {type(exc).__name__}: {exc}", EXIT_UNREACHABLE)
    if response.status_code >= 400:
        _fail(_describe_error(response), EXIT_UNREACHABLE if response.status_code >= 500 else EXIT_REFUSED)
    return response.json()


def _describe_error(response: Any) -> str:
    try:
        body = response.json()
    except ValueError:
        return f"HTTP {response.status_code}"
    lines = [f"HTTP {response.status_code}: {body.get('detail', '')}"]
    for err in body.get("errors", []):
        lines.append(f"  {'.'.join(str(p) for p in err.get('loc', []))}: {err.get('msg', '')}")
    if response.status_code == 401:
        lines.append("  (set SPECCTL_ADMIN_TOKEN to the controller's admin token)")
    return "\n".join(lines)


# -- serve -------------------------------------------------------------------------------------------


# Help texts name variables and defaults in parentheses: square brackets are markup to the help renderer,
# which drops them and what they hold.
@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="listen address (env SPECCTL_HOST, default 127.0.0.1)")] = None,
    port: Annotated[int | None, typer.Option(help="listen port, 0 = any free (env SPECCTL_PORT, default 8081)")] = None,
    db: Annotated[Path | None, typer.Option(help="SQLite file (env SPECCTL_DB, default ./specctl.db)")] = None,
    insecure_dev: Annotated[bool, typer.Option("--insecure-dev", help="allow running without tokens (local development only) (env SPECCTL_INSECURE_DEV, default off)")] = False,
    admin_host: Annotated[str | None, typer.Option(help="separate listen address for admin writes (env SPECCTL_ADMIN_HOST, default none)")] = None,
    admin_port: Annotated[int | None, typer.Option(help="port of the admin listener (env SPECCTL_ADMIN_PORT, default none)")] = None,
    log_level: Annotated[str | None, typer.Option(help="debug|info|warning|error (env SPECCTL_LOG_LEVEL, default info)")] = None,
    record_dir: Annotated[Path | None, typer.Option(help="record every ingested telemetry batch here, gzip JSON lines, "
                                                     "rotated and size-capped (env SPECCTL_RECORD_DIR, default off)")] = None,
) -> None:
    """Run the controller (HTTP API, metrics, SQLite store) until interrupted."""
    from specctl_vllm.controller.service.server import check_store
    from specctl_vllm.controller.service.server import serve as run_server
    from specctl_vllm.controller.service.settings import SettingsError, load_settings
    from specctl_vllm.controller.service.store import StoreError

    try:
        settings = load_settings(
            server={"host": host, "port": port, "log_level": log_level},
            auth={"insecure_dev": insecure_dev or None, "admin_host": admin_host, "admin_port": admin_port},
            store={"db": db},
            record={"record_dir": record_dir},
        )
    except SettingsError as exc:
        _fail(f"cannot start: {exc}", EXIT_USAGE)
    try:
        check_store(settings)
    except StoreError as exc:
        _fail(f"cannot start: {exc}", EXIT_USAGE)
    try:
        code = run_server(settings)
    except OSError as exc:
        _fail(f"cannot listen: {exc}", EXIT_UNREACHABLE)
    raise typer.Exit(code)


# -- status ------------------------------------------------------------------------------------------

#: (column title, path into a category view of GET /v1/categories, format)
STATUS_COLUMNS: list[tuple[str, str, str]] = [
    ("model", "model", "{}"),
    ("category", "category", "{}"),
    ("k", "decision.k", "{}"),
    ("method", "decision.method", "{}"),
    ("source", "decision.source", "{}"),
    ("entropy", "entropy.class", "{}"),
    ("mean acc len", "mean_acceptance_length", "{:.2f}"),
    ("speedup", "decision.estimated_speedup", "{:.2f}x"),
    ("req/step", "requests_per_step", "{:.1f}"),
    ("request-steps", "request_steps", "{}"),
    ("reason", "decision.reason", "{}"),
]


def _cell(view: dict[str, Any], path: str, fmt: str) -> str:
    value: Any = view
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if value is None:
        return "-"
    try:
        return fmt.format(value)
    except (ValueError, TypeError):
        return str(value)


def format_table(rows: list[list[str]], headers: list[str]) -> str:
    """Left-aligned columns separated by two spaces (stable for scripts and narrow terminals)."""
    rows = [[printable(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    return "\n".join(lines)


def status_rows(views: list[dict[str, Any]]) -> list[list[str]]:
    return [[_cell(v, key, fmt) for _, key, fmt in STATUS_COLUMNS] for v in views]


@app.command()
def status(url: UrlOpt = DEFAULT_URL, as_json: JsonOpt = False) -> None:
    """One line per (model, category): k, method, entropy class, acceptance, estimated speedup, reason."""
    views = _request("GET", url, "/v1/categories")
    if as_json:
        typer.echo(json.dumps(views, indent=2))
        return
    engines = _request("GET", url, "/v1/engines")
    for e in engines:
        if e.get("id_conflicts"):
            typer.echo(printable(f"WARNING: engine id {e['engine_id']} is used by two running engines (boots "
                                 f"{e['boot_id']} and {e.get('conflict_boot')}; {e['id_conflicts']} batches refused): "
                                 "give each engine its own SPECCTL_ENGINE_ID"), err=True)
    if not views:
        typer.echo("no categories yet: no engine has reported telemetry")
        return
    typer.echo(format_table(status_rows(views), [title for title, _, _ in STATUS_COLUMNS]))


# -- override ----------------------------------------------------------------------------------------


@override_app.command("set")
def override_set(
    category: Annotated[str, typer.Argument(help="request category, e.g. structured")],
    reason: Annotated[str, typer.Option(help="why (kept in the audit log)")],
    k: Annotated[int | None, typer.Option("--k", min=0, max=32,
                                          help="pin the proposal length (0 = off) (default: not pinned)")] = None,
    off: Annotated[bool, typer.Option("--off", help="force speculation off")] = False,
    method: Annotated[str | None, typer.Option(help="pin the draft method (default: not pinned)")] = None,
    ttl: Annotated[float | None, typer.Option(help="seconds until the override expires (default: never)")] = None,
    actor: Annotated[str | None, typer.Option(help="who (default: the login name)")] = None,
    url: UrlOpt = DEFAULT_URL,
    as_json: JsonOpt = False,
) -> None:
    """Pin k, pin the method, or force speculation off for CATEGORY (needs SPECCTL_ADMIN_TOKEN)."""
    if k is None and method is None and not off:
        _fail("give --k N, --method M or --off", EXIT_USAGE)
    category = _category(category)
    segment = _segment(category)
    body = {"k": k, "method": method, "off": off, "ttl_s": _ttl(ttl), "reason": reason,
            "actor": actor or _default_actor()}
    answer = _request("PUT", url, f"/v1/overrides/{segment}", admin=True, json=body)
    if as_json:
        typer.echo(json.dumps(answer, indent=2))
        return
    ov = answer["override"]
    typer.echo(printable(f"override set for {category}: {_describe_override(ov)} (audit #{answer['audit']['id']})"))


@override_app.command("clear")
def override_clear(
    category: Annotated[str, typer.Argument(help="request category")],
    reason: Annotated[str, typer.Option(help="why (kept in the audit log)")] = "cleared",
    actor: Annotated[str | None, typer.Option(help="who (default: the login name)")] = None,
    url: UrlOpt = DEFAULT_URL,
) -> None:
    """Remove CATEGORY's override; the policy decides again (needs SPECCTL_ADMIN_TOKEN)."""
    params = {"actor": actor or _default_actor(), "reason": reason}
    category = _category(category)
    answer = _request("DELETE", url, f"/v1/overrides/{_segment(category)}", admin=True, params=params)
    typer.echo(printable(f"override cleared for {category} (audit #{answer['audit']['id']})"))


def _describe_override(ov: dict[str, Any]) -> str:
    what = "speculation off" if ov["off"] else ", ".join(
        f"{name}={ov[name]}" for name in ("k", "method") if ov.get(name) is not None
    )
    ttl = "no expiry" if ov.get("ttl_remaining_s") is None else f"expires in {ov['ttl_remaining_s']:.0f} s"
    return f"{what}; {ttl}"


@override_app.command("list")
def override_list(url: UrlOpt = DEFAULT_URL, as_json: JsonOpt = False) -> None:
    """Overrides in force."""
    items = _request("GET", url, "/v1/overrides")
    if as_json:
        typer.echo(json.dumps(items, indent=2))
        return
    if not items:
        typer.echo("no overrides in force")
        return
    rows = [[o["category"], _describe_override(o), o["actor"], o["reason"]] for o in items]
    typer.echo(format_table(rows, ["category", "override", "actor", "reason"]))


# -- replay, bench, report (each in its own module, heavy imports deferred to the run) ------------------

app.command()(replay_cli.replay)
app.command()(bench_cli.bench)
app.command()(report_cli.report)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point (``specctl = specctl_vllm.controller.cli:main``)."""
    app(args=argv if argv is not None else sys.argv[1:], prog_name="specctl")
