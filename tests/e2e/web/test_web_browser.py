"""devsched-web in a real headless Chromium (Debian's /usr/bin/chromium, driven by Playwright) against the
real services and agent: each page loads (a screenshot of each is saved), a submitted task appears on the
Queue page and turns done without a reload, cancel from the Task page cancels, drain from the Device page
drains.

Screenshots go to the test's artifacts directory; with `DEVSCHED_WEB_SCREENSHOTS=<dir>` the Lab and Task
pages are also written there for the README (`docs/images/`, see README "Web dashboard").
"""

from __future__ import annotations

import asyncio
import os
import re
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from playwright.async_api import Page, async_playwright

from devsched.client import Client
from support.devsched_stack import Stack
from support.polling import eventually
from support.web_harness import TOKEN, Web, web_process

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

if not CHROMIUM.exists() and os.environ.get("CI"):
    pytest.fail(f"{CHROMIUM} is missing in CI (.ci/run installs the Debian package chromium)", pytrace=False)

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} missing: apt-get install chromium"),
]

SLOW_PLAN = {"steps": [{"name": "work", "action": "shell", "args": {"command": "echo working; sleep 2; echo done"}}]}
LONG_PLAN = {
    "steps": [{"name": "wait", "action": "shell", "args": {"command": "echo waiting; sleep 60"}, "interruptible": True}]
}


@pytest.fixture(scope="module")
def web(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Web]:
    with web_process(stack, tmp_path_factory.mktemp("web-browser"), web_actions="true", web_token=TOKEN) as w:
        yield w


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("screenshots")


@pytest.fixture
async def client(stack: Stack) -> AsyncIterator[Client]:
    async with Client.connect(stack.nats_url, prefix=stack.prefix) as c:
        yield c


@pytest.fixture
async def page(web: Web) -> AsyncIterator[Page]:
    """A logged-in page of a fresh browser (one browser per test keeps the event loops apart)."""
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            context = await browser.new_context(base_url=web.url, viewport={"width": 1280, "height": 900})
            context.set_default_timeout(15000)
            page = await context.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.on("dialog", lambda dialog: asyncio.ensure_future(dialog.accept()))
            await page.goto("/login?next=/lab")
            await page.get_by_label("Operator token").fill(TOKEN)
            await page.get_by_role("button", name="Log in").click()
            await page.wait_for_url("**/lab")
            yield page
            assert not errors, errors
        finally:
            await browser.close()


def readme_copy(shot: Path, name: str) -> None:
    target = os.environ.get("DEVSCHED_WEB_SCREENSHOTS")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        (Path(target) / name).write_bytes(shot.read_bytes())


async def test_each_page_loads(page: Page, client: Client, stack: Stack, shots: Path) -> None:
    p = page
    running = await client.submit(LONG_PLAN, name="nightly-smoke", priority=5)
    await client.submit(SLOW_PLAN, name="flash-firmware")
    await client.submit({"steps": [{"name": "hi", "action": "noop"}]}, name="quick-check")
    try:
        await eventually(lambda: _dispatched(client, running.task_id), timeout=30, message="the long task runs")
        pages = [
            ("/lab", "Lab"),
            ("/queue", "Queue"),
            ("/charts", "Charts"),
            (f"/tasks/{running.task_id}", "Task"),
            (f"/devices/{stack.device_ids[0]}", "Device"),
        ]
        for path, marker in pages:
            await p.goto(path)
            await p.get_by_role("heading", level=1).filter(has_text=marker).wait_for()
            name = path.strip("/").split("/")[0] or "root"
            if name == "tasks":
                await p.locator("#log").filter(has_text="waiting").wait_for()
            shot = shots / f"{name}.png"
            await p.screenshot(path=str(shot), full_page=True)
            assert shot.stat().st_size > 1000
            if name == "lab":
                readme_copy(shot, "web-lab.png")
            elif name == "tasks":
                readme_copy(shot, "web-task.png")
        # a phone's width: the lab still renders its grid without horizontal scrolling of the page
        await p.set_viewport_size({"width": 390, "height": 844})
        await p.goto("/lab")
        width = await p.evaluate("document.documentElement.scrollWidth")
        assert width <= 400
        await p.screenshot(path=str(shots / "lab-phone.png"))
    finally:
        await client.cancel(running.task_id)


async def _dispatched(client: Client, task_id: object) -> bool:
    return (await client.get(str(task_id))).status == "dispatched"


async def test_a_submitted_task_shows_on_the_queue_and_turns_done_live(page: Page, client: Client) -> None:
    p = page
    await p.goto("/queue")
    await p.evaluate("window.__stayed = 'same page'")
    reply = await client.submit(SLOW_PLAN, name="appears-live")
    row = p.locator(f'tr[data-task="{reply.task_id}"]').first
    await row.wait_for(timeout=20000)
    done = p.locator(f'tr[data-task="{reply.task_id}"] [data-status="done"]').first
    await done.wait_for(timeout=30000)
    assert await p.evaluate("window.__stayed") == "same page"
    assert (await client.get(reply.task_id)).status == "done"


