"""Replies go only to the requester's own inbox: no reply subject a host can name makes anything publish
into a stream or onto another host's subjects.

Two deployments are tried as an attacker would:

- The production one (deploy/nats/accounts.conf: every host a NATS account of its own), with the real
  scheduler process: host `bench-07` sends every request it is allowed to send (its six host endpoints,
  its consumer's JetStream info and pull, an ack) with every reply subject that would hurt someone else if
  it were honoured. The streams' message counts, the other host's consumer and the other host's subjects
  stay exactly as they were.
- A single-account server without permissions (`devsched up`, the tests): the scheduler itself refuses a
  request whose reply is not the requester's inbox, before handling it: no reply, no state change, a
  warning naming the host.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from devsched.client import Client
from devsched.protocol import endpoints
from devsched.protocol.subjects import Subjects
from support.polling import eventually, throughout
from support.scheduler_harness import (
    ServiceProcess,
    TestHost,
    api,
    call,
    delete_streams,
    request_with_reply,
    running_scheduler,
    scheduler_settings,
    service_env,
)
from support.secured_nats import SCHEDULER_SETTINGS, SecuredNats, secured_nats

pytestmark = pytest.mark.security

#: How long a refused or diverted message would take to show up, at most, on loopback.
WATCH_S = 1.5


def harmful_replies(subjects: Subjects, victim: str, task_id: str) -> list[str]:
    """Reply subjects that would hurt someone else if anything were published there."""
    return [
        subjects.assign(victim),  # another host's assignments
        subjects.task_events(task_id),  # a task's event history
        subjects.task_events(uuid.uuid4()),
        subjects.host(victim, "nudge"),  # another host's nudges
        f"_INBOX.{victim}.stolen",  # another host's inbox
        f"$JS.API.STREAM.DELETE.{subjects.events_stream}",
        f"$JS.API.STREAM.PURGE.{subjects.assignments_stream}",
        f"$JS.API.CONSUMER.DELETE.{subjects.assignments_stream}.{subjects.consumer(victim)}",
        subjects.endpoint(endpoints.TASKS_SUBMIT),
        subjects.host(victim, "report"),
        subjects.host(victim, "release"),
    ]


def host_requests(subjects: Subjects, host_id: str, jetstream_api: str) -> list[tuple[str, bytes]]:
    """Every subject a host may publish to, with a body it might send there."""
    stream, consumer = subjects.assignments_stream, subjects.consumer(host_id)
    lease = {"task_id": str(uuid.uuid4()), "attempt": 1, "lease_id": str(uuid.uuid4())}
    register = {"devices": [{"device_id": f"{host_id}-d1", "labels": {"platform": host_id}}], "agent_version": "x"}
    return [
        (subjects.host(host_id, "register"), json.dumps(register).encode()),
        (subjects.host(host_id, "heartbeat"), b"{}"),
        (subjects.host(host_id, "claim"), json.dumps(lease).encode()),
        (subjects.host(host_id, "renew"), json.dumps(lease).encode()),
        (subjects.host(host_id, "report"), json.dumps({**lease, "outcome": "done"}).encode()),
        (subjects.host(host_id, "release"), json.dumps({**lease, "reason": "agent shutting down"}).encode()),
        (f"{jetstream_api}.CONSUMER.INFO.{stream}.{consumer}", b""),
        (f"{jetstream_api}.CONSUMER.MSG.NEXT.{stream}.{consumer}", b'{"batch": 5, "no_wait": true}'),
        (f"$JS.ACK.{stream}.{consumer}.1.999.999.0.0", b"+ACK"),
        (subjects.host_log(host_id, uuid.uuid4(), 1), b"{}"),  # step output: stored, acknowledged to the reply
    ]


async def snapshot(js: JetStreamContext, subjects: Subjects, victim: str) -> dict[str, Any]:
    """What must not change: the streams' messages and the victim's consumer."""
    assignments = await js.stream_info(subjects.assignments_stream)
    events = await js.stream_info(subjects.events_stream)
    consumer = await js.consumer_info(subjects.assignments_stream, subjects.consumer(victim))
    return {
        "assignments": (assignments.state.messages, assignments.state.last_seq),
        "events": (events.state.messages, events.state.last_seq),
        "victim_consumer": (consumer.num_pending, consumer.num_ack_pending, consumer.delivered.stream_seq),
    }


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[SecuredNats]:
    with secured_nats(tmp_path / "nats") as server:
        yield server


@pytest.mark.e2e
async def test_no_reply_a_host_names_lands_in_a_stream_or_on_another_host_with_the_deploy_accounts(
    secured: SecuredNats, database_url: str, tmp_path: Path
) -> None:
    subjects = Subjects("devsched")
    env = service_env(
        database_url, secured.url("scheduler"), "devsched", heartbeat_interval_s=1.0, **SCHEDULER_SETTINGS
    )
    scheduler = ServiceProcess("devsched.scheduler", env, tmp_path / "scheduler.log").start()
    violations: list[str] = []

    async def on_error(exc: Exception) -> None:
        violations.append(str(exc))

    connections: list[NatsClient] = []
    try:
        await scheduler.wait_logged("serving")
        attacker = await nats.connect(secured.url("bench-07"), inbox_prefix="_INBOX.bench-07", error_cb=on_error)
        victim = await nats.connect(secured.url("bench-08"), inbox_prefix="_INBOX.bench-08", error_cb=on_error)
        operator = await nats.connect(secured.url("operator"))
        connections += [attacker, victim, operator]
        for host_id, nc in (("bench-07", attacker), ("bench-08", victim)):
            register = host_requests(subjects, host_id, subjects.host_jetstream_api)[0]
            reply = await nc.request(*register, timeout=10)
            assert not (reply.headers or {}).get("Nats-Service-Error-Code"), reply.data
        # the victim hears everything addressed to it
        heard: list[Msg] = []

        async def hear(msg: Msg) -> None:
            heard.append(msg)

        await victim.subscribe(subjects.host("bench-08", "nudge"), cb=hear)
        await victim.subscribe("_INBOX.bench-08.>", cb=hear)
        await victim.flush()
        # work in both streams: a task for the attacker's device (an assignment, events)
        async with await Client.connect(secured.url("operator"), timeout=5) as client:
            submitted = await client.submit(
                {"steps": [{"name": "n", "action": "noop", "args": {}}]}, selector={"platform": "bench-07"}
            )
        js = operator.jetstream()
        attacker_consumer = subjects.consumer("bench-07")

        async def assigned() -> bool:
            info = await js.consumer_info(subjects.assignments_stream, attacker_consumer)
            return info.num_pending >= 1

        await eventually(assigned, timeout=20, message="the attacker's task is assigned")
        before = await snapshot(js, subjects, "bench-08")
        assert before["events"][0] >= 2  # submitted, assigned

        replies = harmful_replies(subjects, "bench-08", str(submitted.task_id))
        requests = host_requests(subjects, "bench-07", subjects.host_jetstream_api)
        for subject, body in requests:
            for reply in replies:
                await attacker.publish(subject, body, reply=reply)
        await attacker.flush()
        # everything the attacker sent has been handled once its next request is answered
        await attacker.request(*requests[1], timeout=10)

        async def unchanged() -> bool:
            return await snapshot(js, subjects, "bench-08") == before and not heard

        await throughout(unchanged, seconds=WATCH_S, message="streams, the victim's consumer and subjects unchanged")
        assert violations == [], "the attacker used only subjects it is allowed"
        async with await Client.connect(secured.url("operator"), timeout=5) as client:
            page = await client.list_page()
        assert [t.task_id for t in page.tasks] == [submitted.task_id], "no request reached the submit endpoint"
        assert "permissions violation" not in scheduler.log_path.read_text().lower()
    finally:
        for nc in connections:
            await nc.close()
        scheduler.stop()


@pytest.mark.e2e
async def test_a_host_releases_only_its_own_attempts_and_hears_only_its_own_drain_with_the_deploy_accounts(
    secured: SecuredNats, database_url: str, tmp_path: Path
) -> None:
    subjects = Subjects("devsched")
    env = service_env(
        database_url, secured.url("scheduler"), "devsched", heartbeat_interval_s=1.0, **SCHEDULER_SETTINGS
    )
    scheduler = ServiceProcess("devsched.scheduler", env, tmp_path / "scheduler.log").start()
    violations: list[str] = []

    async def on_error(exc: Exception) -> None:
        violations.append(str(exc))

    connections: list[NatsClient] = []
    try:
        await scheduler.wait_logged("serving")
        owner = await nats.connect(secured.url("bench-07"), inbox_prefix="_INBOX.bench-07", error_cb=on_error)
        neighbour = await nats.connect(secured.url("bench-08"), inbox_prefix="_INBOX.bench-08", error_cb=on_error)
        connections += [owner, neighbour]
        for host_id, nc in (("bench-07", owner), ("bench-08", neighbour)):
            register = host_requests(subjects, host_id, subjects.host_jetstream_api)[0]
            reply = await nc.request(*register, timeout=10)
            assert not (reply.headers or {}).get("Nats-Service-Error-Code"), reply.data
        notices: dict[str, list[Msg]] = {"bench-07": [], "bench-08": []}
        for host_id, nc in (("bench-07", owner), ("bench-08", neighbour)):

            async def hear(msg: Msg, host_id: str = host_id) -> None:
                notices[host_id].append(msg)

            await nc.subscribe(subjects.host(host_id, "nudge"), cb=hear)
            await nc.flush()
            await nc.flush()
        async with await Client.connect(secured.url("operator"), timeout=5) as client:
            submitted = await client.submit(
                {"steps": [{"name": "n", "action": "noop", "args": {}}]},
                selector={"platform": "bench-07"},
                max_attempts=1,
            )
        js = owner.jetstream(prefix=subjects.host_jetstream_api)
        pull = await js.pull_subscribe_bind(durable=subjects.consumer("bench-07"), stream=subjects.assignments_stream)
        (msg,) = await pull.fetch(1, timeout=10)
        assignment = json.loads(msg.data)
        await msg.ack()
        lease = {k: assignment[k] for k in ("task_id", "attempt", "lease_id")}
        release = json.dumps({**lease, "reason": "agent shutting down"}).encode()

        # the neighbour cannot even send on the owner's subject, and on its own it is not the lease's owner
        await neighbour.publish(subjects.host("bench-07", "release"), release)
        await neighbour.flush()
        await eventually(lambda: bool(violations), message="the server refuses the neighbour's publish")
        assert "devsched.host.bench-07.release" in violations[0].lower()
        foreign = await neighbour.request(subjects.host("bench-08", "release"), release, timeout=10)
        assert (foreign.headers or {}).get("Nats-Service-Error-Code") == "409"
        assert json.loads(foreign.data)["error"]["code"] == "lease_foreign"

        answer = await owner.request(subjects.host("bench-07", "release"), release, timeout=10)
        assert not (answer.headers or {}).get("Nats-Service-Error-Code"), answer.data
        assert json.loads(answer.data)["status"] == "queued"

        async with await Client.connect(secured.url("operator"), timeout=5) as client:
            view = await client.get(submitted.task_id)
            assert (view.attempts[0].status, view.releases) == ("released", 1)
            drained = await client.drain_host("bench-07", reason="kernel update")
            assert {d.state for d in drained.devices} == {"drained"}
        await eventually(lambda: bool(notices["bench-07"]), timeout=10, message="the owner hears its drain notice")
        assert json.loads(notices["bench-07"][0].data) == {"drain": True, "reason": "kernel update"}
        await throughout(lambda: not notices["bench-08"], seconds=WATCH_S, message="the neighbour hears nothing")
        assert len(violations) == 1, violations
    finally:
        for nc in connections:
            await nc.close()
        scheduler.stop()


@pytest.mark.integration
async def test_the_scheduler_answers_a_host_only_in_its_own_inbox_and_handles_nothing_else(
    database_url: str, nats_url: str, subject_prefix: str, nc: NatsClient, caplog: pytest.LogCaptureFixture
) -> None:
    subjects = Subjects(subject_prefix)
    settings = scheduler_settings(database_url, nats_url, subject_prefix)
    caplog.set_level(logging.WARNING, logger="devsched.scheduler.admission")
    async with running_scheduler(settings):
        try:
            victim = TestHost(nc, subject_prefix, "victim")
            await victim.register("victim-d1")
            task_id = str(uuid.uuid4())
            replies = [r for r in harmful_replies(subjects, "victim", task_id) if not r.startswith("$JS.API")]
            replies += ["_INBOX.not-the-host.x", "_INBOX.attacker", "_INBOX.attacker.>"]
            heard: list[Msg] = []

            async def hear(msg: Msg) -> None:
                heard.append(msg)

            for reply in replies:
                if "*" not in reply and ">" not in reply:
                    await nc.subscribe(reply, cb=hear)
            await nc.flush()
            js = nc.jetstream()
            before = await snapshot(js, subjects, "victim")
            for subject, body in host_requests(subjects, "attacker", "$JS.API")[:6]:
                for reply in replies:
                    await nc.publish(subject, body, reply=reply)
            await nc.flush()

            # a request from the attacker's own inbox is served: the earlier ones had their turn
            await call(nc, api(subject_prefix, "hosts.list"), {})
            await throughout(
                lambda: not heard, seconds=WATCH_S, message="nothing published on the reply subjects named"
            )
            assert await snapshot(js, subjects, "victim") == before
            hosts = await call(nc, api(subject_prefix, "hosts.list"), {})
            assert [h["host_id"] for h in hosts["hosts"]] == ["victim"], "the refused registration changed nothing"
            refusals = [r for r in caplog.records if r.name == "devsched.scheduler.admission"]
            assert refusals, "each refusal is logged"
            assert all(r.__dict__.get("host_id") == "attacker" for r in refusals)
            assert "not the host's inbox" in refusals[0].getMessage()
        finally:
            await delete_streams(nc, subject_prefix)


@pytest.mark.integration
async def test_operator_endpoints_answer_only_an_operator_inbox(
    database_url: str, nats_url: str, subject_prefix: str, nc: NatsClient, caplog: pytest.LogCaptureFixture
) -> None:
    subjects = Subjects(subject_prefix)
    settings = scheduler_settings(database_url, nats_url, subject_prefix)
    caplog.set_level(logging.WARNING, logger="devsched.scheduler.admission")
    async with running_scheduler(settings):
        try:
            heard: list[Msg] = []

            async def hear(msg: Msg) -> None:
                heard.append(msg)

            targets = [subjects.assign("h1"), subjects.task_events(uuid.uuid4()), subjects.host("h1", "nudge")]
            for target in targets:
                await nc.subscribe(target, cb=hear)
            await nc.flush()
            body = json.dumps(
                {"plan": {"steps": [{"name": "n", "action": "noop", "args": {}}]}, "idempotency_key": "evil"}
            ).encode()
            for target in targets:
                await nc.publish(subjects.endpoint(endpoints.TASKS_SUBMIT), body, reply=target)
                await nc.publish(subjects.endpoint(endpoints.HOSTS_LIST), b"{}", reply=target)
            await nc.publish(subjects.endpoint(endpoints.TASKS_SUBMIT), body)  # no reply at all: not a request either
            await nc.flush()
            listed = await call(nc, subjects.endpoint(endpoints.TASKS_LIST), {})
            await throughout(lambda: not heard, seconds=WATCH_S, message="nothing published on the reply subjects")
            assert listed["tasks"] == [], "no refused submit created a task"
            assert (await call(nc, subjects.endpoint(endpoints.TASKS_LIST), {}))["tasks"] == []
            refusals = [r for r in caplog.records if r.name == "devsched.scheduler.admission"]
            assert refusals
            assert "not an operator inbox" in refusals[0].getMessage()
            # an operator's own inbox is answered as ever
            reply = await request_with_reply(nc, subjects.endpoint(endpoints.HOSTS_LIST), b"{}", "_INBOX.operator-1.x")
            assert json.loads(reply.data)["hosts"] == []
        finally:
            await delete_streams(nc, subject_prefix)
