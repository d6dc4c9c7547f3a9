"""Attacks on devsched-web over HTTP, against the real dashboard process, scheduler, agent and NATS.

- DNS rebinding: a request naming another site in `Host` (or this machine on another port) gets 400 before
  any page or stream runs; `DEVSCHED_WEB_ALLOWED_HOSTS` replaces the default list.
- Live streams: a client past its slots, or everybody past the process's, gets 429 while pages keep
  working; a stream ends after `DEVSCHED_WEB_STREAM_MAX_S`; the streams of one task share its reads.
- A malformed session or CSRF cookie is logged out on every page and POST, never a 500.
- Logout revokes the session: the cookie replayed is logged out, another operator's session lives on; on
  every replica (two processes, one behind a TCP proxy), across their restarts and a partition, where a
  replica that may have missed a logout fails closed.
- Login failures are limited per client address and in total (429 with Retry-After).
- Cookies are `Secure` when a trusted proxy says https (and only then), or when forced.

Client addresses are told by `X-Forwarded-For` from 127.0.0.1, which the dashboards here trust
(`DEVSCHED_WEB_FORWARDED_ALLOW_IPS=127.0.0.1`), except the `plain` one that trusts no proxy.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from devsched.client import Client
from devsched.protocol import endpoints
from devsched.protocol.subjects import Subjects
from support.devsched_stack import Stack
from support.polling import eventually
from support.tcp_proxy import TcpProxy
from support.web_harness import TOKEN, Web, web_process

pytestmark = [pytest.mark.security, pytest.mark.e2e]

STREAMS_PER_CLIENT = 3
STREAMS_TOTAL = 5
STREAM_MAX_S = 4.0
WAIT_PLAN = {"steps": [{"name": "wait", "action": "sleep", "args": {"seconds": 60}}]}


@pytest.fixture(scope="module")
def hostile(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Web]:
    """Actions on, the default `Host` allowlist, tight stream slots, a trusted proxy on 127.0.0.1."""
    with web_process(
        stack,
        tmp_path_factory.mktemp("web-hostile"),
        name="web-hostile",
        web_actions="true",
        web_token=TOKEN,
        web_forwarded_allow_ips="127.0.0.1",
        web_streams_per_client=str(STREAMS_PER_CLIENT),
        web_streams_total=str(STREAMS_TOTAL),
        web_stream_max_s=str(STREAM_MAX_S),
    ) as web:
        yield web


@pytest.fixture(scope="module")
def limited(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Web]:
    """Login failures: 3 a minute per client address, 5 in total."""
    with web_process(
        stack,
        tmp_path_factory.mktemp("web-limited"),
        name="web-limited",
        web_actions="true",
        web_token=TOKEN,
        web_forwarded_allow_ips="127.0.0.1",
        web_login_failures_per_ip="3",
        web_login_failures_total="5",
    ) as web:
        yield web


@pytest.fixture(scope="module")
def plain(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Web]:
    """Every default: no proxy trusted."""
    with web_process(
        stack, tmp_path_factory.mktemp("web-plain"), name="web-plain", web_actions="true", web_token=TOKEN
    ) as web:
        yield web


@pytest.fixture(scope="module")
def named(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Web]:
    """An explicit allowlist, and Secure cookies forced (a TLS proxy in front that it does not trust)."""
    with web_process(
        stack,
        tmp_path_factory.mktemp("web-named"),
        name="web-named",
        web_actions="true",
        web_token=TOKEN,
        web_allowed_hosts="devsched.example.com,127.0.0.1",
        web_secure_cookies="true",
    ) as web:
        yield web


@pytest.fixture
async def client(stack: Stack) -> AsyncIterator[Client]:
    async with Client.connect(stack.nats_url, prefix=stack.prefix) as c:
        yield c


def port_of(web: Web) -> int:
    return int(web.url.rsplit(":", 1)[1])


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, "no CSRF field in the page"
    return found.group(1)


def set_cookies(reply: httpx.Response) -> dict[str, str]:
    """The raw `Set-Cookie` headers of a reply, by cookie name."""
    return {h.split("=", 1)[0]: h for h in reply.headers.get_list("set-cookie")}


def cookie_value(header: str) -> str:
    return header.split("=", 1)[1].split(";", 1)[0]


async def login(http: httpx.AsyncClient, **headers: str) -> httpx.Response:
    page = await http.get("/login", headers=headers)
    assert page.status_code == 200
    reply = await http.post(
        "/login", data={"csrf": csrf_of(page.text), "token": TOKEN, "next": "/lab"}, headers=headers
    )
    assert reply.status_code == 303, reply.text[:300]
    return reply


# -- Host allowlist ------------------------------------------------------------------------------------------


async def test_a_rebinding_host_gets_400_before_any_page_or_stream(hostile: Web, client: Client) -> None:
    """What a page on evil.example re-pointed at 127.0.0.1 sends: our address, its name in `Host`."""
    task = await client.submit({"steps": [{"name": "hi", "action": "noop"}]}, name="rebind-target")
    port = port_of(hostile)
    paths = ["/lab", "/queue", "/charts", f"/tasks/{task.task_id}", f"/tasks/{task.task_id}/live"]
    paths += [f"/tasks/{task.task_id}/log", "/lab/live", "/login", "/readyz", "/static/app.js"]
    hostile_hosts = [f"evil.example:{port}", f"localhost.evil.example:{port}", f"127.0.0.1:{port + 1}"]
    hostile_hosts += ["evil.example", "", f"127.0.0.1:{port}@evil.example"]
    async with httpx.AsyncClient(base_url=hostile.url, timeout=10) as http:
        for host in hostile_hosts:
            for path in paths:
                refused = await http.get(path, headers={"host": host})
                assert refused.status_code == 400, (host, path, refused.status_code)
                assert "DEVSCHED_WEB_ALLOWED_HOSTS" in refused.text
                assert "rebind-target" not in refused.text
                assert "set-cookie" not in refused.headers
            posted = await http.post("/login", headers={"host": host}, data={"token": TOKEN})
            assert posted.status_code == 400
        # the names of this machine with its port are served, and so is everybody else meanwhile
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"LocalHost:{port}"):
            page = await http.get(f"/tasks/{task.task_id}", headers={"host": host})
            assert page.status_code == 200, host
            assert "rebind-target" in page.text
    assert not [line for line in hostile.proc.log_lines() if line.get("level") == "ERROR"]


async def test_the_allowlist_setting_replaces_the_default(named: Web) -> None:
    port = port_of(named)
    async with httpx.AsyncClient(base_url=named.url, timeout=10) as http:
        assert (await http.get("/lab", headers={"host": "devsched.example.com"})).status_code == 200
        assert (await http.get("/lab", headers={"host": f"127.0.0.1:{port}"})).status_code == 200
        assert (await http.get("/lab", headers={"host": f"localhost:{port}"})).status_code == 400
        assert (await http.get("/lab", headers={"host": "devsched.example.com.evil.example"})).status_code == 400


# -- live streams --------------------------------------------------------------------------------------------


async def open_stream(http: httpx.AsyncClient, stack: AsyncExitStack, path: str, ip: str) -> httpx.Response:
    """A live stream kept open (until `stack` closes), having read its first bytes, or the refusal."""
    reply = await stack.enter_async_context(http.stream("GET", path, headers={"x-forwarded-for": ip}))
    if reply.status_code == 200:
        chunks = reply.aiter_text()
        stack.push_async_callback(chunks.aclose)  # type: ignore[attr-defined]  # held: collected, it would close the connection
        first = await anext(chunks)
        assert first.startswith("retry:"), first
    else:
        await reply.aread()
    return reply


async def test_live_streams_are_capped_per_client_and_in_total(hostile: Web) -> None:
    limits = httpx.Limits(max_connections=20)
    async with httpx.AsyncClient(base_url=hostile.url, timeout=10, limits=limits) as http:
        async with AsyncExitStack() as first:
            mine = [await open_stream(http, first, "/lab/live", "10.0.0.1") for _ in range(STREAMS_PER_CLIENT)]
            assert [r.status_code for r in mine] == [200] * STREAMS_PER_CLIENT
            refused = await open_stream(http, first, "/queue/live", "10.0.0.1")
            assert refused.status_code == 429
            assert int(refused.headers["retry-after"]) > 0
            assert "too many live streams" in refused.text
            # another client still gets streams, until the process's total is reached
            others = [await open_stream(http, first, "/charts/live", "10.0.0.2") for _ in range(2)]
            assert [r.status_code for r in others] == [200, 200]
            assert (await open_stream(http, first, "/lab/live", "10.0.0.3")).status_code == 429
            # pages are not streams: everybody is still served
            page = await http.get("/lab", headers={"x-forwarded-for": "10.0.0.3"})
            assert page.status_code == 200
            async with AsyncExitStack() as second:  # one closed: its slot is given back

                async def reopened() -> bool:
                    async with AsyncExitStack() as third:
                        return (await open_stream(http, third, "/lab/live", "10.0.0.3")).status_code == 200

                await mine[0].aclose()
                await eventually(reopened, timeout=10, message="a slot given back when a stream closes")
                del second
        # all closed: the client has its slots again
        async with AsyncExitStack() as again:
            back = [await open_stream(http, again, "/lab/live", "10.0.0.1") for _ in range(STREAMS_PER_CLIENT)]
            assert [r.status_code for r in back] == [200] * STREAMS_PER_CLIENT


async def test_a_live_stream_ends_after_its_lifetime(hostile: Web, client: Client) -> None:
    task = await client.submit(WAIT_PLAN, name="long-log")
    try:
        async with httpx.AsyncClient(base_url=hostile.url, timeout=30) as http:
            for path, last in (("/lab/live", ""), (f"/tasks/{task.task_id}/log", "event: end")):
                started = time.monotonic()
                seen = ""
                async with http.stream("GET", path, headers={"x-forwarded-for": "10.0.1.1"}) as reply:
                    assert reply.status_code == 200
                    async for chunk in reply.aiter_text():
                        seen += chunk
                took = time.monotonic() - started
                assert STREAM_MAX_S - 0.5 <= took < STREAM_MAX_S + 10, (path, took)
                assert last in seen
            assert "reload the page" in seen
    finally:
        await client.cancel(task.task_id)


async def test_the_live_streams_of_one_task_share_its_reads(hostile: Web, client: Client, stack: Stack) -> None:
    """Three pages of one running task cost about what one costs: `tasks.get` requests counted on NATS."""
    task = await client.submit(WAIT_PLAN, name="watched")
    gets: list[float] = []
    nc = NatsClient()
    await nc.connect(stack.nats_url)

    async def seen(msg: Msg) -> None:
        if str(task.task_id).encode() in msg.data:
            gets.append(time.monotonic())

    sub = await nc.subscribe(Subjects(stack.prefix).endpoint(endpoints.TASKS_GET), cb=seen)
    try:

        async def watch(streams: int, seconds: float) -> int:
            before = len(gets)
            async with httpx.AsyncClient(base_url=hostile.url, timeout=10) as http, AsyncExitStack() as open_:
                path = f"/tasks/{task.task_id}/live"
                replies = [await open_stream(http, open_, path, f"10.0.2.{i}") for i in range(streams)]
                assert all(r.status_code == 200 for r in replies)
                await asyncio.sleep(seconds)
            return len(gets) - before

        one = await watch(1, 3.0)
        three = await watch(3, 3.0)
        assert one > 0
        print(f"tasks.get of one task in 3 s: one live stream {one}, three live streams {three}")
        # unshared, three streams would cost three times one (plus a `get` each to ask whether it ended)
        assert three <= one * 1.5 + 3, (one, three)
    finally:
        await sub.unsubscribe()
        await nc.close()
        await client.cancel(task.task_id)


# -- cookies -------------------------------------------------------------------------------------------------

BAD_SESSIONS: list[bytes] = [
    b"garbage",
    b"9999999999.abc",
    b"aaaaaaaaaaaaaaaaaaaaaaaa.9999999999." + b"0" * 64,  # the right shape, a wrong HMAC
    b"%%%%====.!!.@@",  # not even base64
    "é²³.9999999999.ü".encode(),  # non-ASCII (UTF-8 bytes)
    b"\xff\xfe\xfd",  # not UTF-8 at all
    b"x" * 6000,  # huge
    b'"quoted;" ; devsched_session=',
]


async def test_a_malformed_session_cookie_is_logged_out_everywhere(hostile: Web, client: Client, stack: Stack) -> None:
    task = await client.submit(WAIT_PLAN, name="cookie-target")
    device = stack.device_ids[0]
    pages = ["/lab", "/queue", "/charts", f"/tasks/{task.task_id}", f"/devices/{device}", "/login", "/nope"]
    try:
        async with httpx.AsyncClient(base_url=hostile.url, timeout=10) as http:
            csrf = csrf_of((await http.get("/login")).text)
            for value in BAD_SESSIONS:
                cookie = b"devsched_csrf=" + csrf.encode() + b"; devsched_session=" + value
                headers = {b"cookie": cookie, b"x-forwarded-for": b"10.0.3.1"}
                for path in pages:
                    page = await http.get(path, headers=headers)
                    assert page.status_code in (200, 404), (value[:20], path, page.status_code)
                    assert "Log in" in page.text or path == "/login"
                    assert 'id="cancel"' not in page.text
                for path in (f"/tasks/{task.task_id}/cancel", f"/devices/{device}/drain", "/logout"):
                    posted = await http.post(path, headers=headers, data={"csrf": csrf})
                    assert posted.status_code in (403, 303), (value[:20], path, posted.status_code)
                    assert posted.status_code == 403 or path == "/logout"
                # a login with a malformed old cookie works (and replaces it)
                page = await http.get("/login", headers=headers)
                reply = await http.post(
                    "/login",
                    headers=headers,
                    data={"csrf": csrf_of(page.text), "token": TOKEN, "next": "/lab"},
                )
                assert reply.status_code == 303, (value[:20], reply.status_code)
            # a malformed CSRF cookie is replaced by a fresh one, never echoed
            for value in (b"<script>", "é".encode(), b"x" * 6000):
                page = await http.get("/login", headers={b"cookie": b"devsched_csrf=" + value})
                assert page.status_code == 200
                fresh = cookie_value(set_cookies(page)["devsched_csrf"])
                assert len(fresh) == 43
                assert csrf_of(page.text) == fresh
        assert not (await client.get(task.task_id)).cancel_requested
        assert not any(d.drained for h in await client.hosts() for d in h.devices if d.device_id == device)
        assert not [line for line in hostile.proc.log_lines() if line.get("level") == "ERROR"]
    finally:
        await client.cancel(task.task_id)


async def test_logout_revokes_the_session_and_the_replayed_cookie_is_logged_out(hostile: Web, client: Client) -> None:
    task = await client.submit(WAIT_PLAN, name="replay-target")
    page_path, cancel = f"/tasks/{task.task_id}", f"/tasks/{task.task_id}/cancel"
    try:
        async with (
            httpx.AsyncClient(base_url=hostile.url, timeout=10) as mine,
            httpx.AsyncClient(base_url=hostile.url, timeout=10) as other,
        ):
            await login(mine)
            await login(other)
            stolen = {name: mine.cookies[name] for name in ("devsched_session", "devsched_csrf")}
            page = await mine.get(page_path)
            assert 'id="cancel"' in page.text
            out = await mine.post("/logout", data={"csrf": csrf_of(page.text)})
            assert out.status_code == 303
            assert "devsched_session" not in mine.cookies
            async with httpx.AsyncClient(base_url=hostile.url, timeout=10, cookies=stolen) as replay:
                again = await replay.get(page_path)
                assert again.status_code == 200
                assert 'id="cancel"' not in again.text
                assert "Log in" in again.text
                refused = await replay.post(cancel, data={"csrf": stolen["devsched_csrf"]})
                assert refused.status_code == 403
            assert not (await client.get(task.task_id)).cancel_requested
            # the other operator's session lives on
            assert 'id="cancel"' in (await other.get(page_path)).text
    finally:
        await client.cancel(task.task_id)


# -- logout across replicas ----------------------------------------------------------------------------------


class Replica:
    """A dashboard process with the operator token, started and stopped off the event loop (a TCP proxy in
    this loop may carry its NATS connection); each start is a new process on a new port."""

    def __init__(self, stack: Stack, work_dir: Path, name: str, nats_url: str) -> None:
        self._args = (stack, work_dir, name, nats_url)
        self._running: contextlib.AbstractContextManager[Web] | None = None
        self.web: Web | None = None

    @property
    def url(self) -> str:
        assert self.web is not None
        return self.web.url

    async def start(self) -> Replica:
        stack, work_dir, name, nats_url = self._args
        self._running = web_process(
            stack, work_dir, name=name, web_actions="true", web_token=TOKEN, nats_url=nats_url
        )  # fmt: skip
        self.web = await asyncio.to_thread(self._running.__enter__)
        return self

    async def stop(self) -> None:
        if self._running is not None:
            running, self._running = self._running, None
            await asyncio.to_thread(running.__exit__, None, None, None)

    async def restart(self) -> None:
        await self.stop()
        await self.start()


async def logged_in_cookies(url: str) -> dict[str, str]:
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        await login(http)
        return {name: http.cookies[name] for name in ("devsched_session", "devsched_csrf")}


async def session_on(replica: Replica, cookies: dict[str, str]) -> int:
    """What an action with `cookies` gets on `replica`: 404 (the session is live: the cancel of no task reached
    the scheduler), 403 (no session) or 503 (sessions cannot be checked there now)."""
    async with httpx.AsyncClient(base_url=replica.url, timeout=10, cookies=cookies) as http:
        reply = await http.post(f"/tasks/{uuid.uuid4()}/cancel", data={"csrf": cookies["devsched_csrf"]})
        return reply.status_code


async def test_a_logout_holds_on_every_replica_across_restarts_and_a_partition(
    stack: Stack, client: Client, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Two replicas on one NATS (B through a proxy): a cookie copied before its logout on A is logged out on B
    within a bounded poll, and stays so after B and A restart; B partitioned from NATS fails closed (503, not
    ready), then learns the logouts it missed before it accepts any session again; other sessions live on."""
    work = tmp_path_factory.mktemp("web-replicas")
    nats_at = urlsplit(stack.nats_url)
    assert nats_at.hostname is not None
    assert nats_at.port is not None
    async with TcpProxy((nats_at.hostname, nats_at.port)) as proxy:
        a = Replica(stack, work, "web-a", stack.nats_url)
        b = Replica(stack, work, "web-b", proxy.url())
        try:
            await asyncio.gather(a.start(), b.start())
            mine, other, third = await asyncio.gather(
                logged_in_cookies(a.url), logged_in_cookies(b.url), logged_in_cookies(a.url)
            )
            assert [await session_on(b, mine), await session_on(a, other)] == [404, 404], "cookies work anywhere"

            # log out on A: the copy of the cookie is logged out on B too
            async with httpx.AsyncClient(base_url=a.url, timeout=10, cookies=mine) as http:
                out = await http.post("/logout", data={"csrf": mine["devsched_csrf"]})
            assert out.status_code == 303
            assert await session_on(a, mine) == 403
            started = time.monotonic()
            await eventually(lambda: _is(session_on(b, mine), 403), timeout=5, message="the copy is logged out on B")
            print(f"\nlogout on A seen on B after {time.monotonic() - started:.2f} s")
            assert [await session_on(a, other), await session_on(b, other)] == [404, 404], "others live on"

            # B cut off from NATS (a half-open link): it may miss a logout, so no session is live there
            proxy.blackhole()
            started = time.monotonic()
            async with httpx.AsyncClient(base_url=b.url, timeout=10) as http:

                async def unready() -> dict[str, object] | None:
                    # not ready for its sessions (the `nats` check may fail first: it is not enough here)
                    readyz = await http.get("/readyz")
                    verdict = readyz.json()
                    sessions_ok = verdict["checks"]["sessions"]["ok"]
                    return verdict if readyz.status_code == 503 and not sessions_ok else None

                verdict = await eventually(unready, timeout=15, message="B is not ready for its sessions")
            print(f"B cut off: not ready after {time.monotonic() - started:.2f} s: {verdict}")
            assert await session_on(b, other) == 503, "B fails closed"
            async with httpx.AsyncClient(base_url=a.url, timeout=10, cookies=third) as http:
                assert (await http.post("/logout", data={"csrf": third["devsched_csrf"]})).status_code == 303
            proxy.heal()  # B reconnects and replays the bucket before any session is live there again
            await eventually(lambda: _is(session_on(b, other), 404), timeout=30, message="B takes sessions again")
            assert await session_on(b, third) == 403, "the logout made while B was cut off"

            print(f"B takes sessions again {time.monotonic() - started:.2f} s after the cut")
            # restarts forget nothing: each replica replays the bucket before it serves
            started = time.monotonic()
            await asyncio.gather(a.restart(), b.restart())
            print(f"restarted in {time.monotonic() - started:.2f} s")
            for replica in (a, b):
                states = [await session_on(replica, c) for c in (mine, third, other)]
                assert states == [403, 403, 404], replica.url
        finally:
            await asyncio.gather(a.stop(), b.stop())

    # each entry is the session id alone, kept as long as its cookie is valid (then NATS drops it)
    js = client.nc.jetstream()
    bucket = Subjects(stack.prefix).web_revoked_bucket
    session_id, expiry, _ = mine["devsched_session"].split(".")
    entry = await js.get_last_msg(f"KV_{bucket}", f"$KV.{bucket}.{session_id}")
    assert entry.data == expiry.encode()
    assert entry.headers is not None
    ttl = int(entry.headers["Nats-TTL"])
    assert int(expiry) - time.time() <= ttl <= int(expiry) - time.time() + 600, (ttl, expiry)


