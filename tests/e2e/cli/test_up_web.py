"""`devsched up`'s dashboard and metrics: a kept token, a stable port, a one-click login link, `/metrics` of each
service, and the URL on screen in an 80x24 terminal while the demo runs."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import socket
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from devsched.embedded.postgres_server import relocated_data_dir
from support.devsched_stack import clean_env, run_devsched, up_process

pytestmark = pytest.mark.e2e

LINK = re.compile(r"http://127\.0\.0\.1:\d+/login\?k=[A-Za-z0-9_-]{12}\.[0-9a-z]{1,8}\.[A-Za-z0-9_-]{22}")


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


def follow_link(url: str) -> tuple[int, str]:
    """GET a login link without following its redirect: the status and the Set-Cookie header."""
    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(url, timeout=10) as reply:
            return reply.status, reply.headers.get("set-cookie", "")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("set-cookie", "")


@pytest.fixture
def relocated_data(tmp_path: Path) -> Iterator[None]:
    """Remove the Postgres data that `up` keeps outside tmp_path (private to root: see `PostgresServer`)."""
    yield
    if os.geteuid() == 0:
        shutil.rmtree(relocated_data_dir(tmp_path / ".devsched" / "postgres"), ignore_errors=True)


def wait_for(path: Path, text: str, up: object, timeout: float = 90) -> str:
    deadline = time.monotonic() + timeout
    while text not in (shown := path.read_text()):
        assert getattr(up, "running", True), shown
        assert time.monotonic() < deadline, shown
        time.sleep(0.2)
    return shown


@pytest.mark.usefixtures("relocated_data")
def test_up_keeps_its_token_serves_a_login_link_and_the_metrics(tmp_path: Path) -> None:
    state = tmp_path / "state"
    out_path = tmp_path / "up.out"
    with socket.socket() as busy:  # the port asked for is taken: a free one instead, said on screen
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        argv = [sys.executable, "-m", "devsched.client", "up", "--no-demo", "--no-live", "--hosts", "1",
                "--nats-port", "0", "--web-port", str(taken), "--metrics"]  # fmt: skip
        up = up_process(argv, tmp_path, out_path, XDG_STATE_HOME=str(state))
        try:
            shown = wait_for(out_path, "devsched is up.", up)
            assert f"port {taken} is busy: the web dashboard takes a free port instead" in shown
            web = re.search(r"\n  web +(http://127\.0\.0\.1:(\d+)/)\n", shown)
            assert web, shown
            assert int(web.group(2)) != taken
            token_path = state / "devsched" / "web-token"
            assert f"a new dashboard token in {token_path} (there was none)" in shown
            token = token_path.read_text().strip()
            assert token not in shown  # the link carries a code, never the token
            assert stat.S_IMODE(token_path.stat().st_mode) == 0o600
            assert stat.S_IMODE(token_path.parent.stat().st_mode) == 0o700

            link = LINK.search(shown)
            assert link, shown
            assert link.group(0).startswith(web.group(1))
            status, cookie = follow_link(link.group(0))
            assert status == 303
            assert "devsched_session=" in cookie
            assert follow_link(link.group(0))[0] == 403  # once

            metrics = dict(re.findall(r"\n  metrics +(http://127\.0\.0\.1:\d+/metrics)  \((\S+)\)", shown))
            # every service but the dashboard serves /metrics on its health port (and `up` says so of it)
            assert {"scheduler", "sim-1", "sweeper"} <= set(metrics.values()), shown
            if "web" not in metrics.values():
                assert "web serves no /metrics (its probes: http://127.0.0.1:" in shown
            for url, name in metrics.items():
                with urllib.request.urlopen(url, timeout=10) as page:
                    body = page.read().decode()
                assert page.status == 200, name
                assert "# TYPE " in body, (name, body[:500])
                assert "devsched" in body, (name, body[:500])
            assert up.stop(timeout=60) == 0, out_path.read_text()
        finally:
            up.kill()
    assert "Traceback" not in out_path.read_text()

    # the next run reuses the token (a browser's session and bookmark keep working); a rotation replaces it
    argv = ("up", "--exit-when-done", "--no-demo", "--no-live", "--hosts", "1", "--nats-port", "0", "--web-port", "0")
    env = clean_env(COLUMNS="200", XDG_STATE_HOME=str(state))
    again = run_devsched(*argv, cwd=tmp_path, env=env, timeout=150)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "new dashboard token" not in again.stdout
    assert token_path.read_text().strip() == token
    assert "  token     in state/devsched/web-token  (kept for the next runs" in again.stdout  # shown from the cwd

    token_path.chmod(0o644)  # a token others could read is replaced
    rotated = run_devsched(*argv, cwd=tmp_path, env=env, timeout=150)
    assert rotated.returncode == 0, rotated.stdout + rotated.stderr
    assert "(the kept one was readable by others (mode 0644))" in rotated.stdout
    replaced = token_path.read_text().strip()
    assert replaced != token
    assert stat.S_IMODE(token_path.stat().st_mode) == 0o600

    rotated = run_devsched(*argv, "--rotate-web-token", cwd=tmp_path, env=env, timeout=150)
    assert rotated.returncode == 0, rotated.stdout + rotated.stderr
    assert "(--rotate-web-token): earlier logins end" in rotated.stdout
    assert token_path.read_text().strip() not in (token, replaced)

    token_path.parent.chmod(0o777)  # a directory others could write to: refused, nothing started
    refused = run_devsched(*argv, cwd=tmp_path, env=env, timeout=150)
    assert refused.returncode == 2
    assert "writable by others (mode 0777)" in refused.stderr
    assert "devsched is up." not in refused.stdout


@pytest.fixture
def tmux(tmp_path: Path) -> Iterator[str]:
    """A tmux server of this test's own (its own socket), killed afterwards."""
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    socket_path = str(tmp_path / "tmux.sock")
    yield socket_path
    subprocess.run(["tmux", "-S", socket_path, "kill-server"], capture_output=True, timeout=10, check=False)


