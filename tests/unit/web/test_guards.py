"""The dashboard's guards as pure functions: the `Host` allowlist, session cookies and their revocation,
the login limiter and the stream slots (their HTTP behaviour: tests/security/test_hostile_dashboard.py)."""

from __future__ import annotations

import pytest

from devsched.web import hosts, limits, security, sessions
from devsched.web.app import allowed_hosts
from devsched.web.settings import WebSettings

pytestmark = pytest.mark.unit

TOKEN = "a-long-operator-token"


@pytest.mark.parametrize(
    ("host", "served"),
    [
        ("127.0.0.1:8080", True),
        ("localhost:8080", True),
        ("LOCALHOST:8080", True),
        ("[::1]:8080", True),
        ("127.0.0.1:8081", False),  # another port of this machine
        ("127.0.0.1", False),  # port 80
        ("evil.example:8080", False),  # DNS rebinding: the attacker's name, our address
        ("localhost.evil.example:8080", False),
        ("127.0.0.1:8080@evil.example", False),
        ("", False),
        (None, False),
        ("[::1", False),
        ("127.0.0.1:80:80", False),
        ("127.0.0.1:x", False),
        ("ĺocalhost:8080", False),
    ],
)
def test_a_loopback_bind_serves_the_loopback_names_with_its_port_only(host: str | None, served: bool) -> None:
    entries = allowed_hosts(WebSettings(web_host="127.0.0.1", web_port=0), port=8080)
    assert hosts.allowed(entries, host, "http") is served


def test_a_wildcard_bind_serves_loopback_names_on_any_port_until_told_more() -> None:
    entries = allowed_hosts(WebSettings(web_host="0.0.0.0", web_port=8080))
    assert hosts.allowed(entries, "localhost:9999", "http")  # a port-forward
    assert not hosts.allowed(entries, "0.0.0.0:8080", "http")
    assert not hosts.allowed(entries, "10.1.2.3:8080", "http")
    names = "devsched.example.com, *.lab.example:8443"
    listed = allowed_hosts(WebSettings(web_host="0.0.0.0", web_allowed_hosts=names))
    assert hosts.allowed(listed, "devsched.example.com", "https")
    assert hosts.allowed(listed, "Devsched.Example.com:8080", "http")
    assert hosts.allowed(listed, "a.lab.example:8443", "https")
    assert not hosts.allowed(listed, "lab.example:8443", "https")
    assert not hosts.allowed(listed, "a.lab.example", "https")  # port 443
    assert not hosts.allowed(listed, "localhost:8080", "http")  # the list replaces the default
    assert hosts.allowed(hosts.parse("*"), "anything.example", "http")


@pytest.mark.parametrize("text", ["", " , ", "a/b", "host:port", "[::1", "x:99999"])
def test_a_bad_allowlist_is_refused_at_start(text: str) -> None:
    with pytest.raises(ValueError, match="DEVSCHED_WEB_ALLOWED_HOSTS"):
        WebSettings(web_allowed_hosts=text)


def test_a_session_is_signed_expires_and_is_revoked_by_logout() -> None:
    store = sessions.Sessions(TOKEN)
    cookie = store.issue(2000)
    assert store.check(cookie, now=1999)
    assert not store.check(cookie, now=2000)  # expired
    assert not sessions.Sessions("another-long-token!").check(cookie, now=1)  # the token changed
    session_id, _, mac = cookie.split(".")
    assert not store.check(f"{session_id}.3000.{mac}", now=1)  # expiry moved
    assert not store.check(f"{session_id}.2000.{'0' * 64}", now=1)  # forged
    assert TOKEN not in cookie
    other = store.issue(2000)
    assert store.revoke(cookie, now=1)
    assert not store.check(cookie, now=1)  # replayed after logout
    assert store.check(other, now=1)  # another session lives on
    assert not store.revoke("garbage", now=1)
    assert store.revoked == 1
    store.revoke(store.issue(10), now=5)
    assert store.revoked == 2
    store.revoke(other, now=1500)  # the expired revocation of the `10` session is forgotten
    assert store.revoked == 2


