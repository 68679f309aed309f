"""Bearer-token checks: SHA-256 of the presented token compared in constant time with the configured one.

Hashing first makes the comparison length-independent (both sides are 32 bytes), so neither a wrong
length nor a wrong prefix answers faster. Missing token -> 401, wrong token -> 403. The token itself is
kept only as its digest and never logged or echoed.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from enum import Enum

from pydantic import SecretStr


class Scope(str, Enum):
    INGEST = "ingest"
    ADMIN = "admin"


class AuthError(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


@dataclass(frozen=True)
class TokenCheck:
    """One scope's expected token digest; ``None`` means the scope is open (``--insecure-dev``)."""

    scope: Scope
    digest: bytes | None

    @classmethod
    def from_secret(cls, scope: Scope, secret: SecretStr | None) -> TokenCheck:
        value = secret.get_secret_value() if secret is not None else ""
        return cls(scope, _digest(value) if value else None)

    def verify(self, authorization: str | None) -> None:
        """Raise :class:`AuthError` unless ``authorization`` is ``Bearer <the token>``."""
        if self.digest is None:
            return
        if not authorization:
            raise AuthError(401, f"missing bearer token ({self.scope.value} token required)")
        scheme, _, presented = authorization.partition(" ")
        if scheme.lower() != "bearer" or not presented.strip():
            raise AuthError(401, f"expected 'Authorization: Bearer <{self.scope.value} token>'")
        if not hmac.compare_digest(_digest(presented.strip()), self.digest):
            raise AuthError(403, f"token not valid for {self.scope.value}")


_WILDCARDS = {"0.0.0.0", "::", ""}


@dataclass(frozen=True)
class AdminListener:
    """The separate admin address, as bound; matched against the local address of each connection."""

    host: str
    port: int

    def matches(self, server: tuple[str, int] | None) -> bool:
        if server is None:
            return False
        host, port = server[0], server[1]
        return port == self.port and (self.host in _WILDCARDS or host == self.host)
