"""devsched-web as a process against the real services and agent, over plain HTTP: every page, the guards
of the actions (read-only 403, CSRF, origin, token), and that no lease id is ever rendered."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from devsched.client import Client
from support.devsched_stack import Stack, clean_env
from support.polling import eventually
from support.web_harness import TOKEN, Web, web_process

pytestmark = pytest.mark.e2e

PAGES = ("/lab", "/queue", "/charts")


@pytest.fixture(scope="module")
def read_only(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Web]:
    # the health listener on a port of its own, as in the manifests (DEVSCHED_METRICS_PORT)
    with web_process(stack, tmp_path_factory.mktemp("web-ro"), name="web-ro", metrics_port="0") as web:
        yield web


@pytest.fixture(scope="module")
def with_actions(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Web]:
    with web_process(
        stack, tmp_path_factory.mktemp("web-rw"), name="web-rw", web_actions="true", web_token=TOKEN
    ) as web:
        yield web


@pytest.fixture
async def client(stack: Stack) -> AsyncIterator[Client]:
    async with Client.connect(stack.nats_url, prefix=stack.prefix) as c:
        yield c


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, "no CSRF field in the page"
    return found.group(1)


async def login(http: httpx.AsyncClient) -> None:
    page = await http.get("/login")
    assert page.status_code == 200
    reply = await http.post("/login", data={"csrf": csrf_of(page.text), "token": TOKEN, "next": "/lab"})
    assert reply.status_code == 303, reply.text
    assert "devsched_session" in http.cookies


async def test_every_page_renders_with_security_headers(read_only: Web, client: Client, stack: Stack) -> None:
    reply = await client.submit({"steps": [{"name": "hi", "action": "noop"}]}, name="page-check")
    async with httpx.AsyncClient(base_url=read_only.url) as http:
        paths = [*PAGES, f"/tasks/{reply.task_id}", f"/devices/{stack.device_ids[0]}"]
        for path in paths:
            page = await http.get(path)
            assert page.status_code == 200, (path, page.text[:500])
            headers = page.headers
            assert "frame-ancestors 'none'" in headers["content-security-policy"]
            assert "script-src 'self'" in headers["content-security-policy"]
            assert "unsafe-inline" not in headers["content-security-policy"]
            assert headers["x-frame-options"] == "DENY"
            assert headers["x-content-type-options"] == "nosniff"
            assert "<script>" not in page.text  # no inline script: the CSP would block it anyway
        lab = (await http.get("/lab")).text
        for device_id in stack.device_ids:
            assert device_id in lab
        assert (await http.get(f"/tasks/{uuid.uuid4()}")).status_code == 404
        assert (await http.get("/devices/no-such-device")).status_code == 404
        assert (await http.get("/readyz")).status_code == 200


async def test_device_page_shows_its_history_from_the_api(
    stack: Stack, client: Client, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Issue 15: a task that ended before this web process started is on the page of the device it ran on."""
    device, other = stack.device_ids[0], stack.device_ids[1]
    reply = await client.submit({"steps": [{"name": "hi", "action": "noop"}]}, name="history-check", device_id=device)
    view = await client.wait(reply.task_id, timeout=60)
    assert view.status == "done", view
    with web_process(stack, tmp_path_factory.mktemp("web-history"), name="web-history") as web:
        async with httpx.AsyncClient(base_url=web.url) as http:

            async def device_page(device_id: str) -> str:
                page = await http.get(f"/devices/{device_id}")
                assert page.status_code == 200, page.text[:500]
                return page.text

            async def listed() -> str | None:
                text = await device_page(device)
                return text if str(reply.task_id) in text else None

            shown = await eventually(listed, timeout=30, message="the finished task on its device's page")
            row = re.search(rf'<tr data-task-id="{reply.task_id}">.*?</tr>', shown, re.S)
            assert row, shown
            assert "history-check" in row.group(0)
            assert ">done<" in row.group(0)
            assert f'href="/tasks/{reply.task_id}"' in row.group(0)
            assert str(reply.task_id) not in await device_page(other)
            bad = await http.get(f"/devices/{device}?after=not-a-cursor")
            assert bad.status_code == 400


