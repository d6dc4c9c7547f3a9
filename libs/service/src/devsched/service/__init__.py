"""devsched.service: plumbing shared by the control-plane services (never imported by libraries)."""

from devsched.service.connection import Stopped, close_nats, connect_nats, flush_subscriptions
from devsched.service.flags import CommandLine, parse_settings
from devsched.service.health import HealthServer, NotReady, check_nats, serving_health
from devsched.service.heap import settle_heap
from devsched.service.lifecycle import EVENT_LOOP_ENV, Backoff, EventLoopError, event_loop, run, run_loop, sleep_or_stop
from devsched.service.logs import bind, configure_logging
from devsched.service.settings import ServiceSettings, SettingsError
from devsched.service.tracing import exporting_spans, mark_idle, setup_tracing, shutdown_tracing

__all__ = [
    "EVENT_LOOP_ENV",
    "Backoff",
    "CommandLine",
    "EventLoopError",
    "HealthServer",
    "NotReady",
    "ServiceSettings",
    "SettingsError",
    "Stopped",
    "bind",
    "check_nats",
    "close_nats",
    "configure_logging",
    "connect_nats",
    "event_loop",
    "exporting_spans",
    "flush_subscriptions",
    "mark_idle",
    "parse_settings",
    "run",
    "run_loop",
    "serving_health",
    "settle_heap",
    "setup_tracing",
    "shutdown_tracing",
    "sleep_or_stop",
]
