"""Service configuration: one pydantic-settings class per concern, read from ``SPECCTL_*`` variables.

Every field states its unit, default and why that default. :func:`load_settings` reads all of them,
applies command-line overrides, and reports every problem at once; the result is a frozen bundle that
the rest of the service receives (nothing reads the environment afterwards).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

#: Shortest accepted bearer token: 16 characters is ~96 bits from a random base64 generator.
MIN_TOKEN_CHARS = 16


class _Env(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SPECCTL_", extra="ignore", frozen=True)


class ServerSettings(_Env):
    """Where the HTTP API listens and what it accepts."""

    host: str = Field(
        default="127.0.0.1",
        description="listen address; loopback by default so nothing is exposed until the operator chooses to",
    )
    port: int = Field(
        default=8081,
        ge=0,
        le=65535,
        description="listen TCP port (0 = any free port, logged at start); 8081 leaves 8000 to vLLM",
    )
    max_body_bytes: int = Field(
        default=4 * 1024 * 1024,
        ge=1024,
        description="request body cap in bytes (413 above it); a 100 ms batch from a busy engine is a few KiB, "
        "4 MiB leaves room for a backlog flush while bounding memory per request",
    )
    ingest_bytes_in_flight: int = Field(
        default=4 * 1024 * 1024,
        ge=64 * 1024,
        description="bytes of telemetry bodies over 8 KiB between arrival and merge, in all (one body is always let "
        "in); a post beyond it gets 429 with Retry-After before its body is read. A parsed batch takes ~14x its "
        "bytes (52 MB for a 3.7 MB body): with 8 MiB, two were held at once (one merged, the next parsed) and the "
        "soak's server reached 259 MB; 4 MiB is one maximal body. The parses run one at a time anyway, so a second "
        "flush waits little longer. Engines' regular posts (a few KiB) are never counted",
    )
    ingest_engine_bytes_in_flight: int = Field(
        default=4 * 1024 * 1024,
        ge=64 * 1024,
        description="the same, per engine (known once the body is parsed): one engine's backlog flush cannot take "
        "the whole share; 4 MiB is one maximal body",
    )
    cors_origins: list[str] = Field(
        default_factory=list,
        description="browser origins allowed by CORS; empty = CORS off, because only engines and operators call "
        "the API and a browser page must not be able to drive it",
    )
    log_level: str = Field(default="info", description="log level of the JSON logs (debug, info, warning, error)")
    access_log: bool = Field(
        default=True,
        description="one JSON log line per HTTP request; on by default for auditability, turn off when many "
        "engines report (one line per telemetry batch)",
    )
    maintenance_interval_s: float = Field(
        default=1.0,
        gt=0,
        le=60,
        description="seconds between sweeps that drop expired overrides (and audit it); 1 s keeps the audit "
        "close to the expiry, which itself is enforced at read time regardless",
    )

    max_connections: int | None = Field(
        default=None,
        ge=1,
        le=1_048_576,
        description="open connections; unset = what the file descriptors allow (RLIMIT_NOFILE less 64 kept for "
        "the store, recorder and render worker). At the cap a new connection evicts the one idle longest (waiting "
        "for a request or still sending headers); one in a request is never evicted. An engine holds one "
        "keep-alive connection, so the cap is what stops idle sockets from exhausting the descriptors",
    )
    max_header_bytes: int = Field(
        default=16 * 1024,
        ge=1024,
        le=1024 * 1024,
        description="bytes of a request line and its headers; beyond it 431 and the connection is closed before "
        "the parser buffers them. An engine's or operator's request has under 1 KiB; 16 KiB is h11's default",
    )
    max_header_count: int = Field(
        default=64,
        ge=8,
        le=1024,
        description="header lines of a request; beyond it 431. An engine sends about 6",
    )
    header_timeout_s: float = Field(
        default=10.0,
        gt=0,
        le=600,
        description="seconds a connection may take to send a request's line and headers (from when it opened, "
        "or from the previous response); then it is closed. An engine sends them in one packet",
    )
    body_timeout_s: float = Field(
        default=30.0,
        gt=0,
        le=600,
        description="seconds from a request's headers to the end of its body; then 408. A 4 MiB body arrives "
        "in well under a second on any network an engine reports over",
    )
    keep_alive_s: int = Field(
        default=5,
        ge=1,
        le=600,
        description="seconds an idle keep-alive connection is kept open after a response; engines post every "
        "0.1 s and keep theirs, an idle client is let go",
    )
    concurrency_limit: int = Field(
        default=256,
        ge=1,
        le=65_536,
        description="telemetry posts in progress at once; beyond it 503 with Retry-After rather than an unbounded "
        "queue. Open connections do not count (idle keep-alive ones cost nothing here), nor do the probes "
        "/healthz and /readyz, which are never refused; other requests have SPECCTL_ADMIN_CONCURRENCY",
    )
    admin_concurrency: int = Field(
        default=32,
        ge=1,
        le=65_536,
        description="requests in progress at once other than telemetry posts and probes (reads, /metrics, "
        "overrides, forget); beyond it 503 with Retry-After, so a flood of reads never takes the engines' share",
    )

    large_batch_cpu_share: float = Field(
        default=0.25,
        gt=0,
        le=1,
        description="fraction of wall time a large body's parse may run (the rest it sleeps, the GIL free for the "
        "event loop); 1 = no pauses. A 4 MiB backlog flush takes ~0.5 s of CPU to parse, so ~2 s at 0.25. Beside "
        "two clients flooding 4 MB batches, 16 engines' regular posts took (server side, p99) <= 500 ms unpaced, "
        "<= 250 ms at 0.5, <= 50 ms at 0.25 (docs/reliability.md#soak)",
    )
    gil_switch_interval_s: float = Field(
        default=0.001,
        gt=0,
        le=0.1,
        description="seconds a thread may hold the GIL while another waits for it (sys.setswitchinterval); the "
        "event loop that answers the engines' regular posts waits up to this long each time it wakes while a "
        "large batch is parsed or merged in a worker thread. Python's default 0.005 gave those posts a server-side "
        "p99 <= 250 ms beside two clients flooding, 0.001 <= 50 ms (docs/reliability.md#soak)",
    )
    render_processes: int = Field(
        default=1,
        ge=0,
        le=4,
        description="processes that write /metrics text (0 = a worker thread of the server). Writing a full "
        "budget's text is about 0.4 s of Python; in the server's interpreter it holds the GIL the engines' "
        "posts need (ingest p99 150-250 ms during scrapes, measured), in its own process it does not",
    )

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        value = value.lower()
        if value not in {"debug", "info", "warning", "error"}:
            raise ValueError("must be one of debug, info, warning, error")
        return value


class AuthSettings(_Env):
    """Bearer tokens and where admin writes are accepted."""

    admin_token: SecretStr | None = Field(
        default=None,
        description="bearer token for override writes (PUT/DELETE /v1/overrides); required unless --insecure-dev",
    )
    ingest_token: SecretStr | None = Field(
        default=None,
        description="bearer token for POST /v1/telemetry, separate from the admin token so that an engine host "
        "that leaks it cannot change policy; required unless --insecure-dev",
    )
    admin_host: str | None = Field(
        default=None,
        description="optional second listen address for admin writes; when set, override writes are refused on "
        "the main listener so the admin API can stay on a private network",
    )
    admin_port: int | None = Field(default=None, ge=0, le=65535, description="TCP port of the admin listener")
    insecure_dev: bool = Field(
        default=False,
        description="allow starting without tokens (writes then need no token); for local development only",
    )

    @property
    def separate_admin(self) -> bool:
        return self.admin_host is not None or self.admin_port is not None


class StoreSettings(_Env):
    """The SQLite file that keeps overrides, the audit log and learned-state snapshots."""

    db: Path = Field(
        default=Path("specctl.db"),
        description="SQLite file (created if missing, WAL mode); one file so backup is a copy",
    )
    snapshot_interval_s: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="seconds between snapshots of the learned state; a crash (kill -9) loses at most this much "
        "learning, a clean shutdown loses nothing; 30 s is a few hundred batches of an engine",
    )
    snapshots_kept: int = Field(
        default=3, ge=1, le=100, description="snapshots kept in the file; older ones are deleted after each write"
    )
    busy_timeout_ms: int = Field(
        default=5000,
        ge=0,
        description="milliseconds SQLite waits on a lock held by another process (e.g. a backup) before failing",
    )


class RecordSettings(_Env):
    """The telemetry recorder (off unless ``record_dir`` is set; :mod:`specctl_vllm.controller.service.recorder`).

    On disk the recordings take at most ``record_max_bytes`` plus the file being written."""

    record_dir: Path | None = Field(
        default=None,
        description="folder for telemetry recordings (created if missing); unset = no recording (the default: "
        "recordings hold every engine's step statistics and take disk space)",
    )
    record_max_bytes: int = Field(
        default=1024 * 1024 * 1024,
        ge=1024 * 1024,
        description="bytes the recordings may take in the folder (compressed); the oldest files are deleted "
        "beyond it. 1 GiB holds days of one busy engine (a 100 ms batch is ~1-4 KiB, ~10x smaller gzipped)",
    )
    record_file_bytes: int = Field(
        default=64 * 1024 * 1024,
        ge=64 * 1024,
        description="compressed bytes after which a file is closed and the next started; 64 MiB keeps files easy "
        "to copy and lets the size cap delete in small steps",
    )
    record_queue_batches: int = Field(
        default=10_000,
        ge=10,
        description="batches waiting for the writer; beyond it a batch is dropped (and counted) rather than "
        "slowing ingest down; 10 000 is ~15 minutes of one engine",
    )
    record_queue_bytes: int = Field(
        default=16 * 1024 * 1024,
        ge=64 * 1024,
        description="bytes of batch bodies waiting for the writer (one batch is always let in); beyond it a batch "
        "is dropped (and counted). 16 MiB holds 10 000 of an engine's regular 1.6 KiB posts or four maximal "
        "bodies, and bounds the queue's memory whatever the writer's pace (a full disk, a slow one)",
    )
    record_flush_s: float = Field(
        default=1.0,
        gt=0,
        le=300,
        description="seconds between flushes of the gzip stream: what a kill -9 can lose at most",
    )


@dataclass(frozen=True)
class ServiceSettings:
    """Everything the service needs, validated once at start."""

    server: ServerSettings
    auth: AuthSettings
    store: StoreSettings
    record: RecordSettings = field(default_factory=RecordSettings)


class SettingsError(ValueError):
    """Configuration that must stop the service from starting; the message lists every problem."""


def _check_tokens(auth: AuthSettings, problems: list[str]) -> None:
    missing = [
        env
        for env, token in (("SPECCTL_ADMIN_TOKEN", auth.admin_token), ("SPECCTL_INGEST_TOKEN", auth.ingest_token))
        if token is None or not token.get_secret_value()
    ]
    if missing and not auth.insecure_dev:
        problems.append(
            f"{' and '.join(missing)} not set: refusing to start without authentication "
            "(set them, or pass --insecure-dev for a local development server)"
        )
    for env, token in (("SPECCTL_ADMIN_TOKEN", auth.admin_token), ("SPECCTL_INGEST_TOKEN", auth.ingest_token)):
        if token is not None and 0 < len(token.get_secret_value()) < MIN_TOKEN_CHARS:
            problems.append(f"{env} is shorter than {MIN_TOKEN_CHARS} characters")
    if (
        auth.admin_token is not None
        and auth.ingest_token is not None
        and auth.admin_token.get_secret_value()
        and auth.admin_token.get_secret_value() == auth.ingest_token.get_secret_value()
    ):
        problems.append("SPECCTL_ADMIN_TOKEN and SPECCTL_INGEST_TOKEN must differ")


def _describe(error: ValidationError) -> list[str]:
    # Only the field and the message: pydantic's full text would echo the input (maybe a token).
    return [f"SPECCTL_{str(e['loc'][0]).upper() if e['loc'] else '?'}: {e['msg']}" for e in error.errors()]


def load_settings(
    server: dict[str, Any] | None = None,
    auth: dict[str, Any] | None = None,
    store: dict[str, Any] | None = None,
    record: dict[str, Any] | None = None,
) -> ServiceSettings:
    """Read the environment, apply non-None overrides (from the command line), validate everything.

    Raises :class:`SettingsError` listing all problems, never the token values.
    """
    problems: list[str] = []
    parts: dict[str, Any] = {}
    sources = (("server", ServerSettings, server), ("auth", AuthSettings, auth), ("store", StoreSettings, store),
               ("record", RecordSettings, record))
    for name, cls, given in sources:
        overrides = {k: v for k, v in (given or {}).items() if v is not None}
        try:
            parts[name] = cls(**overrides)
        except ValidationError as exc:
            problems.extend(_describe(exc))
    if "auth" in parts:
        _check_tokens(parts["auth"], problems)
    if problems:
        raise SettingsError("; ".join(problems))
    return ServiceSettings(**parts)
