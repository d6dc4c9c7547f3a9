"""Engine setup: every connection carries statement, lock and idle-in-transaction timeouts, and TLS if asked.

TLS is asked for with libpq's URL parameters, which asyncpg does not take through SQLAlchemy (SQLAlchemy
hands every query parameter to `asyncpg.connect` as a keyword, and `sslmode=` there is a TypeError):
`?sslmode=verify-full&sslrootcert=/etc/devsched/pg/ca.crt[&sslcert=...&sslkey=...]` is turned here into
an `ssl.SSLContext` given to asyncpg.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

#: libpq's TLS parameters that `make_engine` takes out of the URL.
SSL_PARAMS = ("sslmode", "sslrootcert", "sslcert", "sslkey")
#: The modes accepted: `prefer` and `allow` silently fall back to plain text, so they are refused.
SSL_MODES = ("disable", "require", "verify-ca", "verify-full")


class DatabaseTlsError(ValueError):
    """The database URL's TLS parameters are unusable; one line naming the parameter."""


def _why(exc: BaseException) -> str:
    return (exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)) or type(exc).__name__


def ssl_connect_arg(url: str | URL) -> tuple[URL, ssl.SSLContext | bool | None]:
    """Split libpq's TLS parameters off `url`: the URL for SQLAlchemy and asyncpg's `ssl` argument.

    `verify-full` checks the server's certificate against `sslrootcert` and its host name against the
    URL's host; `verify-ca` only the certificate; `require` encrypts without checking who answers (use it
    only where the network is trusted). `sslrootcert=system` trusts the system's CA store. No `sslmode`
    but a `sslrootcert` means `verify-full`. Nothing at all: None (asyncpg's default, no TLS over a Unix
    socket and a loopback-friendly `prefer` elsewhere).

    Raises:
        DatabaseTlsError: an unknown mode, or a certificate file that cannot be read.
    """
    parsed = make_url(url) if isinstance(url, str) else url
    params = {k: parsed.query[k] for k in SSL_PARAMS if k in parsed.query}
    if not params:
        return parsed, None
    bare = parsed.difference_update_query(SSL_PARAMS)
    values = {k: v if isinstance(v, str) else v[-1] for k, v in params.items()}
    mode = values.get("sslmode", "verify-full" if "sslrootcert" in values else "require")
    if mode not in SSL_MODES:
        raise DatabaseTlsError(f"database URL: sslmode={mode} is not supported: use one of {', '.join(SSL_MODES)}")
    if mode == "disable":
        return bare, False
    root = values.get("sslrootcert")
    verify = mode in ("verify-ca", "verify-full")
    if verify and root is None:
        raise DatabaseTlsError(f"database URL: sslmode={mode} needs sslrootcert (the CA file, or `system`)")
    try:
        context = ssl.create_default_context(cafile=None if root in (None, "system") else root)
    except (OSError, ssl.SSLError) as exc:
        raise DatabaseTlsError(f"database URL: cannot use sslrootcert {root}: {_why(exc)}") from None
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if mode == "require" and root is None:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:  # libpq: `require` with a root certificate verifies like verify-ca
        context.check_hostname = mode == "verify-full"
        context.verify_mode = ssl.CERT_REQUIRED
    cert, key = values.get("sslcert"), values.get("sslkey")
    if key is not None and cert is None:
        raise DatabaseTlsError("database URL: sslkey needs sslcert")
    if cert is not None:
        try:
            context.load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as exc:
            raise DatabaseTlsError(f"database URL: cannot use sslcert {cert} / sslkey {key}: {_why(exc)}") from None
    return bare, context


@dataclass(frozen=True, slots=True)
class DatabaseTimeouts:
    """Server-side limits, so a stuck query or a forgotten transaction cannot hold locks forever."""

    statement_s: float = 10.0
    lock_s: float = 5.0
    idle_in_transaction_s: float = 30.0
    connect_s: float = 5.0


def _ms(seconds: float) -> str:
    return str(int(seconds * 1000))


def make_engine(
    url: str,
    *,
    timeouts: DatabaseTimeouts | None = None,
    pool_size: int = 10,
    max_overflow: int = 10,
    application_name: str = "devsched",
) -> AsyncEngine:
    """An asyncpg engine for `url` (`postgresql+asyncpg://...`).

    At most `pool_size + max_overflow` connections, and each one opened is kept: SQLAlchemy's QueuePool
    would close an overflow connection as soon as it is returned to a full pool, so a steady load above
    `pool_size` would open and close a connection per request (a TCP and TLS handshake, a server process,
    every statement prepared again). No `pool_pre_ping` (a round trip per checkout): the Transactor instead
    retries an operation whose connection turns out dead before anything can have been applied. libpq's
    `sslmode`/`sslrootcert`/`sslcert`/`sslkey` in the URL become asyncpg's TLS context (`ssl_connect_arg`).

    Raises:
        DatabaseTlsError: the URL's TLS parameters are unusable.
    """
    t = timeouts or DatabaseTimeouts()
    bare, tls = ssl_connect_arg(url)
    extra: dict[str, Any] = {} if tls is None else {"ssl": tls}
    return create_async_engine(
        bare,
        pool_size=pool_size + max_overflow,
        max_overflow=0,
        pool_recycle=1800,
        # A statement's error must not carry its parameters into a log line: they are submitted values.
        hide_parameters=True,
        connect_args={
            **extra,
            "timeout": t.connect_s,
            "command_timeout": t.statement_s + 5,
            "server_settings": {
                "application_name": application_name,
                "statement_timeout": _ms(t.statement_s),
                "lock_timeout": _ms(t.lock_s),
                "idle_in_transaction_session_timeout": _ms(t.idle_in_transaction_s),
                "timezone": "UTC",
            },
        },
    )
