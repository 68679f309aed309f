import json
import logging

import pytest

from specctl_vllm.controller.service.logs import REDACTED, JsonFormatter, RedactSecrets

SECRET = "tok-abcdefghijklmnop"


def _format(record: logging.LogRecord, secrets=(SECRET,)) -> dict:
    RedactSecrets(secrets).filter(record)
    return json.loads(JsonFormatter().format(record))


def _record(msg, args=(), **extra) -> logging.LogRecord:
    record = logging.LogRecord("controller.service", logging.INFO, __file__, 1, msg, args, None)
    for key, value in extra.items():
        setattr(record, key, value)
    return record


@pytest.mark.parametrize(
    "record",
    [
        _record(f"header was Bearer {SECRET}"),
        _record("header was %s", (f"Bearer {SECRET}",)),
        _record("request", authorization=f"Bearer {SECRET}"),
    ],
)
def test_secrets_redacted(record):
    text = json.dumps(_format(record))
    assert SECRET not in text and REDACTED in text


def test_json_fields_and_extras():
    entry = _format(_record("override set", category="code", audit_id=3))
    assert entry["msg"] == "override set" and entry["level"] == "info"
    assert entry["category"] == "code" and entry["audit_id"] == 3 and "ts" in entry


def test_exception_text_redacted():
    try:
        raise ValueError(f"bad token {SECRET}")
    except ValueError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "boom", (), exc_info=__import__("sys").exc_info())
    entry = _format(record)
    assert SECRET not in entry["exc"] and "ValueError" in entry["exc"]


def test_warnings_are_logged_as_json(capfd):
    import subprocess
    import sys

    code = ("import warnings, numpy as np\n"
            "from specctl_vllm.controller.service import logs\n"
            "logs.configure('info')\n"
            "warnings.warn('a library warning')\n"
            "np.ones(2) / np.zeros(2)\n")
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines, "the warnings were not logged at all"
    for line in lines:
        entry = json.loads(line)  # every line JSON: no plain-text warning on stderr
        assert entry["level"] == "warning"
    assert any("a library warning" in json.loads(line)["msg"] for line in lines)
