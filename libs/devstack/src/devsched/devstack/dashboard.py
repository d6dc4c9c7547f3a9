"""What `devsched up` shows: how to reach the stack, and a live view of hosts, tasks and the demo."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from devsched.client.cli.render import DEVICE_STYLE, literal, status_text, tasks_table, visible
from devsched.core.status import DeviceState
from devsched.devstack.demo import Demo
from devsched.protocol.messages import HostView, TaskSummary


@dataclass(frozen=True, slots=True)
class Endpoints:
    """Where the stack runs."""

    nats_url: str
    database_url: str
    prefix: str
    data_dir: Path
    embedded_nats: bool
    embedded_postgres: bool


def _shown(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def how_to_reach(e: Endpoints, web: tuple[str, str] | None = None) -> str:
    """The banner printed once everything is up: environment, dashboard (`web`: URL, token), example commands."""
    data = _shown(e.data_dir)
    p = e.prefix
    prefix_flag = "" if p == "devsched" else f" --prefix {p}"
    lines = [
        "devsched is up.",
        f"  NATS      {e.nats_url}" + (" (embedded)" if e.embedded_nats else ""),
        f"  Postgres  {e.database_url}" + (" (embedded)" if e.embedded_postgres else ""),
        f"  prefix    {p}        data and logs: {data}/  (logs in {data}/logs/)",
    ]
    if web is not None:
        url, token = web
        actions = "to cancel, resubmit, drain"
        lines.append(f"  web       {url}  (log in with the token {token} {actions}; also in {data}/web-token)")
    lines += [
        "",
        "In another shell:",
        f"  source {data}/env        # exports DEVSCHED_NATS_URL={e.nats_url}"
        + (f" and DEVSCHED_SUBJECT_PREFIX={p}" if prefix_flag else ""),
        f"  devsched{prefix_flag} hosts",
        f"  devsched{prefix_flag} ls",
        f"  devsched{prefix_flag} submit {data}/examples/hello.yaml --selector platform=sim --wait",
        f"  devsched{prefix_flag} watch <task-id>",
        "With the NATS CLI:",
        f"  nats -s {e.nats_url} micro ls",
        f"  nats -s {e.nats_url} req {p}.api.hosts.list '{{}}'",
        f"  nats -s {e.nats_url} req {p}.api.tasks.list '{{\"limit\": 10}}'",
        f"  nats -s {e.nats_url} sub '{p}.events.>'",
        "Ctrl-C stops everything; a second `devsched up` here reuses the data.",
    ]
    return "\n".join(lines)


def demo_table(demo: Demo) -> Table:
    """One row per demo task: what it shows, the expected end, where it is now."""
    table = Table(title="demo", title_justify="left")
    for column in ("TASK", "SHOWS", "EXPECTED", "NOW", ""):
        table.add_column(column, overflow="fold")
    for task in demo.tasks:
        now: RenderableType = status_text(task.view.status) if task.view is not None else Text("-")
        if not task.finished:
            mark = Text("…", style="dim")
        elif task.problem() is None:
            mark = Text("ok", style="green")
        else:
            mark = literal(task.problem() or "", style="red")
        table.add_row(f"demo-{task.key}", task.shows, status_text(task.expect), now, mark)
    return table


def hosts_line_table(hosts: Sequence[HostView]) -> Table:
    """Hosts, one row each, with their devices' states inline (compact, for the live view)."""
    table = Table(title="hosts", title_justify="left")
    table.add_column("HOST", no_wrap=True)
    table.add_column("ONLINE", no_wrap=True)
    table.add_column("DEVICES", overflow="fold")
    for host in sorted(hosts, key=lambda h: h.host_id):
        devices = Text()
        for i, device in enumerate(sorted(host.devices, key=lambda d: d.device_id)):
            if i:
                devices.append("  ")
            devices.append(visible(f"{device.device_id} "))
            devices.append(str(device.state), style=DEVICE_STYLE.get(DeviceState(device.state), ""))
        online = Text("yes", style="green") if host.online else Text("no", style="red")
        table.add_row(literal(host.host_id), online, devices)
    return table


def dashboard(
    hosts: Sequence[HostView], tasks: Sequence[TaskSummary], demo: Demo | None, footer: str, *, height: int = 40
) -> RenderableType:
    """The live view: hosts, the demo's progress, the newest tasks (as many as fit), and a footer line."""
    parts: list[RenderableType] = [hosts_line_table(hosts) if hosts else Text("no hosts yet", style="dim")]
    used = len(hosts) + 6
    if demo is not None and demo.tasks:
        parts.append(demo_table(demo))
        used += len(demo.tasks) + 5
    room = max(3, height - used - 6)
    if tasks:
        parts.append(tasks_table(tasks[:room], title="newest tasks", short_ids=True))
    else:
        parts.append(Text("no tasks yet", style="dim"))
    parts.append(literal(footer, style="dim"))
    return Group(*parts)
