"""`devsched-web` as a process aimed at a running stack, for the dashboard's tests.

`web_process` starts `python -m devsched.web` on a free loopback port against the stack's NATS server and
prefix, waits for its `serving` log line (which names the URL), and stops it by pid afterwards.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from devsched.embedded import ChildProcess
from support.devsched_stack import Stack

#: The operator token the tests log in with (at least 16 characters).
TOKEN = "test-operator-token-0123456789"


@dataclass
class Web:
    """A running dashboard: its base URL and process."""

    url: str
    proc: ChildProcess

    def client(self, **options: object) -> httpx.Client:
        """An HTTP client of the dashboard (no redirects followed unless asked)."""
        return httpx.Client(base_url=self.url, timeout=10.0, **options)  # type: ignore[arg-type]


@contextlib.contextmanager
def web_process(stack: Stack, work_dir: Path, *, name: str = "web", **settings: str) -> Iterator[Web]:
    """The dashboard on a free loopback port; `settings` are `DEVSCHED_WEB_*` values (`web_actions="true"`)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEVSCHED_")}
    env.update(
        DEVSCHED_NATS_URL=stack.nats_url,
        DEVSCHED_SUBJECT_PREFIX=stack.prefix,
        DEVSCHED_WEB_HOST="127.0.0.1",
        DEVSCHED_WEB_PORT="0",
        DEVSCHED_WEB_REFRESH_S="0.5",
        PYTHONUNBUFFERED="1",
    )
    env.update({f"DEVSCHED_{k.upper()}": v for k, v in settings.items()})
    proc = ChildProcess(name, [sys.executable, "-m", "devsched.web"], env, work_dir / f"{name}.log", stop_timeout=10.0)
    proc.start()
    try:
        proc.wait_ready(lambda: proc.logged("serving"), timeout=60, what=f"{name} ('serving')")
        url = next(line["url"] for line in proc.log_lines() if line.get("msg") == "serving")
        yield Web(url.rstrip("/"), proc)
    finally:
        proc.stop()
