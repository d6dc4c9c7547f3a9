"""`devsched-web`'s readiness on its health listener: not ready until NATS, a first snapshot and (with a
token) every logout are there.

(Ready with both: tests/e2e/web/test_web_http.py, against a real nats-server.)"""

from __future__ import annotations

import pytest

from devsched.service.health import HealthServer
from devsched.web.app import add_checks, create_app
from devsched.web.settings import WebSettings

pytestmark = pytest.mark.unit


async def test_not_ready_before_the_lifespan_connected() -> None:
    app = create_app(WebSettings())
    health = HealthServer("127.0.0.1", 0, service="devsched-web")
    add_checks(health, app)
    verdict = await health.readiness.verdict()
    assert not verdict.ready
    assert dict(verdict.failing) == {
        "nats": "not connected yet",
        "snapshot": "not connected yet",
        "sessions": "not connected yet",
    }
