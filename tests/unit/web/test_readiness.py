"""`devsched-web`'s readiness (its `/readyz`, on the dashboard and the health listener): not ready until NATS,
a first snapshot and (with a token) every logout are there.

(Ready with both: tests/e2e/web/test_web_http.py, against a real nats-server.)"""

from __future__ import annotations

import pytest

from devsched.service.health import Probes
from devsched.web.app import create_app
from devsched.web.settings import WebSettings

pytestmark = pytest.mark.unit


async def test_not_ready_before_the_lifespan_connected() -> None:
    app = create_app(WebSettings())
    probes = app.state.probes
    assert isinstance(probes, Probes)
    assert probes.readiness.names == ("nats", "snapshot", "sessions")
    verdict = await probes.readiness.verdict()
    assert not verdict.ready
    assert dict(verdict.failing) == {
        "nats": "not connected yet",
        "snapshot": "not connected yet",
        "sessions": "not connected yet",
    }
