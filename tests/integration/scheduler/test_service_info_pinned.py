"""The scheduler's `$SRV.INFO` as it was before the endpoint table, byte for byte (its random id aside)."""

from __future__ import annotations

import hashlib
import json

import pytest
from nats.aio.client import Client as NatsClient

from devsched.scheduler.app import Scheduler

pytestmark = pytest.mark.integration

#: sha256 of the `$SRV.INFO` reply, the test's prefix written `P` and the instance id left out.
INFO_SHA256 = "36ba56447a1ed4e4bdac34e358aa83debd04cc315a185a938afd3fc5cb5a550f"


async def test_service_info_is_unchanged(scheduler: Scheduler, nc: NatsClient, subject_prefix: str) -> None:
    raw = (await nc.request(f"$SRV.INFO.{subject_prefix}-scheduler", b"", timeout=2)).data
    info = json.loads(raw)
    info.pop("id")
    text = json.dumps(info).replace(subject_prefix, "P")
    assert [e["name"] for e in info["endpoints"]][:2] == ["tasks-submit", "tasks-get"]
    digest = hashlib.sha256(text.encode()).hexdigest()
    assert digest == INFO_SHA256, f"$SRV.INFO changed (an endpoint added? then pin {digest}): {text[:2000]}"
