"""JSON logs, one object per line, with secrets scrubbed from every record.

Tokens are never passed to a logger on purpose; :class:`RedactSecrets` is the second line of defence
(e.g. an exception message that happens to quote a header).
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

#: LogRecord attributes that are not user-supplied ``extra`` fields.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "taskName"}
#: Extras other libraries attach that only duplicate the message (uvicorn's ANSI-coloured copy).
_DROPPED = {"color_message"}
REDACTED = "[redacted]"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, tz=UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in _DROPPED and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exc"] = record.exc_text
        return json.dumps(entry, default=str)


class RedactSecrets(logging.Filter):
    """Replace any occurrence of the given secrets in the formatted message, args and extras."""

    def __init__(self, secrets: Iterable[str]) -> None:
        super().__init__()
        self._secrets = [s for s in secrets if s]

    def _scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, REDACTED)
        return text

    def filter(self, record: logging.LogRecord) -> bool:
        if not self._secrets:
            return True
        record.msg = self._scrub(record.getMessage())
        record.args = ()
        for key, value in list(vars(record).items()):
            if key not in _STANDARD and isinstance(value, str):
                setattr(record, key, self._scrub(value))
        if record.exc_info:
            record.exc_text = self._scrub(logging.Formatter().formatException(record.exc_info))
            record.exc_info = None
        return True


def _handler(secrets: Iterable[str]) -> logging.Handler:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(RedactSecrets(secrets))
    return handler


def configure(level: str, secrets: Iterable[str] = ()) -> None:
    """Route the service's and uvicorn's loggers to one JSON handler on stderr."""
    handler = _handler(list(secrets))
    for name in ("controller", "uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers = [handler] if name in {"controller", "uvicorn"} else []
        logger.propagate = name not in {"controller", "uvicorn"}
        logger.setLevel(level.upper())
    # Python's warnings (numpy's, a library's deprecation) would print plain text to stderr: as JSON records
    logging.captureWarnings(True)
    warnings_logger = logging.getLogger("py.warnings")
    warnings_logger.handlers = [handler]
    warnings_logger.propagate = False