def capture(socket_path: str, name: str, *, history: bool = False) -> list[str]:
    args = ["tmux", "-S", socket_path, "capture-pane", "-p", "-t", name, *(["-S", "-"] if history else [])]
    return subprocess.run(args, capture_output=True, text=True, timeout=10, check=True).stdout.splitlines()


@pytest.mark.usefixtures("relocated_data")
def test_the_live_view_keeps_the_url_and_a_good_login_link_on_an_80x24_screen(tmp_path: Path, tmux: str) -> None:
    name = f"up-{uuid.uuid4().hex[:6]}"
    done = f"__done_{uuid.uuid4().hex}__"
    up = [sys.executable, "-m", "devsched.client", "up", "--hosts", "2", "--nats-port", "0", "--web-port", "0"]
    # the shell outlives the Ctrl-C sent to the pane's foreground group (`trap` with a command: `up` itself
    # gets the default SIGINT), so the pane stays to be read after `up` ended
    command = f"trap true INT; cd {shlex.quote(str(tmp_path))} && {shlex.join(up)}; echo {done}; sleep 600"
    env = clean_env(XDG_STATE_HOME=str(tmp_path / "state"))
    settings = [f"-e{key}={value}" for key, value in env.items() if key not in ("COLUMNS", "LINES")]
    subprocess.run(
        ["tmux", "-S", tmux, "new-session", "-d", "-s", name, "-x", "80", "-y", "24", *settings,
         "env", "-u", "COLUMNS", "-u", "LINES", "TERM=screen-256color", "sh", "-c", command],
        check=True, timeout=10, env={**env, "TERM": "xterm"},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 150
        # the demo has run a while: its host crash has happened (and scrolled lines past the live view)
        while not any("demo: agent sim-2 restarted" in line for line in capture(tmux, name, history=True)):
            assert time.monotonic() < deadline, "\n".join(capture(tmux, name, history=True))
            time.sleep(0.5)
        time.sleep(3)  # a few more refreshes of the live view
        screen = capture(tmux, name)
        shown = "\n".join(screen)
        assert len(screen) <= 24
        assert all(len(line) <= 80 for line in screen), shown
        web = [line for line in screen if re.fullmatch(r"web   http://127\.0\.0\.1:\d+/ .*", line)]
        assert len(web) == 1, shown
        url = web[0].split()[1]
        login = [line for line in screen if line.startswith("login ")]
        assert len(login) == 1, shown
        link = login[0].removeprefix("login ").strip()
        assert LINK.fullmatch(link), shown  # whole: not cut, not folded
        assert link.startswith(url)
        assert not any(line.rstrip().endswith("...") for line in screen), shown
        assert "Ctrl-C stops everything" in screen[-1] or "Ctrl-C stops everything" in shown
        status, cookie = follow_link(link)  # the link on screen logs in
        assert status == 303, shown
        assert "devsched_session=" in cookie
    finally:
        subprocess.run(["tmux", "-S", tmux, "send-keys", "-t", name, "C-c"], timeout=10, check=False)
        deadline = time.monotonic() + 90
        while not any(done in line for line in capture(tmux, name, history=True)):
            if time.monotonic() > deadline:
                break
            time.sleep(0.5)
    history = "\n".join(capture(tmux, name, history=True))
    assert any(done in line for line in history.splitlines()), history
    assert "Traceback" not in history