async def _is(status: Awaitable[int], expected: int) -> bool:
    return await status == expected


# -- login limit ---------------------------------------------------------------------------------------------


async def test_login_failures_are_limited_per_address_then_in_total(limited: Web) -> None:
    async with httpx.AsyncClient(base_url=limited.url, timeout=10) as http:

        async def attempt(ip: str, token: str) -> httpx.Response:
            headers = {"x-forwarded-for": ip}
            page = await http.get("/login", headers=headers)
            form = {"csrf": csrf_of(page.text), "token": token, "next": "/lab"}
            return await http.post("/login", data=form, headers=headers)

        for _ in range(3):
            assert (await attempt("10.1.0.1", "a-wrong-guess-of-the-token")).status_code == 403
        limited_reply = await attempt("10.1.0.1", TOKEN)  # the right token too, while limited
        assert limited_reply.status_code == 429
        assert 1 <= int(limited_reply.headers["retry-after"]) <= 60
        assert "Too many failed logins" in limited_reply.text
        assert "devsched_session" not in set_cookies(limited_reply)
        # another address is not affected
        assert (await attempt("10.1.0.2", TOKEN)).status_code == 303
        # failures from many addresses: past 5 a minute everybody waits
        assert (await attempt("10.1.0.3", "another-wrong-guess")).status_code == 403
        assert (await attempt("10.1.0.4", "another-wrong-guess")).status_code == 403
        everybody = await attempt("10.1.0.5", TOKEN)
        assert everybody.status_code == 429
        assert int(everybody.headers["retry-after"]) >= 1


