"""The CLI over the real app (HTTP calls routed to a TestClient): output, exit codes, token handling."""

import httpx
import pytest
from typer.testing import CliRunner

from specctl_vllm.controller import cli
from tests.unit.service.batches import batch, hist, step
from tests.unit.service.conftest import ADMIN_TOKEN, INGEST

runner = CliRunner()


@pytest.fixture
def routed(client, monkeypatch):
    """httpx.request -> the in-process app; records the Authorization header sent."""
    sent = []

    def request(method, url, headers=None, timeout=None, **kw):
        sent.append((headers or {}).get("Authorization"))
        return client.request(method, url.replace("http://ctl", ""), headers=headers, **kw)

    monkeypatch.setattr(httpx, "request", request)
    monkeypatch.setenv("SPECCTL_CONTROLLER_URL", "http://ctl")
    monkeypatch.delenv("SPECCTL_ADMIN_TOKEN", raising=False)
    return sent


def help_options(text: str) -> dict[str, str]:
    """``-h`` output as {long option: its help, wrapped lines joined}."""
    out: dict[str, str] = {}
    current = None
    for line in text.splitlines():
        words = line.split()
        if not words:
            current = None
        elif line.startswith("  ") and not line.startswith("   ") and words[0].startswith("-"):
            current = next((w.rstrip(",") for w in words if w.startswith("--")), words[0])
            out[current] = " ".join(words)
        elif current is not None and line.startswith("   "):
            out[current] += " " + " ".join(words)
        else:
            current = None
    return out


def run(*args, env=None):
    return runner.invoke(cli.app, list(args), env=env or {})


def test_status_table(client, routed):
    steps = [step({"code": [hist(4, [0, 0, 1, 1, 6])], "prose": [hist(4, [6, 2, 0, 0, 0])]})]
    client.post("/v1/telemetry", json=batch(0, steps), headers=INGEST)
    result = run("status")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split()[:4] == ["model", "category", "k", "method"]
    assert {line.split()[1] for line in lines[1:]} == {"code", "prose"}
    as_json = run("status", "--json")
    assert as_json.exit_code == 0 and '"category": "code"' in as_json.output


def test_status_empty(routed):
    result = run("status")
    assert result.exit_code == 0 and "no categories yet" in result.output


def test_override_cycle(routed):
    env = {"SPECCTL_ADMIN_TOKEN": ADMIN_TOKEN}
    result = run("override", "set", "code", "--k", "2", "--ttl", "60", "--reason", "pin", "--actor", "alice", env=env)
    assert result.exit_code == 0, result.output
    assert "override set for code: k=2; expires in 60 s (audit #1)" in result.output
    assert routed[-1] == f"Bearer {ADMIN_TOKEN}"
    listed = run("override", "list")
    assert listed.exit_code == 0 and "code" in listed.output and "alice" in listed.output
    result = run("override", "set", "prose", "--off", "--reason", "incident", env=env)
    assert result.exit_code == 0 and "speculation off; no expiry" in result.output
    cleared = run("override", "clear", "code", "--reason", "done", "--actor", "bob", env=env)
    assert cleared.exit_code == 0 and "audit #3" in cleared.output
    assert "code" not in run("override", "list").output


@pytest.mark.parametrize(
    ("args", "env", "code", "message"),
    [
        (["override", "set", "code", "--k", "2", "--reason", "r"], {}, 1, "SPECCTL_ADMIN_TOKEN"),
        (["override", "set", "code", "--k", "2", "--reason", "r"], {"SPECCTL_ADMIN_TOKEN": "wrong-token-xxxxxxxx"},
         1, "HTTP 403"),
        (["override", "set", "code", "--reason", "r"], {"SPECCTL_ADMIN_TOKEN": ADMIN_TOKEN}, 2, "--k N"),
        # refused client-side with the server's bound (it was sent and refused by the server before)
        (["override", "set", "code", "--k", "99", "--reason", "r"], {"SPECCTL_ADMIN_TOKEN": ADMIN_TOKEN}, 2, "--k"),
        (["override", "clear", "nothing"], {"SPECCTL_ADMIN_TOKEN": ADMIN_TOKEN}, 1, "HTTP 404"),
        (["override", "set", "code", "--k", "1"], {"SPECCTL_ADMIN_TOKEN": ADMIN_TOKEN}, 2, "--reason"),
    ],
)
def test_errors_are_clear(routed, args, env, code, message):
    result = run(*args, env=env)
    assert result.exit_code == code
    assert message in result.output
    assert ADMIN_TOKEN not in result.output


def test_unreachable_controller():
    result = run("status", "--url", "http://127.0.0.1:9")
    assert result.exit_code == cli.EXIT_UNREACHABLE and "cannot reach the controller" in result.output