async def test_cancel_from_the_task_page_cancels(page: Page, client: Client) -> None:
    p = page
    reply = await client.submit(LONG_PLAN, name="to-cancel")
    await p.goto(f"/tasks/{reply.task_id}")
    await p.locator("#cancel").click()
    await p.locator('#task-status[data-status="cancelled"]').wait_for(timeout=30000)
    assert (await client.get(reply.task_id)).status == "cancelled"


async def test_a_live_update_keeps_what_the_operator_typed(page: Page, client: Client, stack: Stack) -> None:
    """The device page's region is swapped whole on each change; the reason being typed survives it."""
    p = page
    device = stack.device_ids[1]
    await p.goto(f"/devices/{device}")
    await p.locator("#live-status").filter(has_text="updated").wait_for()  # the stream's first swap is done
    await p.evaluate(
        """() => { window.__swaps = 0; new MutationObserver(() => { window.__swaps += 1; })
             .observe(document.getElementById("device-state").closest("[data-live]"), {childList: true}); }"""
    )
    await p.locator("#drain-reason").fill("flashing")
    reply = await client.submit({"steps": [{"name": "hi", "action": "noop"}]}, name="swap-trigger", device_id=device)
    await eventually(lambda: _done(client, reply.task_id), timeout=30, message="the task on the device ends")
    await eventually(lambda: _swapped(p), timeout=15, message="the device's region is swapped")
    assert await p.locator("#drain-reason").input_value() == "flashing"


async def _swapped(p: Page) -> bool:
    return bool(await p.evaluate("() => window.__swaps > 0"))


async def _done(client: Client, task_id: object) -> bool:
    return (await client.get(str(task_id))).status == "done"


async def test_drain_from_the_device_page_drains(page: Page, client: Client, stack: Stack) -> None:
    p = page
    device = stack.device_ids[0]
    await p.goto(f"/devices/{device}")
    await p.get_by_label("Reason").fill("maintenance")
    await p.locator("#drain").click()
    await p.locator('#device-state[data-state="drained"]').wait_for()
    hosts = await client.hosts()
    assert any(d.drained and d.drain_reason == "maintenance" for h in hosts for d in h.devices if d.device_id == device)
    await p.locator("#undrain").click()
    await p.locator('#device-state:not([data-state="drained"])').wait_for()
    hosts = await client.hosts()
    assert not any(d.drained for h in hosts for d in h.devices if d.device_id == device)


async def test_log_out_ends_the_session_even_for_a_copy_of_its_cookie(page: Page, client: Client) -> None:
    """Logged in (the fixture), then out with the button: the session cookie put back is no session."""
    p = page
    reply = await client.submit(LONG_PLAN, name="after-logout")
    try:
        await p.goto(f"/tasks/{reply.task_id}")
        await p.locator("#cancel").wait_for()
        (session,) = [c for c in await p.context.cookies() if c["name"] == "devsched_session"]
        await p.get_by_role("button", name="Log out").click()
        await p.get_by_role("link", name="Log in").wait_for()
        assert not [c for c in await p.context.cookies() if c["name"] == "devsched_session"]
        await p.context.add_cookies([session])  # a copy of the cookie kept from before: replayed
        await p.goto(f"/tasks/{reply.task_id}")
        await p.get_by_role("link", name="Log in").first.wait_for()
        assert await p.locator("#cancel").count() == 0
        assert (await client.get(reply.task_id)).status != "cancelled"
        # logging in again works
        await p.get_by_role("link", name="Log in").first.click()
        await p.get_by_label("Operator token").fill(TOKEN)
        await p.get_by_role("button", name="Log in").click()
        await p.locator("#cancel").wait_for()
    finally:
        await client.cancel(reply.task_id)


INFRA_FAILS = {
    "plan": {
        "steps": [
            {"name": "flash", "action": "shell", "args": {"command": "exit 3"}, "infra": True},
            {"name": "test", "action": "shell", "args": {"command": "true"}},
        ]
    },
    "retry": {"on": ["infra"], "backoff": {"initial_s": 0.2, "max_s": 0.2}},
    "max_attempts": 3,
}


async def _status(client: Client, task_id: object, *wanted: str) -> bool:
    return (await client.get(str(task_id))).status in wanted


