"""What `devsched up` shows: how to reach the stack, and a live view of hosts, tasks and the demo."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console, ConsoleOptions, RenderableType
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

from devsched.client.cli.render import DEVICE_STYLE, literal, status_text, tasks_table, visible
from devsched.core.status import DeviceState
from devsched.devstack.demo import Demo
from devsched.protocol.login_links import LINK_S
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


@dataclass(frozen=True, slots=True)
class WebAccess:
    """How to reach the dashboard: its URL, a one-click login link (good once, for minutes), the token's file."""

    url: str
    login_link: str
    token_path: Path


def _shown(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        home = Path.home()
        return "~/" + str(path.relative_to(home)) if path.is_relative_to(home) else str(path)


def how_to_reach(e: Endpoints, web: WebAccess | None = None, metrics: Mapping[str, str] | None = None) -> str:
    """The banner printed once everything is up: environment, dashboard, metrics endpoints, example commands."""
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
        lines += [
            f"  web       {web.url}",
            f"  log in    {web.login_link}",
            f"            (one click, good once within {LINK_S // 60} minutes; the live view shows a fresh one)",
            f"  token     in {_shown(web.token_path)}  (kept for the next runs; or type it at /login)",
        ]
    for name, url in (metrics or {}).items():
        lines.append(f"  metrics   {url}  ({name})")
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


def web_lines(web: WebAccess) -> list[Text]:
    """The live view's pinned lines: the dashboard's URL and a login link, each whole on one line of 80."""
    first = Text(f"web   {web.url}", no_wrap=True, overflow="crop")
    first.append("   login: one click, once; renewed each minute", style="dim")
    return [first, Text(f"login {web.login_link}", no_wrap=True, overflow="crop")]


@dataclass(frozen=True, slots=True)
class Pinned:
    """Lines pinned at the top and bottom with a body between, all within `height` lines.

    The body is cut (and says how much) rather than the pinned lines: a terminal too short for everything
    still shows the dashboard's URL, which a live view taller than the terminal would lose.
    """

    head: Sequence[RenderableType]
    body: Sequence[RenderableType]
    foot: Sequence[RenderableType]
    height: int

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterator[Segment]:
        """Render head, body and foot to lines, and cut the body's end to fit."""
        free = options.update(height=None)

        def lines(parts: Sequence[RenderableType]) -> list[list[Segment]]:
            return [line for part in parts for line in console.render_lines(part, free, pad=False)]

        head, body, foot = lines(self.head), lines(self.body), lines(self.foot)
        room = max(0, self.height - len(head) - len(foot))
        if len(body) > room:
            cut = len(body) - room + 1
            body = [*body[: max(0, room - 1)], [Segment(f"… {cut} more lines: a taller terminal shows them")]]
            if room == 0:
                body = []
        for line in (*head, *body, *foot):
            yield from line
            yield Segment.line()


def dashboard(
    hosts: Sequence[HostView],
    tasks: Sequence[TaskSummary],
    demo: Demo | None,
    footer: str,
    *,
    height: int = 40,
    web: WebAccess | None = None,
) -> RenderableType:
    """The live view: the dashboard's URL (pinned), hosts, the demo's progress, the newest tasks, a footer line.

    It fits in `height` lines (the terminal's, less the cursor's line): what does not fit is cut from the end
    of the tables, never the pinned lines.
    """
    body: list[RenderableType] = [hosts_line_table(hosts) if hosts else Text("no hosts yet", style="dim")]
    if demo is not None and demo.tasks:
        body.append(demo_table(demo))
    if tasks:
        body.append(tasks_table(tasks, title="newest tasks", short_ids=True))
    else:
        body.append(Text("no tasks yet", style="dim"))
    head = web_lines(web) if web is not None else []
    return Pinned(head, body, [literal(footer, style="dim")], max(1, height - 1))
