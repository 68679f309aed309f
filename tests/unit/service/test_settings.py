import pytest

from specctl_vllm.controller.service.settings import MIN_TOKEN_CHARS, SettingsError, load_settings

ADMIN = "a" * MIN_TOKEN_CHARS
INGEST = "i" * MIN_TOKEN_CHARS


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    import os

    for name in list(os.environ):
        if name.startswith("SPECCTL_"):
            monkeypatch.delenv(name)


@pytest.mark.parametrize(
    ("env", "auth", "problem"),
    [
        ({}, {}, "SPECCTL_ADMIN_TOKEN and SPECCTL_INGEST_TOKEN not set"),
        ({"SPECCTL_ADMIN_TOKEN": ADMIN}, {}, "SPECCTL_INGEST_TOKEN not set"),
        ({"SPECCTL_INGEST_TOKEN": INGEST}, {}, "SPECCTL_ADMIN_TOKEN not set"),
        ({"SPECCTL_ADMIN_TOKEN": "short", "SPECCTL_INGEST_TOKEN": INGEST}, {}, "shorter than"),
        ({"SPECCTL_ADMIN_TOKEN": ADMIN, "SPECCTL_INGEST_TOKEN": ADMIN}, {}, "must differ"),
        ({"SPECCTL_ADMIN_TOKEN": ADMIN, "SPECCTL_INGEST_TOKEN": INGEST, "SPECCTL_PORT": "70000"}, {}, "SPECCTL_PORT"),
        ({"SPECCTL_ADMIN_TOKEN": ADMIN, "SPECCTL_INGEST_TOKEN": INGEST, "SPECCTL_LOG_LEVEL": "loud"}, {},
         "SPECCTL_LOG_LEVEL"),
        ({"SPECCTL_ADMIN_TOKEN": ADMIN, "SPECCTL_INGEST_TOKEN": INGEST, "SPECCTL_SNAPSHOT_INTERVAL_S": "0"}, {},
         "SPECCTL_SNAPSHOT_INTERVAL_S"),
    ],
)
def test_refused_configurations_say_why(monkeypatch, env, auth, problem):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError) as err:
        load_settings(auth=auth)
    assert problem in str(err.value)
    # the message names variables, never their values
    assert ADMIN not in str(err.value) and INGEST not in str(err.value)


def test_all_problems_reported_at_once(monkeypatch):
    monkeypatch.setenv("SPECCTL_PORT", "-1")
    with pytest.raises(SettingsError) as err:
        load_settings()
    assert "SPECCTL_PORT" in str(err.value) and "not set" in str(err.value)


def test_insecure_dev_allows_no_tokens():
    settings = load_settings(auth={"insecure_dev": True})
    assert settings.auth.admin_token is None and settings.auth.insecure_dev


@pytest.mark.parametrize(
    ("server", "store", "expect"),
    [
        ({}, {}, ("127.0.0.1", 8081, "specctl.db")),
        ({"host": "0.0.0.0", "port": 9000}, {"db": "/tmp/x.db"}, ("0.0.0.0", 9000, "/tmp/x.db")),
        ({"host": None, "port": None}, {"db": None}, ("127.0.0.1", 8081, "specctl.db")),  # None = not given
    ],
)
def test_command_line_overrides(monkeypatch, server, store, expect):
    monkeypatch.setenv("SPECCTL_ADMIN_TOKEN", ADMIN)
    monkeypatch.setenv("SPECCTL_INGEST_TOKEN", INGEST)
    settings = load_settings(server=server, store=store)
    assert (settings.server.host, settings.server.port, str(settings.store.db)) == expect


def test_environment_read(monkeypatch):
    monkeypatch.setenv("SPECCTL_ADMIN_TOKEN", ADMIN)
    monkeypatch.setenv("SPECCTL_INGEST_TOKEN", INGEST)
    monkeypatch.setenv("SPECCTL_DB", "/var/lib/specctl/a.db")
    monkeypatch.setenv("SPECCTL_ADMIN_PORT", "9100")
    settings = load_settings()
    assert str(settings.store.db) == "/var/lib/specctl/a.db"
    assert settings.auth.separate_admin and settings.auth.admin_port == 9100
    assert settings.server.cors_origins == []  # CORS off by default


def test_every_field_documented():
    from specctl_vllm.controller.service.settings import AuthSettings, ServerSettings, StoreSettings

    for cls in (ServerSettings, AuthSettings, StoreSettings):
        for name, field in cls.model_fields.items():
            assert field.description and len(field.description) > 20, f"{cls.__name__}.{name}"