async def test_the_queue_says_why_a_task_waits_for_a_missing_device_and_a_quarantined_one(
    page: Page, client: Client, stack: Stack, shots: Path
) -> None:
    """The Queue's "Pending reason" column, filled from the listing: no device at all, and a quarantined one."""
    p = page
    device = stack.device_ids[1]
    broken = await client.submit(INFRA_FAILS, name="breaks-the-device", device_id=device)
    nowhere = await client.submit({"steps": [{"name": "hi", "action": "noop"}]}, name="needs-a-board",
                                  selector={"board": "no-device-has-this"})  # fmt: skip
    pinned = None
    try:
        await eventually(lambda: _status(client, broken.task_id, "failed"), timeout=60, message="3 infra failures")
        pinned = await client.submit({"steps": [{"name": "hi", "action": "noop"}]}, name="on-the-quarantined",
                                     device_id=device)  # fmt: skip
        await p.goto("/queue")
        for task_id, code in ((nowhere.task_id, "no_matching_device"), (pinned.task_id, "devices_quarantined")):
            cell = p.locator(f'tr[data-task="{task_id}"] td').nth(4)
            await cell.locator("code").filter(has_text=code).wait_for(timeout=30000)
            assert (await cell.inner_text()).startswith(f"{code} ")
        quarantined = await p.locator(f'tr[data-task="{pinned.task_id}"] td').nth(4).inner_text()
        assert "quarantined after repeated infrastructure failures" in quarantined
        await p.screenshot(path=str(shots / "queue-reasons.png"), full_page=True)
    finally:
        for reply in (nowhere, pinned):
            if reply is not None:
                await client.cancel(reply.task_id)
        await client.drain(device, drained=False)  # lifts the quarantine: the device serves the next tests


NEVER_PLAN = {"steps": [{"name": "never", "action": "noop"}]}
NOWHERE = {"platform": "no-device-is-this"}


async def test_queue_filters_come_from_the_form_and_stay_in_the_links(page: Page, client: Client) -> None:
    """Filters in the query string, set with the form; the next page's link and live stream keep them."""
    p = page
    done = await client.submit({"steps": [{"name": "hi", "action": "noop"}]}, name="filter-done")
    await client.wait(done.task_id, timeout=60)
    gate = asyncio.Semaphore(8)

    async def submit(i: int) -> str:
        async with gate:
            return str((await client.submit(NEVER_PLAN, name=f"filter-q-{i}", selector=NOWHERE)).task_id)

    queued = await asyncio.gather(*(submit(i) for i in range(105)))
    try:
        # one task by its short id, with the form
        await p.goto("/queue")
        await p.get_by_label("Status").select_option("done")
        await p.get_by_label("Kind").select_option("user")
        await p.get_by_label("Task id").fill(str(done.task_id)[:8])
        await p.get_by_role("button", name="Filter").click()
        await p.wait_for_url(re.compile(rf"/queue\?status=done&kind=user&device=&id={str(done.task_id)[:8]}$"))
        await p.locator(f'tr[data-task="{done.task_id}"]').wait_for()
        assert await p.locator("table.tasks tbody tr[data-task]").count() == 1
        assert await p.get_by_label("Status").input_value() == "done"  # the form shows the filters in force
        assert await p.get_by_label("Task id").input_value() == str(done.task_id)[:8]
        # every queued task, a page at a time: the next page keeps the filters and adds the cursor
        await p.goto("/queue?status=queued&kind=user")
        rows = p.locator("table.tasks tbody tr[data-task]")
        await rows.first.wait_for()
        assert await rows.count() == 100
        first_page = set(await rows.evaluate_all("rows => rows.map(r => r.dataset.task)"))
        assert await p.locator(f'tr[data-task="{done.task_id}"]').count() == 0
        assert set(await p.locator("table.tasks [data-status]").all_inner_texts()) == {"queued"}
        await p.locator("#filter-next").click()
        await p.wait_for_url(re.compile(r"/queue\?status=queued&kind=user&after=[^&]+$"))
        await rows.first.wait_for()
        second_page = set(await rows.evaluate_all("rows => rows.map(r => r.dataset.task)"))
        assert second_page
        assert not first_page & second_page
        assert set(queued) <= first_page | second_page
        live = await p.locator("#live").get_attribute("data-live")
        assert live is not None
        assert live.startswith("/queue/live?status=queued&kind=user&after=")
        await p.locator("#live-status").filter(has_text="updated").wait_for()  # its live stream answers
        await p.locator("#filter-first").click()
        await p.wait_for_url(re.compile(r"/queue\?status=queued&kind=user$"))
        # a bad value: said plainly, nothing listed
        await p.goto("/queue?status=sleeping")
        await p.locator("#filter-problems").filter(has_text="'sleeping' is not a task status").wait_for()
        assert await p.locator("tr[data-task]").count() == 0
        await p.locator("#filter-clear").click()
        await p.wait_for_url(re.compile(r"/queue$"))
        await p.get_by_role("table").filter(has_text="Queued (next first)").wait_for()
    finally:
        for task_id in queued:
            await client.cancel(task_id)


