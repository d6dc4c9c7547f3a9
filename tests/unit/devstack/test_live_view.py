"""`devsched up`'s live view keeps the dashboard's URL and login link whole on screen, whatever the height."""

from __future__ import annotations

import io
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest
from rich.console import Console

from devsched.core.status import DeviceState, TaskStatus
from devsched.devstack.dashboard import WebAccess, dashboard
from devsched.devstack.demo import Demo, demo_tasks
from devsched.devstack.layout import sim_hosts
from devsched.protocol import login_links
from devsched.protocol import messages as m

T0 = datetime(2025, 3, 4, 5, 6, 7, tzinfo=UTC)
URL = "http://127.0.0.1:8642/"
WEB = WebAccess(URL, login_links.link(URL, login_links.mint("t" * 32, T0.timestamp())), Path("/state/web-token"))


def hosts() -> list[m.HostView]:
    return [
        m.HostView(
            host_id=h.host_id,
            online=True,
            last_seen_at=T0,
            devices=[
                m.DeviceView(device_id=d.device_id, labels=d.labels, state=DeviceState.AVAILABLE) for d in h.devices
            ],
        )
        for h in sim_hosts(2, 2)
    ]


def tasks(n: int) -> list[m.TaskSummary]:
    fields: dict[str, Any] = {
        "status": TaskStatus.QUEUED,
        "priority": 5,
        "max_attempts": 3,
        "attempt_count": 0,
        "cancel_requested": False,
        "created_at": T0,
        "updated_at": T0,
        "selector": m.Selector(labels={"platform": "sim"}),
        "plan": m.Plan(steps=[m.Step(name="a", action="noop")]),
    }
    return [m.TaskSummary(task_id=uuid.uuid4(), name=f"demo-task-{i}", **fields) for i in range(n)]


def screen(width: int, height: int, **web: Any) -> list[str]:
    demo = Demo(cast(Any, None), sim_hosts(2, 2), cast(Any, None), print, tasks=demo_tasks(sim_hosts(2, 2), "r1"))
    file = io.StringIO()
    console = Console(file=file, width=width, height=height, color_system=None, force_terminal=True)
    console.print(dashboard(hosts(), tasks(12), demo, "Ctrl-C stops everything", height=height, **web))
    return file.getvalue().splitlines()


@pytest.mark.parametrize(("width", "height"), [(80, 24), (120, 40), (80, 12)])
def test_the_url_and_the_login_link_stay_whole_and_the_view_fits(width: int, height: int) -> None:
    lines = screen(width, height, web=WEB)
    assert len(lines) <= height - 1, "\n".join(lines)
    assert all(len(line) <= width for line in lines), "\n".join(lines)
    assert lines[0].startswith(f"web   {URL} "), lines[0]
    assert lines[1] == f"login {WEB.login_link}"
    assert lines[-1] == "Ctrl-C stops everything"
    if height < 40:
        assert "more lines: a taller terminal shows them" in lines[-2]


def test_without_the_dashboard_nothing_is_pinned_but_the_footer() -> None:
    lines = screen(80, 24)
    assert not any("http://" in line for line in lines)
    assert lines[-1] == "Ctrl-C stops everything"
    assert len(lines) <= 23