def test_a_logout_names_the_session_id_and_expiry_never_the_cookie() -> None:
    store = sessions.Sessions(TOKEN)
    cookie = store.issue(2000)
    ended = store.ending(cookie, now=1)
    assert ended is not None
    assert (ended.session_id, ended.expires_at) == (cookie.split(".")[0], 2000)
    assert store.check(cookie, now=1), "asking what a logout would end revokes nothing"
    assert store.revoke(cookie, now=1) == ended
    assert store.ending("garbage", now=1) is None


def test_sessions_fail_closed_while_the_revoked_set_may_be_missing_logouts() -> None:
    complete = [False]
    revoked = sessions.RevokedIds(complete=lambda: complete[0])
    store = sessions.Sessions(TOKEN, revoked)
    cookie = store.issue(2000)
    assert not store.check(cookie, now=1), "not loaded yet: no session is live"
    complete[0] = True
    assert store.check(cookie, now=1)
    revoked.add(cookie.split(".")[0], 2000, now=1)  # a logout made on another replica, as the watch adds it
    assert not store.check(cookie, now=1)
    revoked.add("expired-already-0", 5, now=10)
    assert len(revoked) == 1, "a revocation whose cookie has expired is not kept"


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "garbage",
        "9999999999.abc",
        "²²²²²²²²²²²²²²²²²².2000." + "0" * 64,
        "é" * 40,
        "a" * 100_000,
        "aaaaaaaaaaaaaaaa.99999999999999999999." + "0" * 64,
        "aaaaaaaaaaaaaaaa.2000." + "G" * 64,
        "\x00\x01",
    ],
)
def test_a_malformed_session_cookie_is_no_session(value: str | None) -> None:
    store = sessions.Sessions(TOKEN)
    assert not store.check(value, now=1)
    assert not store.revoke(value, now=1)


def test_a_malformed_csrf_cookie_is_replaced() -> None:
    token = security.new_csrf_token()
    assert security.csrf_cookie(token) == token
    for bad in (None, "", "x", "é" * 43, token + "x", "<script>" * 6):
        assert security.csrf_cookie(bad) is None
    assert not security.csrf_ok(token, "é")


def test_token_comparison_is_by_equal_length_digests() -> None:
    assert security.token_ok(TOKEN, TOKEN)
    assert not security.token_ok(TOKEN, TOKEN[:-1])
    assert not security.token_ok(TOKEN, "é\udcff")


def test_login_failures_are_limited_per_address_and_in_total() -> None:
    limiter = limits.LoginLimiter(per_ip=3, total=5)
    for i in range(3):
        assert limiter.retry_after("10.0.0.1", 100.0 + i) is None
        limiter.failed("10.0.0.1", 100.0 + i)
    assert limiter.retry_after("10.0.0.1", 103.0) == 57  # the oldest failure is a minute old at 160
    assert limiter.retry_after("10.0.0.2", 103.0) is None
    limiter.failed("10.0.0.2", 104.0)
    limiter.failed("10.0.0.3", 105.0)
    assert limiter.retry_after("10.0.0.4", 106.0) == 54  # five in total within the minute: everybody waits
    assert limiter.retry_after("10.0.0.4", 160.5) is None
    assert limiter.retry_after("10.0.0.1", 162.5) is None


def test_stream_slots_per_client_and_in_total() -> None:
    slots = limits.StreamSlots(per_client=2, total=3)
    assert slots.take("a")
    assert slots.take("a")
    assert not slots.take("a")
    assert slots.take("b")
    assert not slots.take("c")  # the process is full
    slots.give("a")
    assert slots.take("c")
    assert not slots.take("c")
    assert slots.open == 3
