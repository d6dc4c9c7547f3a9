"""One-click login links (`/login?k=CODE`, minted by `devsched up`) against a real dashboard process: a code
logs in once, from this machine only, is refused when expired or minted for another token, and is never
logged; in a real Chromium the link lands on the lab logged in."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.async_api import async_playwright

from devsched.protocol import login_links
from support.devsched_stack import Stack
from support.web_harness import TOKEN, Web, web_process

pytestmark = pytest.mark.e2e

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]


@pytest.fixture(scope="module")
def web(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Web]:
    with web_process(
        stack, tmp_path_factory.mktemp("web-link"), name="web-link", web_actions="true", web_token=TOKEN,
        # a proxy on this machine it believes: X-Forwarded-For names the client (a remote one below)
        web_forwarded_allow_ips="127.0.0.1",
    ) as w:  # fmt: skip
        yield w


def from_local(web: Web, n: int) -> httpx.Client:
    """A client at 127.0.0.`n` (through the believed proxy): each test its own, for the failed-login limit."""
    return web.client(headers={"x-forwarded-for": f"127.0.0.{n}"})


def code(token: str = TOKEN, at: float | None = None) -> str:
    return login_links.mint(token, time.time() if at is None else at)


def test_a_link_logs_in_once(web: Web) -> None:
    fresh = code()
    with from_local(web, 2) as http:
        assert "Log out" not in http.get("/lab").text
        reply = http.get(f"/login?k={fresh}")
        assert reply.status_code == 303, reply.text
        assert reply.headers["location"] == "/"
        cookie = reply.headers["set-cookie"]
        assert "devsched_session=" in cookie
        assert "httponly" in cookie.lower()
        assert "samesite=strict" in cookie.lower()
        assert "Log out" in http.get("/lab").text  # a session, as a typed login makes
    with from_local(web, 3) as other:
        again = other.get(f"/login?k={fresh}")
        assert again.status_code == 403, again.text
        assert "used already" in again.text
        assert "devsched_session" not in other.cookies


@pytest.mark.parametrize(
    "bad",
    [
        code(at=time.time() - login_links.LINK_S - 1),  # expired
        code(token="another-operator-token-0123456789"),  # not this dashboard's
        "not-a-code",
        TOKEN,  # the token itself is no code
    ],
)
def test_a_bad_code_is_refused_and_starts_no_session(web: Web, bad: str) -> None:
    # four failures from one client: under its limit of five a minute (a fifth would answer 429)
    with from_local(web, 4) as http:
        reply = http.get("/login", params={"k": bad})
        assert reply.status_code == 403, reply.text
        assert "devsched_session" not in http.cookies
        assert "set-cookie" not in reply.headers or "devsched_session" not in reply.headers["set-cookie"]


def test_a_link_from_another_machine_is_refused(web: Web) -> None:
    fresh = code()
    with from_local(web, 5) as http:
        remote = http.get(f"/login?k={fresh}", headers={"x-forwarded-for": "192.0.2.7"})
        assert remote.status_code == 403, remote.text
        assert "only from this machine" in remote.text
        assert "devsched_session" not in http.cookies
        assert http.get(f"/login?k={fresh}").status_code == 303  # refused remotely, the code was not spent


def test_neither_a_code_nor_the_token_is_logged(web: Web) -> None:
    fresh = code()
    with from_local(web, 6) as http:
        assert http.get(f"/login?k={fresh}").status_code == 303
        assert http.get(f"/login?k={fresh}").status_code == 403
    logged = web.proc.log_path.read_text()
    assert "dashboard login by link" in logged
    assert "dashboard login link refused" in logged
    assert fresh not in logged
    assert fresh.split(".")[0] not in logged
    assert TOKEN not in logged


@pytest.mark.browser
@pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} missing: apt-get install chromium")
async def test_in_a_browser_the_link_lands_on_the_lab_logged_in(web: Web) -> None:
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            page = await (await browser.new_context()).new_page()
            page.set_default_timeout(15000)
            await page.goto(login_links.link(web.url, code()))  # as a click in the terminal opens it
            await page.wait_for_url("**/lab")
            await page.get_by_role("button", name="Log out").wait_for()
        finally:
            await browser.close()
