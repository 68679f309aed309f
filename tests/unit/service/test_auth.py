import pytest
from pydantic import SecretStr

from specctl_vllm.controller.service.auth import AdminListener, AuthError, Scope, TokenCheck

TOKEN = "s3cret-token-0123456789"


@pytest.mark.parametrize(
    ("header", "status"),
    [
        (None, 401),
        ("", 401),
        ("Basic abc", 401),
        ("Bearer", 401),
        ("Bearer ", 401),
        (f"Bearer {TOKEN}x", 403),
        (f"Bearer {TOKEN[:-1]}", 403),
        ("Bearer " + "é" * 40, 403),
        (f"Bearer {TOKEN}", None),
        (f"bearer {TOKEN}", None),
        (f"Bearer  {TOKEN} ", None),
    ],
)
def test_verify(header, status):
    check = TokenCheck.from_secret(Scope.INGEST, SecretStr(TOKEN))
    if status is None:
        check.verify(header)
        return
    with pytest.raises(AuthError) as err:
        check.verify(header)
    assert err.value.status == status
    assert TOKEN not in err.value.reason


def test_only_digest_is_kept():
    check = TokenCheck.from_secret(Scope.ADMIN, SecretStr(TOKEN))
    assert TOKEN.encode() not in repr(check).encode() and len(check.digest) == 32


@pytest.mark.parametrize("secret", [None, SecretStr("")])
def test_open_scope_without_token(secret):
    TokenCheck.from_secret(Scope.ADMIN, secret).verify(None)


@pytest.mark.parametrize(
    ("listener", "server", "match"),
    [
        (AdminListener("127.0.0.1", 9100), ("127.0.0.1", 9100), True),
        (AdminListener("127.0.0.1", 9100), ("127.0.0.1", 8081), False),
        (AdminListener("10.0.0.2", 8081), ("10.0.0.1", 8081), False),
        (AdminListener("0.0.0.0", 9100), ("192.168.1.5", 9100), True),
        (AdminListener("::", 9100), ("::1", 9100), True),
        (AdminListener("127.0.0.1", 9100), None, False),
    ],
)
def test_admin_listener(listener, server, match):
    assert listener.matches(server) is match
