"""Configuration of `devsched-web`: what every service process reads plus the `DEVSCHED_WEB_*` settings.

Read from the environment (or `--flags` of the same names), like every other service. The web process
never connects to the database and has no database settings (a `DEVSCHED_DATABASE_*` variable in its
environment is ignored, like any variable that is not a setting).
"""

from __future__ import annotations

import ipaddress

from pydantic import Field, SecretStr, model_validator

from devsched.service.settings import ProcessSettings, Seconds
from devsched.web import hosts


class WebSettings(ProcessSettings):
    """What `devsched-web` reads."""

    web_host: str = Field(default="127.0.0.1", min_length=1)
    """Address the dashboard listens on; `0.0.0.0` in a container."""
    web_port: int = Field(default=8080, ge=0, le=65535)
    """Port of the dashboard (0: any free port, logged)."""
    web_actions: bool = False
    """Whether cancel, resubmit, drain and undrain are offered; off, the dashboard is read-only (every POST is 403)."""
    web_token: SecretStr | None = None
    """The operator token that unlocks actions (typed once into the login form; a signed cookie follows)."""
    web_auth_proxy: bool = False
    """Actions without a token: an authenticating proxy in front decides who reaches the dashboard."""
    web_refresh_s: Seconds = 2.0
    """Seconds between two samples of hosts and tasks (a task event triggers one sooner)."""
    web_queue_max: int = Field(default=10000, ge=100, le=100000)
    """Most queued tasks read per sample (the queue depth shows `N+` above it)."""
    web_session_s: Seconds = 12 * 3600.0
    """How long a login lasts."""
    web_request_timeout_s: Seconds = 5.0
    """Seconds to wait for each reply of the scheduler."""
    web_allowed_hosts: str | None = None
    """`Host` headers served, comma-separated (`name` any port, `name:port` that port, `*.domain`, `*` any);
    default: loopback names with the dashboard's port on a loopback bind, else `localhost`, `127.0.0.1`
    and `[::1]` (a port-forward). Any other `Host` is refused (400) before any work: no DNS rebinding."""
    web_forwarded_allow_ips: str = ""
    """Proxies whose `X-Forwarded-Proto` and `X-Forwarded-For` are believed (comma-separated addresses or
    networks, `*` any), as uvicorn's `--forwarded-allow-ips`; empty: none."""
    web_secure_cookies: bool = False
    """Mark cookies `Secure` even when the request did not arrive over https (a TLS proxy not trusted above)."""
    web_streams_per_client: int = Field(default=8, ge=1, le=10000)
    """Live streams (server-sent events) one client address may hold open at once; more answer 429."""
    web_streams_total: int = Field(default=200, ge=1, le=100000)
    """Live streams this process holds open at once, for everybody; more answer 429."""
    web_stream_max_s: Seconds = 900.0
    """Seconds a live stream lasts; then it ends and the browser opens a new one (counted again)."""
    web_login_failures_per_ip: int = Field(default=5, ge=1, le=10000)
    """Failed logins a client address may make a minute; past them every login answers 429 with Retry-After."""
    web_login_failures_total: int = Field(default=60, ge=1, le=100000)
    """Failed logins a minute from everybody; past them every login answers 429 until the minute ends."""

    @model_validator(mode="after")
    def _actions_need_auth(self) -> WebSettings:
        if self.web_actions and self.web_token is None and not self.web_auth_proxy:
            raise ValueError(
                "DEVSCHED_WEB_ACTIONS needs DEVSCHED_WEB_TOKEN (or DEVSCHED_WEB_AUTH_PROXY behind an "
                "authenticating proxy)"
            )
        if self.web_token is not None and len(self.web_token.get_secret_value()) < 16:
            raise ValueError("DEVSCHED_WEB_TOKEN must be at least 16 characters")
        if self.web_allowed_hosts is not None:
            hosts.parse(self.web_allowed_hosts)
        return self

    @property
    def loopback(self) -> bool:
        """Whether the dashboard listens on loopback only."""
        if self.web_host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.web_host).is_loopback
        except ValueError:
            return False