async def test_read_only_renders_no_action_and_refuses_every_post(read_only: Web, client: Client, stack: Stack) -> None:
    reply = await client.submit({"steps": [{"name": "wait", "action": "sleep", "args": {"seconds": 30}}]})
    async with httpx.AsyncClient(base_url=read_only.url) as http:
        task_page = await http.get(f"/tasks/{reply.task_id}")
        device_page = await http.get(f"/devices/{stack.device_ids[0]}")
        for page in (task_page, device_page):
            assert '<form method="post"' not in page.text
            assert "read-only" in page.text
        csrf = http.cookies["devsched_csrf"]
        posts = (
            f"/tasks/{reply.task_id}/cancel",
            f"/tasks/{reply.task_id}/resubmit",
            f"/devices/{stack.device_ids[0]}/drain",
            "/login",
            "/logout",
        )
        for path in posts:
            refused = await http.post(path, data={"csrf": csrf})
            assert refused.status_code == 403, path
        assert (await http.get("/login")).status_code == 404
    assert (await client.get(reply.task_id)).status not in ("cancelled",)
    assert not any(d.drained for h in await client.hosts() for d in h.devices)
    assert [t.task_id async for t in client.list(limit=1)] == [reply.task_id]  # nothing resubmitted
    await client.cancel(reply.task_id)


async def test_actions_need_csrf_same_origin_and_the_token(with_actions: Web, client: Client, stack: Stack) -> None:
    reply = await client.submit({"steps": [{"name": "wait", "action": "sleep", "args": {"seconds": 30}}]})
    cancel = f"/tasks/{reply.task_id}/cancel"
    resubmit = f"/tasks/{reply.task_id}/resubmit"
    async with httpx.AsyncClient(base_url=with_actions.url) as http:
        page = await http.get(f"/tasks/{reply.task_id}")
        assert "Log in</a> to cancel or resubmit" in page.text
        assert 'id="cancel"' not in page.text
        assert 'id="resubmit"' not in page.text
        csrf = csrf_of((await http.get("/login")).text)
        # not logged in (right CSRF token): refused
        assert (await http.post(cancel, data={"csrf": csrf})).status_code == 403
        assert (await http.post(resubmit, data={"csrf": csrf})).status_code == 403
        # a wrong token: refused, no session
        wrong = await http.post("/login", data={"csrf": csrf, "token": "not-the-token-at-all", "next": "/"})
        assert wrong.status_code == 403
        assert "devsched_session" not in http.cookies
        # login without the CSRF token: refused
        assert (await http.post("/login", data={"token": TOKEN})).status_code == 403
        await login(http)
        # logged in, but no CSRF token, a wrong one, or another origin: refused, nothing cancelled
        assert (await http.post(cancel, data={})).status_code == 403
        assert (await http.post(cancel, data={"csrf": "x" * 43})).status_code == 403
        evil = await http.post(cancel, data={"csrf": csrf}, headers={"origin": "https://evil.example"})
        assert evil.status_code == 403
        assert not (await client.get(reply.task_id)).cancel_requested
        assert (await client.get(reply.task_id)).status != "cancelled"
        assert (await http.post(resubmit, data={})).status_code == 403
        assert (await http.post(resubmit, data={"csrf": "x" * 43})).status_code == 403
        evil_resubmit = await http.post(resubmit, data={"csrf": csrf}, headers={"origin": "https://evil.example"})
        assert evil_resubmit.status_code == 403
        assert [t.task_id async for t in client.list(limit=1)] == [reply.task_id]  # nothing resubmitted
        # a forged session cookie is no session
        cookies = {"devsched_csrf": csrf, "devsched_session": "9999999999.abc"}
        forged = httpx.AsyncClient(base_url=with_actions.url, cookies=cookies)
        async with forged:
            assert (await forged.post(cancel, data={"csrf": csrf})).status_code == 403
            assert (await forged.post(resubmit, data={"csrf": csrf})).status_code == 403
        assert [t.task_id async for t in client.list(limit=1)] == [reply.task_id]  # nothing resubmitted
        # an unknown task: 404, nothing submitted
        unknown = await http.post(f"/tasks/{uuid.uuid4()}/resubmit", data={"csrf": csrf})
        assert unknown.status_code == 404
        assert [t.task_id async for t in client.list(limit=1)] == [reply.task_id]
        # all in order: cancelled, then resubmitted (to the new task's page, which links the old one)
        page = await http.get(f"/tasks/{reply.task_id}")
        assert 'id="cancel"' in page.text
        assert 'id="resubmit"' in page.text
        done = await http.post(cancel, data={"csrf": csrf})
        assert done.status_code == 303
        again = await http.post(resubmit, data={"csrf": csrf})
        assert again.status_code == 303
        new_id = uuid.UUID(again.headers["location"].removeprefix("/tasks/"))
        assert new_id != reply.task_id
        try:
            new_page = (await http.get(f"/tasks/{new_id}")).text
            assert f'<a href="/tasks/{reply.task_id}" id="resubmit-of">' in new_page
            new = await client.get(new_id)
            assert (new.plan, new.metadata) == (
                (await client.get(reply.task_id)).plan,
                {"resubmit_of": str(reply.task_id)},
            )
        finally:
            await client.cancel(new_id)
    view = await client.get(reply.task_id)
    assert view.status == "cancelled" or view.cancel_requested