def test_serve_refuses_without_tokens(tmp_path, monkeypatch):
    for name in ("SPECCTL_ADMIN_TOKEN", "SPECCTL_INGEST_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    result = run("serve", "--db", str(tmp_path / "x.db"))
    assert result.exit_code == cli.EXIT_USAGE
    assert "refusing to start without authentication" in result.output and "--insecure-dev" in result.output


def test_serve_refuses_unusable_db(tmp_path):
    bad = tmp_path / "junk.db"
    bad.write_bytes(b"not a database" * 100)
    result = run("serve", "--insecure-dev", "--db", str(bad))
    assert result.exit_code == cli.EXIT_USAGE and "cannot start" in result.output


def test_table_format():
    assert cli.format_table([["a", "bbb"], ["cc", "d"]], ["h1", "h2"]).splitlines() == ["h1  h2", "a   bbb", "cc  d"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("override", "set", "a/../b", "--k", "1", "--reason", "r"), "invalid category"),
        (("override", "set", "code?x=1", "--k", "1", "--reason", "r"), "invalid category"),
        (("override", "set", "%2e%2e", "--k", "1", "--reason", "r"), "invalid category"),
        (("override", "clear", "a/b"), "invalid category"),
        (("override", "set", "code", "--k", "1", "--ttl", "inf", "--reason", "r"), "--ttl must be a finite"),
        (("override", "set", "code", "--k", "1", "--ttl", "nan", "--reason", "r"), "--ttl must be a finite"),
        (("override", "set", "code", "--k", "1", "--ttl", "-5", "--reason", "r"), "--ttl must be a finite"),
    ],
    ids=["slash", "query", "encoded", "clear-slash", "inf", "nan", "negative"],
)
def test_bad_arguments_are_usage_errors_and_send_nothing(routed, args, message):
    result = run(*args, env={"SPECCTL_ADMIN_TOKEN": ADMIN_TOKEN})
    assert result.exit_code == cli.EXIT_USAGE, result.output
    assert message in result.output and "Traceback" not in result.output
    assert routed == []  # refused client-side: nothing reached the controller


def test_one_name_never_rewrites_another(routed):
    """'a.b' and 'a' are different overrides (the path was sent unencoded and unchecked before)."""
    env = {"SPECCTL_ADMIN_TOKEN": ADMIN_TOKEN}
    assert run("override", "set", "a.b", "--k", "1", "--reason", "r", env=env).exit_code == 0
    assert run("override", "set", "a", "--k", "2", "--reason", "r", env=env).exit_code == 0
    listed = {line.split()[0]: line for line in run("override", "list").output.splitlines()[1:]}
    assert "k=1" in listed["a.b"] and "k=2" in listed["a"]


@pytest.mark.parametrize(
    ("raw", "shown"),
    [("m\x1b[2Jx", "m\\x1b[2Jx"), ("a\rb", "a\\x0db"), ("r\u202eevil", "r\\u202eevil"), ("back\\slash", "back\\\\slash"),
     ("plain-ñ", "plain-ñ")],
)
def test_tables_escape_control_characters(raw, shown):
    table = cli.format_table([[raw, "x"]], ["model", "k"])
    assert table.splitlines()[1].startswith(shown)
    assert not any(ord(c) < 32 for c in table.replace("\n", ""))


def test_status_escapes_model_names(client, routed):
    client.post("/v1/telemetry", json=batch(0, model="evil\x1b]0;pwned\x07"), headers=INGEST)
    result = run("status")
    assert result.exit_code == 0 and "\x1b" not in result.output and "\\x1b]0;pwned\\x07" in result.output


def test_status_warns_of_a_shared_engine_id(client, routed):
    client.post("/v1/telemetry", json=batch(0, boot_id="boot-a"), headers=INGEST)
    client.post("/v1/telemetry", json=batch(0, boot_id="boot-b"), headers=INGEST)
    client.post("/v1/telemetry", json=batch(1, boot_id="boot-a"), headers=INGEST)
    client.post("/v1/telemetry", json=batch(2, boot_id="boot-a"), headers=INGEST)  # boot-a is still running
    result = run("status")
    assert result.exit_code == 0 and "used by two running engines" in result.output


@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_short_help_and_defaults_shown(flag):
    result = run("override", "set", flag)
    assert result.exit_code == 0 and "SPECCTL_CONTROLLER_URL" in result.output and "default" in result.output


def test_version():
    result = run("--version")
    assert result.exit_code == 0 and result.output.startswith("specctl")


def test_serve_help_names_every_variable_and_default():
    """`serve --help` shows each option's variable and the setting's default (square brackets in a help text
    are markup to the renderer, which dropped them with what they held)."""
    from specctl_vllm.controller.service.settings import AuthSettings, RecordSettings, ServerSettings, StoreSettings

    result = runner.invoke(cli.app, ["serve", "--help"], env={"COLUMNS": "300"})
    assert result.exit_code == 0
    lines = help_options(result.output)
    fields = {"host": ServerSettings, "port": ServerSettings, "log_level": ServerSettings, "db": StoreSettings,
              "admin_host": AuthSettings, "admin_port": AuthSettings, "insecure_dev": AuthSettings,
              "record_dir": RecordSettings}
    for name, model in fields.items():
        line = lines["--" + name.replace("_", "-")]
        assert f"env SPECCTL_{name.upper()}" in line, line
        default = model.model_fields[name].default
        if default not in (None, False):
            assert f"default {'./' if name == 'db' else ''}{default}" in line, line
