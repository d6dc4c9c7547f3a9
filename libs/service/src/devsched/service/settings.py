"""Configuration of the control-plane services: environment variables and flags of the same names.

Every field `foo_bar` is read from `DEVSCHED_FOO_BAR` and can be overridden by the flag `--foo-bar`
(flags win over the environment, which wins over the defaults; `devsched.service.flags` makes the flags).
Durations are in seconds, fractions allowed. A deployment can hand the same environment to every service:
each reads the settings its type holds and ignores the others.

| type | holds | read by |
| --- | --- | --- |
| `ProcessSettings` | NATS access, subject prefix, logs, health endpoints | every service (the dashboard: these only) |
| `ServiceSettings` | the above, the NATS drain, the database and the store's policies | the scheduler, the sweeper |
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from devsched.core.health import QUARANTINE_AFTER_DEFAULT
from devsched.core.ids import TOKEN_PATTERN
from devsched.protocol.tls import NatsSettings, TlsConfigError, with_postgres_ssl

#: A single NATS subject token (the prefix).
Token = Annotated[str, Field(pattern=TOKEN_PATTERN)]
#: A duration in seconds: finite and above zero.
Seconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]

#: Environment variable prefix of every setting.
ENV_PREFIX = "DEVSCHED_"


class SettingsError(Exception):
    """The configuration is invalid; the message names every offending setting."""


class ProcessSettings(NatsSettings, BaseSettings):
    """What every service process reads: NATS access (`NatsSettings`), the deployment, logs, health."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_ignore_empty=True,
        extra="ignore",
        frozen=True,
        use_attribute_docstrings=True,
    )

    subject_prefix: Token = "devsched"
    """Prefix of every subject, stream and service name of the deployment."""
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    """Lowest level of the JSON log lines written to stderr."""
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    """Port of the HTTP health endpoints (`/healthz`, `/readyz`); unset: no listener (0: any free port)."""
    metrics_host: str = Field(default="127.0.0.1", min_length=1)
    """Address the health endpoints listen on; `0.0.0.0` in a container, for the kubelet's probes."""

    def check_files(self) -> None:
        """Read every credentials and TLS file once, so that a bad one stops the service at start.

        Raises:
            SettingsError: one line naming the file and what is wrong with it.
        """
        try:
            self.check()
        except TlsConfigError as exc:
            raise SettingsError(f"invalid configuration:\n  {exc}") from None


class ServiceSettings(ProcessSettings):
    """What the control-plane services that hold the database read (the scheduler, the sweeper)."""

    drain_timeout_s: Seconds = 5.0
    """Bound on draining the NATS connection at shutdown (nats-py's default, 30 s, outlives a pod's grace)."""
    database_url: str = "postgresql+asyncpg://postgres@127.0.0.1:5432/devsched"
    """Postgres URL, `postgresql+asyncpg://user:password@host:port/db`."""
    heartbeat_interval_s: float = Field(default=5.0, ge=0.5, allow_inf_nan=False)
    """Heartbeat interval given to hosts; three missed intervals make a host offline (at least 0.5 s:
    the store records liveness at most once a second per host)."""
    device_grace_s: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    """How long a device whose lease expired stays out of use; default: the expired attempt's ttl."""
    quarantine_after: int = Field(default=QUARANTINE_AFTER_DEFAULT, ge=0, le=1000)
    """Consecutive infrastructure failures on a device (an `infra` step failing, a lease expiry, a
    `device_fault` release) that quarantine it; 0 never quarantines (`devsched.core.health`)."""
    db_pool_size: int = Field(default=10, ge=1, le=200)
    """Pooled Postgres connections (the pool may overflow by as many again under load)."""
    database_ssl_root_cert: Path | None = None
    """CA of the Postgres server: adds `sslmode=verify-full&sslrootcert=...` to the database URL."""
    database_ssl_cert: Path | None = None
    """Client certificate for Postgres (`sslcert`)."""
    database_ssl_key: Path | None = None
    """Private key of `database_ssl_cert` (`sslkey`)."""

    @model_validator(mode="after")
    def _database_key_needs_cert(self) -> ServiceSettings:
        if self.database_ssl_key is not None and self.database_ssl_cert is None:
            raise ValueError(f"{ENV_PREFIX}DATABASE_SSL_KEY needs {ENV_PREFIX}DATABASE_SSL_CERT")
        return self

    def check_files(self) -> None:
        """Read every credentials and TLS file once, so that a bad one stops the service at start.

        Raises:
            SettingsError: one line naming the file and what is wrong with it.
        """
        super().check_files()
        for name in ("database_ssl_root_cert", "database_ssl_cert", "database_ssl_key"):
            path = getattr(self, name)
            if path is not None and not os.access(path, os.R_OK):
                raise SettingsError(f"invalid configuration:\n  {ENV_PREFIX}{name.upper()}: cannot read {path}")

    @property
    def database_dsn(self) -> str:
        """`database_url` with the `database_ssl_*` settings as libpq parameters (what engines are given)."""
        return with_postgres_ssl(
            self.database_url, self.database_ssl_root_cert, self.database_ssl_cert, self.database_ssl_key
        )