async def test_no_lease_id_is_ever_rendered(with_actions: Web, client: Client, stack: Stack) -> None:
    plan = {
        "steps": [
            {"name": "tell", "action": "shell", "args": {"command": "echo lease=$DEVSCHED_LEASE_ID; sleep 20"}},
        ]
    }
    reply = await client.submit(plan, name="lease-check", metadata={"api_token": "hunter2-secret", "team": "qa"})

    async def running_lease() -> str | None:
        view = await client.get(reply.task_id)
        return str(view.attempts[-1].lease_id) if view.attempts and view.status == "dispatched" else None

    lease_id = await eventually(running_lease, timeout=30, message="the task runs")
    try:
        async with httpx.AsyncClient(base_url=with_actions.url, timeout=10) as http:
            await login(http)
            task_path = f"/tasks/{reply.task_id}"
            for path in [*PAGES, task_path, f"/devices/{stack.device_ids[0]}", f"/devices/{stack.device_ids[1]}"]:
                html = (await http.get(path)).text
                assert lease_id not in html, path
                assert "hunter2" not in html, path
            assert "lease-check" in (await http.get(task_path)).text
            # the live fragment and the log stream too (the step printed its lease id)
            seen = ""
            async with http.stream("GET", f"{task_path}/log") as stream:
                async for chunk in stream.aiter_text():
                    seen += chunk
                    if "lease=" in seen:
                        break
            assert "lease=" in seen
            assert lease_id not in seen
            text = (await http.get(f"{task_path}/log.txt")).text  # the plain text too
            assert "lease=" in text
            assert lease_id not in text
            async with http.stream("GET", f"{task_path}/live") as stream:
                async for chunk in stream.aiter_text():
                    seen = chunk
                    if "event: fragment" in chunk:
                        break
            assert "Attempt 1" in seen
            assert lease_id not in seen
    finally:
        await client.cancel(reply.task_id)


async def test_drain_and_undrain_through_the_form(with_actions: Web, client: Client, stack: Stack) -> None:
    device = stack.device_ids[1]
    async with httpx.AsyncClient(base_url=with_actions.url) as http:
        await login(http)
        page = await http.get(f"/devices/{device}")
        assert 'id="drain"' in page.text
        form = {"csrf": csrf_of(page.text), "drained": "true", "reason": "<b>bench</b>"}
        drained = await http.post(f"/devices/{device}/drain", data=form)
        assert drained.status_code == 303
        assert any(d.drained for h in await client.hosts() for d in h.devices if d.device_id == device)
        page = await http.get(f"/devices/{device}")
        assert 'id="undrain"' in page.text
        assert "&lt;b&gt;bench&lt;/b&gt;" in page.text
        assert "<b>bench</b>" not in page.text
        undrained = await http.post(f"/devices/{device}/drain", data={"csrf": csrf_of(page.text), "drained": "false"})
        assert undrained.status_code == 303
    assert not any(d.drained for h in await client.hosts() for d in h.devices if d.device_id == device)


async def test_the_health_listener_says_alive_and_ready_with_nats_and_a_snapshot(read_only: Web) -> None:
    """The kubelet's probes (components/web): `/healthz` and `/readyz` on the `metrics` port."""
    (line,) = [line for line in read_only.proc.log_lines() if line.get("msg") == "health endpoints listening"]
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{line['port']}") as http:
        alive = await http.get("/healthz")
        assert alive.status_code == 200
        assert alive.json()["service"] == "devsched-web"
        ready = await http.get("/readyz")
        assert ready.status_code == 200, ready.text
        checks = {"nats": {"ok": True}, "snapshot": {"ok": True}, "sessions": {"ok": True}}  # no token: no sessions
        assert ready.json()["checks"] == checks
        assert (await http.get("/lab")).status_code == 404  # pages only on the dashboard's own port


