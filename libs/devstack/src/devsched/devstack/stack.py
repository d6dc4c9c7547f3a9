"""`devsched up`: the whole system on one machine, from pip-installed binaries.

In order: lock the data directory; start nats-server (JetStream) and PostgreSQL from `devsched.embedded`
unless `--nats-url`/`--database-url` name real ones; in the embedded Postgres, create the owner,
scheduler and sweeper roles (devsched.store.roles) and the `devsched` database owned by the owner, and
migrate it as the owner; start the scheduler and the sweeper (each as its own role) and one agent per
simulated host as child processes (logs under `<data>/logs/`); wait until the scheduler answers and
every agent has registered; print how to reach it; submit the demo; show live progress until
Ctrl-C/SIGTERM (or, with `--exit-when-done`, until the demo has ended); then stop everything it
started, in reverse order: agents, sweeper and scheduler (by pid, SIGTERM then SIGKILL), Postgres, NATS.

The dashboard listens on 127.0.0.1:8642 (`--web-port`; a free port when that one is taken), behind an
operator token kept across runs (`devsched.devstack.tokens`); the live view keeps its URL and a fresh
one-click login link (`devsched.protocol.login_links`) on screen. With `--metrics` every service serves
`/metrics` on a free loopback port, listed in the banner.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import signal
import socket
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import FrameType

from rich.console import Console
from rich.live import Live

from devsched.client.cli.render import literal
from devsched.client.client import Client
from devsched.core.errors import DevschedError
from devsched.devstack.cli import DEFAULT_WEB_PORT
from devsched.devstack.dashboard import Endpoints, WebAccess, dashboard, demo_table, how_to_reach
from devsched.devstack.demo import Demo
from devsched.devstack.layout import Layout, LockedError, SimHost, sim_hosts
from devsched.devstack.processes import Child, python_module, stop_all
from devsched.devstack.tokens import TokenStoreError, kept_token, state_dir
from devsched.protocol import login_links
from devsched.protocol.messages import HostView, TaskSummary
from devsched.store.roles import ROLES_LOCK, DatabaseRoles, adopt_schema_sql, ensure_roles_sql, quote_ident, role_url

#: Name of the database `up` creates in an embedded Postgres.
DATABASE_NAME = "devsched"
#: Services `up` runs, by module, and the distribution that provides each.
SERVICES = {
    "devsched.scheduler": "devsched-scheduler",
    "devsched.sweeper": "devsched-sweeper",
    "devsched.agent.main": "devsched-agent",
}
#: Heartbeat interval given to the simulated hosts: a crashed one shows offline within 3 of them.
HEARTBEAT_INTERVAL_S = 2.0
#: Seconds the services get to start, register and answer.
READY_TIMEOUT_S = 90.0
#: The user's `DEVSCHED_*` variables the services still get (every other one is the stack's to set): the
#: event loop (`devsched.service.lifecycle`), a choice of the process rather than of the deployment.
_PASSED = frozenset({"DEVSCHED_EVENT_LOOP"})
#: The dashboard's module (optional: `up` runs without it when devsched-web is not installed).
WEB_MODULE = "devsched.web"
#: Restarts of a child that died on its own before `up` gives up.
MAX_RESTARTS = 3
#: Seconds between two login links minted for the live view (each is good once, for `LINK_S`).
LINK_RENEW_S = 60.0


class UpError(Exception):
    """`up` cannot go on; the message is for people, `code` is the exit code."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


class Interrupted(Exception):
    """Ctrl-C or SIGTERM during start-up."""


