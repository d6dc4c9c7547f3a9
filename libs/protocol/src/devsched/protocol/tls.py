"""How every devsched process reaches NATS safely: credentials from files, TLS with verification.

The agent, the services and the client share this one definition, so that a `tls://` URL, a CA file or
a password file means the same thing everywhere, and every TLS connection verifies the server:

```python
settings = NatsSettings(nats_user="host-bench-07", nats_password_file=Path("/etc/devsched/nats/password"),
                        nats_tls_ca=Path("/etc/devsched/tls/ca.crt"))
await devsched.protocol.connection.connect(nc, settings, name="...", drain_timeout_s=2.0)
```

Secrets are read from files, never taken from a URL or an environment variable: a URL's password shows in
process listings, logs and the environment that every child process inherits. Every error is a
`TlsConfigError` with one line that names the setting and what to do.
"""

from __future__ import annotations

import contextlib
import ssl
from pathlib import Path
from typing import Annotated, Any, Self
from urllib.parse import parse_qsl, urlencode, urlsplit

from pydantic import BaseModel, ConfigDict, ValidationInfo, model_validator

#: Where NATS listens when nothing says otherwise.
DEFAULT_NATS_URL = "nats://127.0.0.1:4222"


class TlsConfigError(ValueError):
    """A NATS credentials or TLS setting is unusable; the message is one line naming the setting."""


def client_tls_context(ca: Path | None, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    """A client-side TLS context that verifies the server's certificate and host name.

    Args:
        ca: PEM bundle of the certificate authorities to trust; None trusts the system's store.
        cert: PEM client certificate for mutual TLS (may hold the key too).
        key: PEM private key of `cert`.

    Raises:
        TlsConfigError: a file is missing or not PEM, or `key` is given without `cert`.
    """
    if key is not None and cert is None:
        raise TlsConfigError(f"a TLS key ({key}) needs its certificate: set the client certificate too")
    try:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(ca) if ca is not None else None)
    except (OSError, ssl.SSLError) as exc:
        raise TlsConfigError(f"cannot use the TLS CA file {ca}: {_why(exc)}") from None
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # create_default_context already sets these; stated so that no later edit can loosen them unnoticed.
    context.check_hostname = True
    context.verify_mode = ssl.CERT_REQUIRED
    if cert is not None:
        try:
            context.load_cert_chain(str(cert), str(key) if key is not None else None)
        except (OSError, ssl.SSLError) as exc:
            raise TlsConfigError(f"cannot use the TLS client certificate {cert} / key {key}: {_why(exc)}") from None
    return context