async def test_the_queue_page_lists_a_page_of_queued_tasks_and_links_the_next(read_only: Web, client: Client) -> None:
    """A deep queue costs a page of rows, not the whole queue: 200 a page, `?page=N` for the rest."""
    plan = {"steps": [{"name": "never", "action": "noop"}]}
    selector = {"platform": "nowhere"}  # no device matches: they stay queued
    gate = asyncio.Semaphore(8)

    async def submit(i: int) -> str:
        async with gate:
            return str((await client.submit(plan, name=f"deep-{i}", selector=selector, priority=-5)).task_id)

    task_ids = [await submit(0), *await asyncio.gather(*(submit(i) for i in range(1, 205)))]
    last = (await client.submit(plan, name="deep-last", selector=selector, priority=-5)).task_id
    try:
        async with httpx.AsyncClient(base_url=read_only.url) as http:

            async def sampled() -> bool:  # a full read of the queue after the last submit (page 2 exists)
                second = (await http.get("/queue?page=2")).text
                return f'data-task="{last}"' in second and " page 2 of " in second

            await eventually(sampled, timeout=30, interval=0.5, message="the last queued task on page 2")
            first = (await http.get("/queue")).text
            queued_table = first.split("Queued (next first)")[1].split("</table>")[0]
            assert queued_table.count("<tr data-task=") == 200
            assert f'data-task="{last}"' not in queued_table  # (it is among the newest, lower down)
            assert 'href="/queue?page=2" rel="next"' in first
            second = (await http.get("/queue?page=2")).text
            assert 'href="/queue?page=1" rel="prev"' in second
            assert 'data-live="/queue/live?page=2"' in second
            assert (await http.get("/queue?page=x")).status_code == 200  # page 1
    finally:
        for task_id in [*task_ids, str(last)]:
            await client.cancel(task_id)


