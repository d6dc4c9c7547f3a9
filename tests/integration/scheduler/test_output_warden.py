"""The output rate warden against a real nats-server: it closes only the stream of a host past its share,
replicas agree through the stream itself, and a registration neither reopens a closed stream early nor keeps
it closed late. The clocks are the test's (`now` is a parameter), the streams and the refusals real."""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
from nats.aio.client import Client as NatsClient
from nats.js.errors import APIError

from devsched.core.outputrate import OutputShare
from devsched.protocol.subjects import Subjects
from devsched.scheduler.jetstream import CLOSED_UNTIL, closed_until, ensure_host_streams
from devsched.scheduler.settings import SchedulerSettings
from devsched.scheduler.warden import OutputWarden

pytestmark = pytest.mark.integration

SHARE = OutputShare(records_per_s=10.0, bytes_per_s=1e6, window_s=2.0, cooldown_s=4.0)


class Clock:
    """Wall and monotonic time, moved by the test."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


async def write(nc: NatsClient, subjects: Subjects, host_id: str, records: int) -> int:
    """Publish `records` records on the host's log subject; how many were stored (the rest refused)."""
    js, stored, codes = nc.jetstream(), 0, set[int | None]()
    for _ in range(records):
        try:
            await js.publish(f"{subjects.prefix}.host.{host_id}.log.t.1", b"{}")
            stored += 1
        except APIError as exc:
            codes.add(exc.err_code)
    assert codes <= {10077}, codes
    return stored


async def test_replicas_close_only_the_host_past_its_share_and_open_it_once_after_the_cool_down(
    nc: NatsClient, subject_prefix: str
) -> None:
    subjects = Subjects(subject_prefix)
    settings = SchedulerSettings(subject_prefix=subject_prefix, max_hosts=4, logs_max_bytes=4 << 20)
    js = nc.jetstream()
    clock = Clock()
    replicas = [OutputWarden(js, subjects, SHARE, clock=clock, monotonic=clock) for _ in range(2)]
    try:
        for host_id in ("loud", "calm"):
            await ensure_host_streams(js, subjects, settings, host_id)

        async def pass_all() -> None:
            for warden in replicas:
                await warden.step()

        await pass_all()
        assert await write(nc, subjects, "loud", 25) == 25
        assert await write(nc, subjects, "calm", 15) == 15  # 15 of 20 in a 2 s window: within its share
        clock.now += 1.0
        await pass_all()
        assert [set(w.closed) for w in replicas] == [{"loud"}] * 2, "the second replica finds it closed"
        assert await write(nc, subjects, "loud", 3) == 0, "the loud host's records are refused"
        assert await write(nc, subjects, "calm", 3) == 3, "the other host's are not"
        loud = await js.stream_info(subjects.host_logs_stream("loud"))
        assert closed_until(loud.config) == pytest.approx(clock.now + SHARE.cooldown_s, abs=0.01)
        assert loud.state.messages == 25, "nothing of its own was dropped by the closing"

        # A registration while closed keeps it closed.
        await ensure_host_streams(js, subjects, settings, "loud", now=clock)
        assert await write(nc, subjects, "loud", 1) == 0

        clock.now += SHARE.cooldown_s
        await pass_all()
        assert [w.closed for w in replicas] == [{}] * 2
        loud = await js.stream_info(subjects.host_logs_stream("loud"))
        assert CLOSED_UNTIL not in (loud.config.metadata or {})
        assert (loud.config.discard, loud.config.max_msgs) == ("old", -1), "its limits as before"
        assert await write(nc, subjects, "loud", 5) == 5, "it writes again"
        for _ in range(4):  # quiet within its share: never closed again for what was paid for
            clock.now += 0.5
            await pass_all()
            assert all(not w.closed for w in replicas)

        # A stream left closed past its time (the warden off everywhere) is opened by the registration.
        calm = await js.stream_info(subjects.host_logs_stream("calm"))
        metadata = {**(calm.config.metadata or {}), CLOSED_UNTIL: "1"}
        await js.update_stream(dataclasses.replace(calm.config, discard="new", max_msgs=1, metadata=metadata))
        assert await write(nc, subjects, "calm", 1) == 0
        await ensure_host_streams(js, subjects, settings, "calm", now=clock)
        assert await write(nc, subjects, "calm", 1) == 1
    finally:
        for host_id in ("loud", "calm"):
            for name in (subjects.host_logs_stream(host_id), subjects.host_uploads_stream(host_id)):
                with contextlib.suppress(Exception):
                    await js.delete_stream(name)