# -- Secure cookies ------------------------------------------------------------------------------------------


async def test_cookies_are_secure_when_a_trusted_proxy_says_https_or_when_forced(
    hostile: Web, plain: Web, named: Web
) -> None:
    https = {"x-forwarded-proto": "https"}

    async def cookies_of(web: Web, headers: dict[str, str], host: str | None = None) -> dict[str, str]:
        extra = {"host": host} if host else {}
        async with httpx.AsyncClient(base_url=web.url, timeout=10) as http:
            page = await http.get("/login", headers={**headers, **extra})
            csrf = csrf_of(page.text)
            form = {"csrf": csrf, "token": TOKEN, "next": "/lab"}
            jar = {"cookie": f"devsched_csrf={csrf}"}
            reply = await http.post("/login", data=form, headers={**headers, **extra, **jar})
            assert reply.status_code == 303
            return {**set_cookies(page), **set_cookies(reply)}

    def secure(header: str) -> bool:
        return "secure" in [part.strip().lower() for part in header.split(";")]

    behind_tls = await cookies_of(hostile, https)  # from 127.0.0.1, trusted
    assert secure(behind_tls["devsched_csrf"])
    assert secure(behind_tls["devsched_session"])
    direct = await cookies_of(hostile, {})
    assert not secure(direct["devsched_csrf"])
    assert not secure(direct["devsched_session"])
    spoofed = await cookies_of(plain, https)  # no proxy trusted: the header is the client's word only
    assert not secure(spoofed["devsched_csrf"])
    assert not secure(spoofed["devsched_session"])
    forced = await cookies_of(named, {}, host="devsched.example.com")
    assert secure(forced["devsched_csrf"])
    assert secure(forced["devsched_session"])