def test_actions_without_a_token_do_not_start(stack: Stack) -> None:
    env = clean_env(DEVSCHED_NATS_URL=stack.nats_url, DEVSCHED_WEB_ACTIONS="true", DEVSCHED_WEB_PORT="0")
    result = subprocess.run(
        [sys.executable, "-m", "devsched.web"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 2, result.stderr
    assert "DEVSCHED_WEB_TOKEN" in result.stderr
    assert "Traceback" not in result.stderr


async def test_the_task_page_offers_each_artifact_as_a_checked_attachment(
    read_only: Web, client: Client, stack: Stack
) -> None:
    command = "printf 'hello artifact' > \"$DEVSCHED_ARTIFACTS_DIR/out put.txt\""
    reply = await client.submit({"steps": [{"name": "make", "action": "shell", "args": {"command": command}}]})

    async def stored() -> bool:
        view = await client.get(reply.task_id)
        return view.status == "done" and bool(view.artifacts)

    await eventually(stored, timeout=60, message="the task ends with its artifact stored")
    async with httpx.AsyncClient(base_url=read_only.url, timeout=10) as http:
        page = (await http.get(f"/tasks/{reply.task_id}")).text
        link = f"/tasks/{reply.task_id}/artifacts/1/out%20put.txt"
        assert f'href="{link}"' in page
        assert "out put.txt" in page
        download = await http.get(link)
        assert download.status_code == 200, download.text[:300]
        assert download.content == b"hello artifact"
        assert download.headers["content-type"] == "application/octet-stream"
        assert download.headers["content-disposition"].startswith('attachment; filename="out put.txt"')
        assert download.headers["x-content-type-options"] == "nosniff"
        missing = await http.get(f"/tasks/{reply.task_id}/artifacts/1/nope.txt")
        assert missing.status_code == 404
        assert (await http.get(f"/tasks/{reply.task_id}/artifacts/2/out%20put.txt")).status_code == 404


#: Output no terminal or browser should act on: NUL, a screen clear, a title change, a CR, markup, a byte
#: that is not UTF-8, a right-to-left override.
HOSTILE_OUTPUT = b"\x00\x1b[2J\x1b]0;pwned\x07\rfake <script>alert(1)</script> \xff\xe2\x80\xaeevil\n"


def octal(data: bytes) -> str:
    return "".join(f"\\{b:03o}" for b in data)


async def test_the_plain_text_log_is_what_devsched_logs_raw_prints(
    read_only: Web, client: Client, stack: Stack
) -> None:
    plan = {
        "steps": [
            {"name": "noisy", "action": "shell", "args": {"command": f"printf '{octal(HOSTILE_OUTPUT)}'"}},
            {"name": "second", "action": "shell", "args": {"command": "echo out; echo err >&2; echo again"}},
        ]
    }
    reply = await client.submit(plan, name="log-text")
    view = await client.wait(reply.task_id, timeout=60)
    assert view.status == "done", view

    def raw(*args: str) -> bytes:
        result = subprocess.run(
            [sys.executable, "-m", "devsched.client", "logs", "--raw", *args, str(reply.task_id)],
            env=stack.cli_env(), stdin=subprocess.DEVNULL, capture_output=True, timeout=60, check=False,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        return result.stdout

    whole = raw()
    assert whole.startswith(HOSTILE_OUTPUT)
    assert b"out\n" in whole
    assert b"err\n" in whole
    path = f"/tasks/{reply.task_id}/log.txt"
    async with httpx.AsyncClient(base_url=read_only.url, timeout=10) as http:
        text = await http.get(path)
        assert text.status_code == 200, text.text[:300]
        assert text.content == whole
        assert text.headers["content-type"].startswith("text/plain")
        assert text.headers["content-disposition"].startswith("inline")
        assert text.headers["x-content-type-options"] == "nosniff"
        assert "content-length" not in text.headers  # streamed as it is read
        assert "frame-ancestors 'none'" in text.headers["content-security-policy"]
        second = (await http.get(f"{path}?step=second")).content
        assert second == raw("--step", "second")
        assert sorted(second.splitlines()) == [b"again", b"err", b"out"]  # (stdout and stderr as the agent read them)
        assert (await http.get(f"{path}?attempt=1")).content == raw("--attempt", "1")
        assert (await http.get(f"{path}?step=no-such-step")).content == b""
        for bad in ("attempt=0", "attempt=x", "attempt=-1", "attempt=%C2%B2", f"step={'s' * 201}"):
            refused = await http.get(f"{path}?{bad}")
            assert refused.status_code == 400, bad
            assert refused.headers["content-type"].startswith("text/plain"), bad
        missing = await http.get(f"{path}?attempt=2")
        assert missing.status_code == 404
        assert "no attempt 2" in missing.text
        assert (await http.get(f"/tasks/{uuid.uuid4()}/log.txt")).status_code == 404
        assert (await http.get("/tasks/not-a-task/log.txt")).status_code == 404
        # the same gate as every page: a name the dashboard is not reached by gets 400 before any read
        rebound = await http.get(path, headers={"host": "attacker.example"})
        assert rebound.status_code == 400
        assert HOSTILE_OUTPUT not in rebound.content
        # and the task page links to it
        assert f'href="{path}"' in (await http.get(f"/tasks/{reply.task_id}")).text


async def test_queue_filters_that_cannot_be_applied_list_nothing_and_say_why(read_only: Web, client: Client) -> None:
    reply = await client.submit({"steps": [{"name": "hi", "action": "noop"}]}, name="filter-me")
    await client.wait(reply.task_id, timeout=60)
    async with httpx.AsyncClient(base_url=read_only.url, timeout=10) as http:
        for query, named in (
            ("status=sleeping", "status: &#39;sleeping&#39; is not a task status"),
            ("status=done&kind=robot", "kind: &#39;robot&#39; is not a task kind"),
            ("id=12", "id: &#39;12&#39; is not a task id"),
            ("device=%3Cb%3E", "device: &#39;&lt;b&gt;&#39; is not a device id"),
        ):
            page = await http.get(f"/queue?{query}")
            assert page.status_code == 400, query
            assert named in page.text, (query, page.text[:2000])
            assert "<tr data-task=" not in page.text, query  # nothing listed
            assert "<b>" not in page.text
            assert (await http.get(f"/queue/live?{query}")).status_code == 400
        bad_cursor = await http.get("/queue?status=done&after=not-a-cursor")
        assert bad_cursor.status_code == 400
        found = await http.get(f"/queue?status=done&id={str(reply.task_id)[:8]}")
        assert found.status_code == 200
        assert f'data-task="{reply.task_id}"' in found.text
