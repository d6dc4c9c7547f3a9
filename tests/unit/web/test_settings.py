"""`devsched-web`'s settings: read-only by default, actions only with a token or an authenticating proxy."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from devsched.web.settings import WebSettings

pytestmark = pytest.mark.unit


def test_defaults_are_loopback_and_read_only(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("DEVSCHED_WEB_HOST", "DEVSCHED_WEB_ACTIONS", "DEVSCHED_WEB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    settings = WebSettings()
    assert settings.web_host == "127.0.0.1"
    assert settings.loopback
    assert not settings.web_actions


def test_actions_need_a_token_or_a_proxy() -> None:
    with pytest.raises(ValidationError, match="DEVSCHED_WEB_TOKEN"):
        WebSettings(web_actions=True)
    with pytest.raises(ValidationError, match="16 characters"):
        WebSettings(web_actions=True, web_token="short")
    assert WebSettings(web_actions=True, web_token="x" * 16).web_actions
    assert WebSettings(web_actions=True, web_auth_proxy=True).web_token is None


def test_the_token_never_shows_in_the_settings_repr() -> None:
    settings = WebSettings(web_actions=True, web_token="very-secret-token-value")
    assert "very-secret-token-value" not in repr(settings)


@pytest.mark.parametrize(("address", "loopback"), [("127.0.0.1", True), ("::1", True), ("localhost", True),
                                                   ("0.0.0.0", False), ("10.0.0.5", False)])  # fmt: skip
def test_loopback(address: str, loopback: bool) -> None:
    assert WebSettings(web_host=address).loopback is loopback


def test_the_guards_default_to_no_trusted_proxy_and_bounded_streams_and_logins() -> None:
    settings = WebSettings()
    assert settings.web_allowed_hosts is None  # the loopback names with the dashboard's port
    assert settings.web_forwarded_allow_ips == ""
    assert not settings.web_secure_cookies
    assert (settings.web_streams_per_client, settings.web_streams_total, settings.web_stream_max_s) == (8, 200, 900)
    assert (settings.web_login_failures_per_ip, settings.web_login_failures_total) == (5, 60)
    with pytest.raises(ValidationError):
        WebSettings(web_streams_per_client=0)