@dataclass(frozen=True, slots=True)
class UpOptions:
    """Everything `devsched up` can be told (see `devsched up --help`)."""

    data_dir: Path = Path(".devsched")
    hosts: int = 2
    devices_per_host: int = 2
    demo: bool = True
    exit_when_done: bool = False
    nats_url: str | None = None
    database_url: str | None = None
    nats_port: int = 4222
    postgres_port: int = 0
    prefix: str = "devsched"
    creds: Path | None = None
    demo_timeout_s: float = 120.0
    log_level: str = "INFO"
    live: bool | None = None
    #: Throwaway run: Postgres without fsync and JetStream with its default sync; an OS crash may lose
    #: acknowledged work. By default both sync every acknowledged write, as a deployment does.
    fast: bool = False
    #: Start devsched-web on 127.0.0.1 (when installed), actions on behind the kept operator token.
    web: bool = True
    #: Its port (0: any free one; a busy one: a free one instead, said on screen).
    web_port: int = DEFAULT_WEB_PORT
    #: Make a new operator token instead of reusing the kept one.
    rotate_web_token: bool = False
    #: Serve each service's `/metrics` on a free loopback port, listed in the banner.
    metrics: bool = False


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package is missing
        return False


def _free_port(host: str = "127.0.0.1") -> int:
    """A port free now on `host` (the child that is given it binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def _port_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _answers(url: str) -> bool:
    """Whether a GET of `url` (on loopback) answers 200."""
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return bool(reply.status == 200)
    except (OSError, ValueError):
        return False


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """SIGTERM acts like Ctrl-C during the synchronous phases (start-up and shutdown of the servers)."""
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


async def ensure_database(admin_dsn: str, name: str, roles: DatabaseRoles) -> None:
    """Create the roles (idempotent) and the database owned by the owner role, as the superuser.

    A data directory from before the roles existed has its database and tables owned by `postgres`:
    they are handed to the owner, so that its migrations can change them and its grants count.
    """
    import asyncpg  # type: ignore[import-untyped]  # only `up` with an embedded Postgres needs it

    conn = await asyncpg.connect(admin_dsn, timeout=15)
    try:
        async with conn.transaction():  # race-free with another `up` on this server (ensure_roles)
            await conn.execute("SELECT pg_advisory_xact_lock($1)", ROLES_LOCK)
            for statement in ensure_roles_sql(roles):
                await conn.execute(statement)
        if not await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name):
            await conn.execute(f"CREATE DATABASE {quote_ident(name)} OWNER {quote_ident(roles.owner)}")
    finally:
        await conn.close()
    conn = await asyncpg.connect(admin_dsn.rsplit("/", 1)[0] + "/" + name, timeout=15)
    try:
        for statement in adopt_schema_sql(roles):
            await conn.execute(statement)
    finally:
        await conn.close()


@dataclass
class Up:
    """One run of `devsched up`."""

    options: UpOptions
    console: Console
    layout: Layout = field(init=False)
    hosts: list[SimHost] = field(init=False)
    children: dict[str, Child] = field(default_factory=dict)
    started_at: float = field(default_factory=time.monotonic)
    live: Live | None = None
    roles: DatabaseRoles = field(default_factory=DatabaseRoles)
    #: The dashboard's operator token (kept across runs in the state directory) and its file, once known.
    web_token: str = ""
    web_token_path: Path = field(default_factory=Path)
    #: The `/metrics` port of each child, by child name (with `--metrics`).
    metrics_ports: dict[str, int] = field(default_factory=dict)
    #: The login link the live view shows, and when it was minted.
    _link: tuple[str, float] = ("", 0.0)

    def __post_init__(self) -> None:
        self.layout = Layout(self.options.data_dir)
        self.hosts = sim_hosts(self.options.hosts, self.options.devices_per_host)

    # -- output ------------------------------------------------------------------------------------------

    def say(self, message: str) -> None:
        """One progress line (above the live view, when there is one); the server's words in it shown literally."""
        console = self.live.console if self.live is not None else self.console
        line = literal(f"[{time.monotonic() - self.started_at:6.1f}s] {message}")
        console.print(line, highlight=False, soft_wrap=True)

    # -- the synchronous part: servers and database ----------------------------------------------------

    def run(self) -> int:
        """Run until stopped; returns the exit code."""
        missing = [dist for module, dist in SERVICES.items() if not _installed(module)]
        if missing:
            raise UpError(f"`devsched up` runs the services, which are not installed: {', '.join(missing)}", 2)
        try:
            self.roles = DatabaseRoles.from_env()
        except ValueError as exc:
            raise UpError(str(exc), 2) from None
        self.layout.create()
        try:
            self.layout.lock()
        except LockedError as exc:
            raise UpError(str(exc), 1) from None
        if self.options.web and _installed(WEB_MODULE):
            self._keep_token()
        try:
            with sigterm_interrupts(), ExitStack() as servers:
                endpoints = self._start_servers(servers)
                code = asyncio.run(self._serve(endpoints))
                signal.signal(signal.SIGTERM, _raise_interrupt)  # asyncio.run reset it on its way out
                self.say("stopping the servers")
                return code
        except (KeyboardInterrupt, Interrupted):
            self.say("interrupted: stopped everything")
            return 130
        finally:
            self.layout.unlock()

    def _keep_token(self) -> None:
        """The operator token from the state directory (a new one when there is none usable, or rotated)."""
        try:
            kept = kept_token(state_dir(), rotate=self.options.rotate_web_token)
        except TokenStoreError as exc:
            raise UpError(f"cannot keep the dashboard's token: {exc}", 2) from None
        if kept.tightened is not None:
            self.say(kept.tightened)
        if kept.new_because is not None:
            self.say(f"a new dashboard token in {kept.path} ({kept.new_because}): earlier logins end")
        self.web_token, self.web_token_path = kept.token, kept.path
        (self.layout.root / "web-token").unlink(missing_ok=True)  # where a run's token used to be kept

    def _start_servers(self, servers: ExitStack) -> Endpoints:
        o = self.options
        nats_url = o.nats_url
        if nats_url is None:
            from devsched.embedded import NatsServer

            port: int | None = o.nats_port or None
            if port is not None and not _port_free(port):
                self.say(f"port {port} is busy: the embedded NATS takes a free port instead")
                port = None
            nats = NatsServer(self.layout.nats_dir, port=port, sync_always=not o.fast)
            self.say(f"starting NATS (JetStream) on port {nats.port}, data in {self.layout.nats_dir}")
            servers.callback(self._stop_server, "NATS", nats.stop)
            nats.start()
            nats_url = nats.url
        database_url = o.database_url
        if database_url is None:
            from devsched.embedded import PostgresServer
            from devsched.embedded.postgres_server import DURABLE_SETTINGS, FAST_SETTINGS

            pg_port: int | None = o.postgres_port or None
            if pg_port is not None and not _port_free(pg_port):
                self.say(f"port {pg_port} is busy: the embedded Postgres takes a free port instead")
                pg_port = None
            postgres = PostgresServer(
                self.layout.postgres_dir, port=pg_port, settings=FAST_SETTINGS if o.fast else DURABLE_SETTINGS
            )
            if postgres.requested_data_dir is not None:
                self.say(
                    f"PostgreSQL data lives in {postgres.data_dir}: its account cannot reach "
                    f"{postgres.requested_data_dir} (a private directory, left as it is)"
                )
            first = not (postgres.pgdata / "PG_VERSION").exists()
            durability = "fsync off: --fast, an OS crash may lose work" if o.fast else "fsync on"
            self.say(
                f"starting PostgreSQL on port {postgres.port} ({durability})"
                + (" (first run: initdb)" if first else "")
            )
            servers.callback(self._stop_server, "PostgreSQL", postgres.stop)
            postgres.start()
            asyncio.run(ensure_database(postgres.dsn(), DATABASE_NAME, self.roles))
            # migrations (and `devsched migrate` with .devsched/env) as the owner, never the superuser
            database_url = role_url(postgres.url(DATABASE_NAME), self.roles.owner)
        self.say("migrating the database")
        from devsched.store.migrations import upgrade

        try:
            upgrade(database_url, roles=self.roles)
        except Exception as exc:
            raise UpError(f"cannot migrate the database at {database_url}: {type(exc).__name__}: {exc}", 5) from None
        env = {"DEVSCHED_NATS_URL": nats_url, "DEVSCHED_SUBJECT_PREFIX": o.prefix}
        if o.creds is not None:
            env["DEVSCHED_NATS_CREDS"] = str(o.creds)
        self.layout.write_env({**env, "DEVSCHED_DATABASE_URL": database_url})
        return Endpoints(nats_url, database_url, o.prefix, self.layout.root, o.nats_url is None, o.database_url is None)

    def _stop_server(self, name: str, stop: Callable[[], None]) -> None:
        try:
            stop()
        except Exception as exc:  # keep stopping the others
            self.say(f"stopping {name} failed: {exc}")

    # -- the services --------------------------------------------------------------------------------------

    def _env(self, e: Endpoints, *, database: bool) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DEVSCHED_") or k in _PASSED}
        env.update(
            {
                "DEVSCHED_NATS_URL": e.nats_url,
                "DEVSCHED_SUBJECT_PREFIX": e.prefix,
                "DEVSCHED_LOG_LEVEL": self.options.log_level,
                "DEVSCHED_HEARTBEAT_INTERVAL_S": str(HEARTBEAT_INTERVAL_S),
                "PYTHONUNBUFFERED": "1",
            }
        )
        if database:  # a device node never holds database credentials
            env["DEVSCHED_DATABASE_URL"] = e.database_url
        if self.options.creds is not None:
            env["DEVSCHED_NATS_CREDS"] = str(self.options.creds)
        return env

    def _service_env(self, e: Endpoints, service: str) -> dict[str, str]:
        """The environment of `service`: in the embedded Postgres it connects as its own role.

        A `--database-url` is given to both services as it is: its roles are the user's business.
        """
        env = self._env(e, database=True)
        if e.embedded_postgres:
            env["DEVSCHED_DATABASE_URL"] = role_url(e.database_url, self.roles.service(service))
        return env

    def _with_metrics(self, name: str, env: dict[str, str]) -> dict[str, str]:
        """`env` with a `/metrics` port of its own for child `name`, with `--metrics` (else as it is)."""
        if self.options.metrics:
            port = self.metrics_ports[name] = _free_port()
            env = {**env, "DEVSCHED_METRICS_HOST": "127.0.0.1", "DEVSCHED_METRICS_PORT": str(port)}
        return env

    def _web_port(self) -> int:
        port = self.options.web_port
        if port and not _port_free(port):
            self.say(f"port {port} is busy: the web dashboard takes a free port instead (--web-port to choose)")
            return 0
        return port

    def _start_children(self, e: Endpoints) -> None:
        logs = self.layout.logs_dir
        self.children["scheduler"] = Child(
            "scheduler", python_module("devsched.scheduler"),
            self._with_metrics("scheduler", self._service_env(e, "scheduler")), logs / "scheduler.log",
        )  # fmt: skip
        self.children["sweeper"] = Child(
            "sweeper", python_module("devsched.sweeper"),
            self._with_metrics("sweeper", self._service_env(e, "sweeper")), logs / "sweeper.log",
        )  # fmt: skip
        for host in self.hosts:
            config = self.layout.write_agent_config(
                host, nats_url=e.nats_url, prefix=e.prefix, creds=self.options.creds
            )
            self.children[host.host_id] = Child(
                f"agent {host.host_id}",
                python_module("devsched.agent.main", "--config", str(config), "--log-level", self.options.log_level),
                self._with_metrics(host.host_id, self._env(e, database=False)),
                logs / f"agent-{host.host_id}.log",
            )
        if self.options.web and _installed(WEB_MODULE):
            web_env = self._env(e, database=False)
            web_env.update(
                DEVSCHED_WEB_HOST="127.0.0.1",
                DEVSCHED_WEB_PORT=str(self._web_port()),
                DEVSCHED_WEB_ACTIONS="true",
                DEVSCHED_WEB_TOKEN=self.web_token,
            )
            self.children["web"] = Child(
                "web", python_module(WEB_MODULE), self._with_metrics("web", web_env), logs / "web.log"
            )
        elif self.options.web:
            self.say("devsched-web is not installed: no web dashboard")
        for child in self.children.values():
            child.start()
        names = ", ".join(f"{c.name} (pid {c.pid})" for c in self.children.values())
        self.say(f"started {names}; logs in {logs}")

    def _web_access(self) -> WebAccess | None:
        """The dashboard's URL (from its `serving` log line) with a login link minted now, when it runs.

        A new link every `LINK_RENEW_S`: the one on screen is always good (once) for most of `LINK_S`.
        """
        web = self.children.get("web")
        if web is None:
            return None
        urls = [str(line["url"]) for line in web.log_lines() if line.get("msg") == "serving"]
        if not urls:
            return None
        url = urls[-1]  # a restarted dashboard on a free port logs its new one
        link, minted = self._link
        now = time.time()
        if not link or now - minted >= LINK_RENEW_S:
            link = login_links.link(url, login_links.mint(self.web_token, now))
            self._link = (link, now)
        return WebAccess(url, link, self.web_token_path)

    async def _metrics_urls(self) -> dict[str, str]:
        """The `/metrics` URL of each child that serves one, by child name (with `--metrics`).

        Each is asked once: a service whose port serves only the probes is named as such, not listed.
        """
        urls: dict[str, str] = {}
        for name, port in self.metrics_ports.items():
            url = f"http://127.0.0.1:{port}/metrics"
            if await asyncio.to_thread(_answers, url):
                urls[name] = url
            else:
                self.say(f"{name} serves no /metrics (its probes: http://127.0.0.1:{port}/readyz)")
        return urls

    def _agents(self) -> list[Child]:
        return [self.children[h.host_id] for h in self.hosts]

    def _services(self) -> list[Child]:
        return [self.children[name] for name in ("web", "sweeper", "scheduler") if name in self.children]

    def _check_children(self, *, starting: bool) -> None:
        """Restart a child that died on its own (during start-up: give up at once)."""
        for child in self.children.values():
            if child.running:
                continue
            tail = child.tail()
            if starting or child.starts > MAX_RESTARTS:
                raise UpError(f"{child.name} exited with code {child.exit_code}; the end of {child.log_path}:\n{tail}")
            self.say(f"{child.name} exited with code {child.exit_code}: restarting it (see {child.log_path})")
            child.start()

    async def _crash_host(self, host_id: str) -> None:
        child = self.children[host_id]
        pid = child.pid
        child.kill()
        self.say(f"demo: killed the agent of {host_id} (pid {pid}) with SIGKILL; restarting it in 1 s")
        await asyncio.sleep(1.0)
        child.start()
        self.say(f"demo: agent {host_id} restarted (pid {child.pid}); it registers again")

    async def _wait_ready(self, client: Client, stop: asyncio.Event) -> None:
        """Return once the scheduler answers and every agent has registered (during this run)."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        since = datetime.now(UTC) - timedelta(seconds=1)
        while True:
            self._check_children(starting=True)
            if stop.is_set():
                raise Interrupted
            answered, found = False, {}
            with contextlib.suppress(DevschedError):
                found = {h.host_id: h for h in await client.hosts()}
                answered = True
            waiting = [
                h.host_id
                for h in self.hosts
                if not self.children[h.host_id].logged("registered")
                and not ((v := found.get(h.host_id)) is not None and v.online and v.last_seen_at >= since)
            ]
            web = self.children.get("web")
            if web is not None and not web.logged("serving"):
                waiting.append("the web dashboard")
            if answered and not waiting:
                return
            if time.monotonic() > deadline:
                what = ", ".join(waiting) if answered else "the scheduler"
                raise UpError(
                    f"not ready after {READY_TIMEOUT_S:.0f} s: waiting for {what} (logs in {self.layout.logs_dir})"
                )
            await asyncio.sleep(0.2)

    # -- the asynchronous part: services, demo, live view ----------------------------------------------------

    async def _serve(self, e: Endpoints) -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        try:
            self._start_children(e)
            try:
                client = await Client.connect(e.nats_url, prefix=e.prefix, creds=self.options.creds, connect_timeout=15)
            except DevschedError as exc:
                raise UpError(f"cannot connect to NATS: {exc.message}", 5) from None
            async with client:
                await self._wait_ready(client, stop)
                banner = how_to_reach(e, web=self._web_access(), metrics=await self._metrics_urls())
                self.console.print(banner, highlight=False, markup=False, soft_wrap=True)
                return await self._watch(client, stop)
        except Interrupted:
            return 130
        finally:
            await self._stop_children()

    async def _stop_children(self) -> None:
        if not self.children:
            return
        self.say("stopping the agents, then the scheduler and the sweeper")
        for group in (self._agents(), self._services()):
            killed = await asyncio.to_thread(stop_all, group, timeout=20.0)
            if killed:
                self.say(f"killed after the grace period: {', '.join(killed)}")

    async def _watch(self, client: Client, stop: asyncio.Event) -> int:
        o = self.options
        demo: Demo | None = None
        if o.demo:
            demo = Demo(client, self.hosts, self._crash_host, self.say)
            await demo.submit()
        demo_deadline = time.monotonic() + o.demo_timeout_s
        live_mode = self.console.is_terminal if o.live is None else o.live
        footer = "Ctrl-C stops everything" + (" · exits when the demo is done" if o.exit_when_done else "")
        hosts: list[HostView] = []
        tasks: list[TaskSummary] = []
        with contextlib.ExitStack() as stack:
            if live_mode:
                self.live = stack.enter_context(Live(console=self.console, auto_refresh=False, transient=False))
            while not stop.is_set():
                self._check_children(starting=False)
                note = footer
                try:
                    hosts = await client.hosts()
                    tasks = (await client.list_page(limit=12)).tasks
                    if demo is not None:
                        await demo.step()
                except DevschedError as exc:
                    note = f"the scheduler does not answer ({exc.code}); retrying · {footer}"
                if self.live is not None:
                    view = dashboard(hosts, tasks, demo, note, height=self.console.height, web=self._web_access())
                    self.live.update(view, refresh=True)
                if o.exit_when_done and (demo is None or demo.finished or time.monotonic() > demo_deadline):
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=0.5)
            self.live = None
        return self._verdict(demo, stopped=stop.is_set())

    def _verdict(self, demo: Demo | None, *, stopped: bool) -> int:
        if demo is None or not demo.tasks:
            return 0
        self.console.print(demo_table(demo))
        problems = demo.problems()
        unfinished = demo.unfinished()
        if not problems and not unfinished:
            self.say("demo finished as expected: every task ended in its expected state")
            return 0
        for problem in problems:
            self.say(f"demo: NOT as expected: {problem}")
        if unfinished:
            self.say(f"demo: still running: {', '.join(unfinished)}")
        if stopped and not problems:
            return 0  # stopped by the user before the demo ended: nothing went wrong
        return 1 if self.options.exit_when_done or problems else 0


def run_up(options: UpOptions, console: Console | None = None) -> int:
    """Run `devsched up` with `options`; returns the exit code (errors are printed as one line)."""
    console = console or Console(highlight=False)
    up = Up(options, console)
    try:
        return up.run()
    except UpError as exc:
        message, code = str(exc), exc.code
    except Exception as exc:  # a server that did not start (its log tail follows), or a bug
        if os.environ.get("DEVSCHED_DEBUG"):
            raise
        message, code = f"{type(exc).__name__}: {exc}", 1
    first, _, rest = message.partition("\n")
    sys.stderr.write(f"error: {first}\n")
    if rest:
        sys.stderr.write(rest + "\n")
    return code