async def test_resubmit_from_the_task_page_submits_the_same_plan_again(page: Page, client: Client) -> None:
    p = page
    request = {
        "plan": {"steps": [{"name": "hi", "action": "shell", "args": {"command": "echo again"}}]},
        "selector": {"labels": {"platform": "sim"}},
        "priority": 3,
        "max_attempts": 2,
        "metadata": {"team": "qa"},
        "attempt_timeout_s": 60,
    }
    first = await client.submit(request, name="run-it-again", idempotency_key=f"once-{uuid.uuid4()}")
    await client.wait(first.task_id, timeout=60)
    await p.goto(f"/tasks/{first.task_id}")
    await p.locator("#resubmit").click()  # (the fixture accepts the confirmation)
    await p.wait_for_url(lambda url: "/tasks/" in url and str(first.task_id) not in url)
    new_id = p.url.rsplit("/", 1)[-1]
    await p.get_by_role("heading", level=1).filter(has_text=new_id).wait_for()
    await p.locator('#task-status[data-status="done"]').wait_for(timeout=30000)  # and it ran, live
    old, new = await client.get(first.task_id), await client.get(new_id)
    assert (new.plan, new.selector, new.name, new.priority, new.max_attempts) == (
        old.plan, old.selector, old.name, old.priority, old.max_attempts,
    )  # fmt: skip
    assert new.attempt_timeout_s == old.attempt_timeout_s
    assert new.metadata == {**old.metadata, "resubmit_of": str(first.task_id)}
    assert new.idempotency_key != old.idempotency_key
    # the new task's page links the one it repeats, and that one names no original of its own
    await p.locator("#resubmit-of").click()
    await p.wait_for_url(re.compile(rf"/tasks/{first.task_id}$"))
    await p.get_by_role("heading", level=1).filter(has_text=str(first.task_id)).wait_for()
    assert await p.locator("#resubmit-of").count() == 0
    # the new task's output as plain text, from the link on its page: shown as text, not a page
    await p.goto(f"/tasks/{new_id}")
    await p.locator("#log-txt").click()
    await p.wait_for_url(re.compile(rf"/tasks/{new_id}/log.txt$"))
    assert (await p.locator("body").inner_text()).strip() == "again"
    assert await p.evaluate("document.contentType") == "text/plain"


async def test_the_task_page_shows_how_long_each_step_took_and_the_running_one_so_far(
    page: Page, client: Client
) -> None:
    p = page
    plan = {
        "steps": [
            {"name": "quick", "action": "shell", "args": {"command": "sleep 1.5"}},
            {"name": "long", "action": "shell", "args": {"command": "sleep 60"}, "interruptible": True},
        ]
    }
    reply = await client.submit(plan, name="timed")
    try:
        await p.goto(f"/tasks/{reply.task_id}")
        running = p.locator('#steps-1 tr[data-step="long"][data-running="true"] td.duration')
        await running.filter(has_text="running").wait_for(timeout=30000)
        quick = p.locator('#steps-1 tr[data-step="quick"] td.duration')
        seconds = float(await quick.get_attribute("data-seconds") or "nan")
        assert 1.0 <= seconds <= 15.0, seconds  # sleep 1.5, timed by the events' commit times
        assert (await quick.inner_text()).endswith(" s")
        before = float(await running.get_attribute("data-seconds") or "nan")

        async def grew() -> bool:
            now = await running.get_attribute("data-seconds")
            return now is not None and float(now) > before

        await eventually(grew, timeout=15, message="the running step's elapsed time goes up, live")
        await client.cancel(reply.task_id)
        await p.locator('#task-status[data-status="cancelled"]').wait_for(timeout=30000)
        ended = p.locator('#steps-1 tr[data-step="long"] td.duration')
        assert await p.locator('#steps-1 tr[data-running="true"]').count() == 0
        assert "running" not in await ended.inner_text()
    finally:
        await client.cancel(reply.task_id)


async def test_the_charts_have_labelled_axes(page: Page) -> None:
    p = page
    await p.goto("/charts")
    for chart, title in (("#chart-finished", "tasks finished / minute"), ("#chart-depth", "tasks queued")):
        svg = p.locator(chart)
        await svg.wait_for()
        texts = await svg.locator("text").all_text_contents()
        assert title in texts, texts
        assert any(t.startswith("time (UTC") for t in texts), texts
        assert "0" in texts  # the count axis starts at zero
        x_labels = await svg.locator("[data-axis=x] text").all_text_contents()
        assert len(x_labels) == 4, x_labels  # a quarter-hour mark each 15 of the 60 minutes
        assert all(len(t) == 5 and t[2] == ":" for t in x_labels), x_labels
