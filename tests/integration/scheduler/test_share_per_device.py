"""A host's fair share grows with the devices it registered: a busy host of many devices is not throttled like
a flooding host of one, and a withdrawal (no devices) takes it back to the base share."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from nats.aio.client import Client as NatsClient

from devsched.core.fairshare import ShareLimits
from support.scheduler_harness import ErrorReply, TestHost, delete_streams, running_scheduler, scheduler_settings

pytestmark = pytest.mark.integration


async def test_a_registration_scales_the_hosts_share_by_its_devices(
    database_url: str, nats_url: str, subject_prefix: str, nc: NatsClient, make_host: Callable[..., TestHost]
) -> None:
    settings = scheduler_settings(
        database_url, nats_url, subject_prefix,
        host_max_in_flight=3, host_rate_per_s=0.01, host_burst=4,
        host_max_in_flight_per_device=1, host_rate_per_device_per_s=0.5, host_burst_per_device=2,
    )  # fmt: skip
    try:
        async with running_scheduler(settings) as scheduler:
            big, small = make_host("big"), make_host("small")
            await big.register("b1", "b2", "b3", bind=False)
            await small.register("s1", bind=False)
            admission = scheduler.admission
            assert admission.limits_of("big") == ShareLimits(max_in_flight=6, rate_per_s=1.51, burst=10)
            assert admission.limits_of("small") == ShareLimits(max_in_flight=4, rate_per_s=0.51, burst=6)
            assert admission.limits_of("never-registered") == admission.limits
            # the small host's bucket: 6 at most, one taken by its registration
            codes = []
            for _ in range(8):
                try:
                    await small.request("heartbeat", {})
                    codes.append("ok")
                except ErrorReply as err:
                    codes.append(err.code)
            assert set(codes) == {"ok", "too_many_requests"}, "past its share the small host is refused"
            assert codes.count("ok") <= 5 + 1, "5 tokens left of its 6, and at most one refilled meanwhile"
            await big.register(bind=False)  # a withdrawal
            assert admission.limits_of("big") == admission.limits
    finally:
        await delete_streams(nc, subject_prefix)