def _why(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


def url_has_credentials(url: str) -> bool:
    """Whether any of the comma-separated URLs carries a user, password or token (`nats://u:p@host`).

    nats-py reads a lone user name in a URL as a token, so any user info counts as a secret.
    """
    for part in url.split(","):
        part = part.strip()
        if not part:
            continue
        netloc = urlsplit(part if "://" in part else f"nats://{part}").netloc
        if "@" in netloc:
            return True
    return False


def wants_tls(url: str) -> bool:
    """Whether any of the comma-separated URLs asks for TLS (`tls://`)."""
    return any(part.strip().lower().startswith("tls://") for part in url.split(","))


def read_secret(path: Path, what: str) -> str:
    """The secret in `path`, without its trailing newline.

    Raises:
        TlsConfigError: the file cannot be read or is empty.
    """
    try:
        value = path.read_text(encoding="utf-8").rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise TlsConfigError(f"cannot read the {what} file {path}: {_why(exc)}") from None
    if not value:
        raise TlsConfigError(f"the {what} file {path} is empty")
    return value


#: Marks a setting whose file holds a secret (the agent warns when its steps could read one).
SECRET_FILE = "secret file"
#: A path setting whose file holds a secret.
SecretFile = Annotated[Path | None, SECRET_FILE]


class NatsSettings(BaseModel):
    """How a process reaches NATS: the URL, one kind of credentials and TLS, all from files.

    The one declaration of these settings: every service (`DEVSCHED_NATS_*` and `--nats-*`), the agent
    (the same keys in its TOML file, the same variables over them), the dashboard and the CLI read them.
    At most one kind of credentials: a `.creds` file (JWT and nkey seed), an nkey seed file, or a user
    with a password file. TLS is used when the URL says `tls://` or any TLS setting is given, and always
    verifies the server against `nats_tls_ca` (or the system's store).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    nats_url: str = DEFAULT_NATS_URL
    """NATS server URL(s), comma-separated for a cluster."""
    nats_creds: SecretFile = None
    """NATS credentials file (JWT and nkey seed); none for an open server."""
    nats_nkey_seed: SecretFile = None
    """NATS nkey seed file (`SU...`), for servers with nkey users."""
    nats_user: str | None = None
    """NATS user, with `nats_password_file` (the right way to give a password: never in the URL)."""
    nats_password_file: SecretFile = None
    """File holding the NATS user's password (re-read at every reconnection)."""
    nats_tls_ca: Path | None = None
    """CA bundle that signed the NATS server's certificate; setting it (or a `tls://` URL) turns TLS on."""
    nats_tls_cert: Path | None = None
    """Client certificate for mutual TLS with NATS."""
    nats_tls_key: SecretFile = None
    """Private key of `nats_tls_cert`."""
    nats_tls_hostname: str | None = None
    """Name to verify in the NATS server's certificate when it differs from the URL's host."""

    @model_validator(mode="after")
    def _fit_together(self, info: ValidationInfo) -> Self:
        if info.context == _UNCHECKED:
            return self
        try:  # which settings go together; the files are read by `check()`, at start
            self.check_combination()
        except TlsConfigError as exc:
            raise ValueError(str(exc)) from None
        return self

    @classmethod
    def secret_files(cls) -> tuple[str, ...]:
        """The names of the settings whose file holds a secret."""
        return tuple(name for name, field in NatsSettings.model_fields.items() if SECRET_FILE in field.metadata)

    @property
    def servers(self) -> list[str]:
        """The URLs of `nats_url`, one per server."""
        return [url.strip() for url in self.nats_url.split(",") if url.strip()]

    @property
    def uses_tls_files(self) -> bool:
        """Whether any TLS file or the host name is set (then TLS is on whatever the URL's scheme)."""
        tls = (self.nats_tls_ca, self.nats_tls_cert, self.nats_tls_key, self.nats_tls_hostname)
        return any(v is not None for v in tls)

    def check(self) -> None:
        """Validate the combination and read every file once, so that a bad setting fails at start.

        Raises:
            TlsConfigError: one line naming what is wrong.
        """
        self.tls_options(self.nats_url)

    def check_combination(self) -> None:
        """Validate which settings are given together, without reading any file.

        Raises:
            TlsConfigError: one line naming what is wrong.
        """
        kinds = [
            name
            for name, value in (
                ("creds", self.nats_creds),
                ("nkey seed", self.nats_nkey_seed),
                ("password", self.nats_password_file),
            )
            if value is not None
        ]
        if len(kinds) > 1:
            raise TlsConfigError(
                "NATS credentials: set one of a creds file, an nkey seed file or a user with a password file, "
                f"not {' and '.join(kinds)}"
            )
        if self.nats_password_file is not None and not self.nats_user:
            raise TlsConfigError("NATS password file given without a user: set the NATS user too")
        if self.nats_password_file is None and self.nats_user:
            raise TlsConfigError("NATS user given without a password file: set the NATS password file too")
        if self.nats_tls_key is not None and self.nats_tls_cert is None:
            raise TlsConfigError(
                f"a TLS key ({self.nats_tls_key}) needs its certificate: set the client certificate too"
            )

    def connect_options(self) -> dict[str, Any]:
        """Keyword arguments for nats-py's `Client.connect` (credentials and TLS files only).

        The password is given as a callable that re-reads the file at every (re)connection, so a rotated
        Kubernetes Secret is picked up without a restart; if the file vanished, the last value read stays.

        Raises:
            TlsConfigError: one line naming what is wrong.
        """
        self.check_combination()
        options: dict[str, Any] = {}
        if self.nats_password_file is not None:
            options.update(user=self.nats_user, password=_PasswordFile(self.nats_password_file))
        if self.nats_creds is not None:
            read_secret(self.nats_creds, "NATS creds")
            options["user_credentials"] = str(self.nats_creds)
        if self.nats_nkey_seed is not None:
            options["nkeys_seed_str"] = read_secret(self.nats_nkey_seed, "NATS nkey seed").strip()
        if self.uses_tls_files:
            options["tls"] = client_tls_context(self.nats_tls_ca, self.nats_tls_cert, self.nats_tls_key)
            if self.nats_tls_hostname:
                options["tls_hostname"] = self.nats_tls_hostname
        return options

    def tls_options(self, url: str) -> dict[str, Any]:
        """`connect_options()`, with a verifying TLS context for a `tls://` URL even without TLS files."""
        options = self.connect_options()
        if "tls" not in options and wants_tls(url):
            options["tls"] = client_tls_context(None)
        return options


def NatsAccess(**short: Any) -> NatsSettings:  # noqa: N802 - the library's spelling, named as it always was
    """NatsSettings named without their `nats_` prefix (`creds=`, `tls_ca=`, `url=`; None: not set).

    The library's spelling (`Client.connect(url, creds=...)`): which settings go together is checked by
    `check()` and `connect_options()`, which raise `TlsConfigError` as a connect call's caller expects.

    Raises:
        pydantic.ValidationError: a value of the wrong type, or a name that is not a NATS setting.
    """
    fields = {f"nats_{name}": value for name, value in short.items() if value is not None}
    return NatsSettings.model_validate(fields, context=_UNCHECKED)


#: Validation context of `NatsAccess`: the combination is left to `check()`.
_UNCHECKED = {"combination": "later"}


class _PasswordFile:
    """A nats-py credential callback: the password file's content, read at each connection."""

    __slots__ = ("_last", "path")

    def __init__(self, path: Path) -> None:
        self.path = path
        self._last = read_secret(path, "NATS password")  # fail at start, not at the first connect

    def __call__(self) -> str:
        with contextlib.suppress(TlsConfigError):  # a Secret being rotated: keep the last good value
            self._last = read_secret(self.path, "NATS password")
        return self._last

    def __repr__(self) -> str:  # never the secret, whoever logs the options
        return f"<password from {self.path}>"


def postgres_ssl_query(root_cert: Path | None, cert: Path | None = None, key: Path | None = None) -> dict[str, str]:
    """The libpq URL parameters for Postgres TLS from settings: `sslmode=verify-full`, `sslrootcert`, ...

    Empty when nothing is set. `devsched.store.make_engine` turns these into asyncpg's SSL context.
    """
    query: dict[str, str] = {}
    if root_cert is not None:
        query.update(sslmode="verify-full", sslrootcert=str(root_cert))
    if cert is not None:
        query["sslcert"] = str(cert)
    if key is not None:
        query["sslkey"] = str(key)
    return query


def with_postgres_ssl(url: str, root_cert: Path | None, cert: Path | None = None, key: Path | None = None) -> str:
    """`url` with `postgres_ssl_query(...)` added; parameters the URL already has win.

    A URL can carry the libpq parameters itself (`?sslmode=verify-full&sslrootcert=/ca.crt`); the
    settings are a way to keep the URL short and identical between environments.
    """
    extra = postgres_ssl_query(root_cert, cert, key)
    if not extra:
        return url
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    if "sslmode" in query or "ssl" in query:
        extra.pop("sslmode", None)
    merged = {**extra, **query}
    return parts._replace(query=urlencode(merged, safe="/")).geturl()
