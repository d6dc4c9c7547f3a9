"""Configuration of the control-plane services: environment variables and flags of the same names.

Every field `foo_bar` is read from `DEVSCHED_FOO_BAR` and can be overridden by the flag `--foo-bar`
(flags win over the environment, which wins over the defaults). Durations are in seconds, fractions
allowed. The names are ARCHITECTURE.md's; a deployment can hand the same environment to every service.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from devsched.core.health import QUARANTINE_AFTER_DEFAULT
from devsched.core.ids import TOKEN_PATTERN
from devsched.protocol.tls import NatsSettings, TlsConfigError, with_postgres_ssl

#: A single NATS subject token (the prefix).
Token = Annotated[str, Field(pattern=TOKEN_PATTERN)]
#: A duration in seconds: finite and above zero.
Seconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]

S = TypeVar("S", bound="ProcessSettings")

#: Environment variable prefix of every setting.
ENV_PREFIX = "DEVSCHED_"


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
    drain_timeout_s: Seconds = 5.0
    """Bound on draining the NATS connection at shutdown (nats-py's default, 30 s, outlives a pod's grace)."""
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
    """What every control-plane service that holds the database reads (the scheduler, the sweeper)."""

    database_url: str = "postgresql+asyncpg://postgres@127.0.0.1:5432/devsched"
    """Postgres URL, `postgresql+asyncpg://user:password@host:port/db`."""
    sweep_interval_s: Seconds = 1.0
    """Seconds between two sweeps of expired leases."""
    heartbeat_interval_s: float = Field(default=5.0, ge=0.5, allow_inf_nan=False)
    """Heartbeat interval given to hosts; three missed intervals make a host offline (at least 0.5 s:
    the store records liveness at most once a second per host)."""
    max_payload_bytes: int = Field(default=524288, ge=1024)
    """Largest request body accepted (413 above it); keep it below the NATS server's max_payload."""
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


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def build_parser(settings_type: type[ProcessSettings], prog: str, description: str) -> argparse.ArgumentParser:
    """An argparse parser with one `--flag` per settings field (default: not given, so env applies)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    for name, field in settings_type.model_fields.items():
        env = ENV_PREFIX + name.upper()
        help_text = f"{field.description or ''} [env {env}]".strip()
        if field.annotation is bool:
            parser.add_argument(
                _flag(name), dest=name, action=argparse.BooleanOptionalAction, default=None, help=help_text
            )
        else:
            parser.add_argument(_flag(name), dest=name, default=None, metavar=name.upper(), help=help_text)
    return parser


class SettingsError(Exception):
    """The configuration is invalid; the message names every offending setting."""


def settings_from(settings_type: type[S], options: argparse.Namespace) -> S:
    """Settings from the environment, overridden by the flags that were given; their files are readable.

    Raises:
        SettingsError: a value is invalid (the message names the env variable and flag).
    """
    given: dict[str, Any] = {
        name: value for name, value in vars(options).items() if name in settings_type.model_fields and value is not None
    }
    try:
        settings = settings_type(**given)
    except ValidationError as exc:
        lines = []
        for error in exc.errors(include_url=False):
            if error["loc"]:
                name = str(error["loc"][0])
                lines.append(f"{ENV_PREFIX}{name.upper()} / {_flag(name)}: {error['msg']}")
            else:  # a rule across several settings
                lines.append(str(error["msg"]).removeprefix("Value error, "))
        raise SettingsError("invalid configuration:\n  " + "\n  ".join(lines)) from None
    settings.check_files()
    return settings


def parse_settings(
    settings_type: type[S],
    argv: Sequence[str] | None,
    *,
    prog: str,
    description: str,
    extend: Callable[[argparse.ArgumentParser], None] | None = None,
) -> tuple[S, argparse.Namespace]:
    """Parse `argv` into settings and the parsed flags; exits 2 (usage error) on invalid values.

    `extend` may add flags that are not settings (such as `--migrate`); they are in the namespace.
    """
    parser = build_parser(settings_type, prog, description)
    if extend is not None:
        extend(parser)
    options = parser.parse_args(argv)
    try:
        return settings_from(settings_type, options), options
    except SettingsError as exc:
        parser.error(str(exc))
