"""`devsched-web`: serve the dashboard.

    devsched-web --nats-url nats://... --web-host 0.0.0.0 --web-port 8080
    devsched-web --check-config     # check the settings, their files and NATS; exit

Every setting is an environment variable `DEVSCHED_<NAME>` and a flag `--<name>` (see `--help`); the
dashboard's own are `DEVSCHED_WEB_*` (`devsched.web.settings`). It logs `serving` with its URL once it
listens.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Sequence

import uvicorn

from devsched.service import EventLoopError, configure_logging, parse_settings, run_loop
from devsched.service.preflight import check_config
from devsched.web.app import allowed_hosts, create_app
from devsched.web.settings import WebSettings

log = logging.getLogger("devsched.web")


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point; returns the exit code."""
    settings, options = parse_settings(
        WebSettings,
        argv,
        prog="devsched-web",
        description="devsched-web: the dashboard, an operator client over NATS.",
    )
    if options.check_config:
        return check_config("devsched-web", settings)
    configure_logging(settings.log_level, service="devsched-web")
    family = socket.AF_INET6 if ":" in settings.web_host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((settings.web_host, settings.web_port))
    port = sock.getsockname()[1]
    host = f"[{settings.web_host}]" if family == socket.AF_INET6 else settings.web_host
    proxies = settings.web_forwarded_allow_ips.strip()
    config = uvicorn.Config(
        create_app(settings, port=port),
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=2,
        # X-Forwarded-Proto/-For only from the proxies named (never uvicorn's default of 127.0.0.1)
        proxy_headers=bool(proxies),
        forwarded_allow_ips=proxies or "",
    )
    server = uvicorn.Server(config)

    async def serve() -> bool:
        serving = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not serving.done():  # noqa: ASYNC110 - uvicorn has no "listening" event
            await asyncio.sleep(0.05)
        if server.started:
            names = [e.name if e.port is None else f"{e.name}:{e.port}" for e in allowed_hosts(settings, port)]
            log.info(
                "serving",
                extra={"url": f"http://{host}:{port}/", "actions": settings.web_actions, "allowed_hosts": names},
            )
        await serving
        return server.started

    # uvicorn stops on SIGTERM/SIGINT; a lifespan that failed (NATS unreachable) never started serving
    try:
        return 0 if run_loop(serve()) else 1
    except EventLoopError as exc:
        log.error("%s", exc)
        return 2
