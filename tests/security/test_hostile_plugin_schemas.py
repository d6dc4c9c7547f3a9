"""A host cannot stall the scheduler with a plug-in args schema.

The real scheduler process. A hostile host registers, over and over for a few seconds, each of the
schemas that froze an unbounded scheduler (`support.hostile_schemas`: a self-reference, 25 levels of
anyOf/allOf whose references double at each level, a doubling DAG of definitions, a cycle) and a large,
ever-different schema that only the (slow) metaschema check refuses. Each registration is refused, 400
`invalid_request`, naming `actions.0.args_schema`, the action and the rule, never the schema's text.
Meanwhile another host renews its lease every 0.1 s (none lost, p99 under a third of its ttl), another
user's plain submits are answered promptly, and a submit of the action is checked against the honest
host's schema only.

Then the attack an older scheduler let in: a hostile schema already stored for a host (written into the
database as that scheduler did). A submit naming the action is answered at once, never a 500, and the
schema is not used (the agent checks those args).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import statistics
import time
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from nats.aio.client import Client as NatsClient

from support.hostile_schemas import ATTACKS
from support.scheduler_harness import ErrorReply, TestHost, api, call, delete_streams, scheduler_process, service_env
from support.scheduler_harness import submit as plain_submit

pytestmark = [pytest.mark.security, pytest.mark.e2e]

#: The steady host's lease: renewed every RENEW_EVERY_S, so it may wait at most TTL_S / 3 for an answer.
TTL_S = 3
RENEW_EVERY_S = 0.1
#: How long the hostile host keeps registering, and with how many registrations in flight.
ATTACK_S = 4.0
ATTACKERS = 4
#: Longest a plain submit (no plug-in action) may take while the attack runs.
SUBMIT_P99_S = 1.0
ACTION = "flash"
HONEST_SCHEMA = {
    "type": "object",
    "properties": {"image": {"type": "string", "minLength": 1}},
    "required": ["image"],
    "additionalProperties": False,
}


def invalid_big(n: int) -> dict[str, Any]:
    """About 12 KB of properties, within every bound, different each time (no cache helps), and one
    `minLength` the metaschema refuses at the end: the slowest refusal a host can ask for."""
    properties = {f"p{n}_{i}": {"type": "string", "maxLength": 10, "description": "x" * 40} for i in range(150)}
    return {"type": "object", "properties": properties | {"last": {"minLength": -1}}}


def registration(schema: dict[str, Any]) -> dict[str, Any]:
    return {"devices": [], "agent_version": "hostile", "actions": [{"name": ACTION, "args_schema": schema}]}


def flash_plan(args: dict[str, Any]) -> dict[str, Any]:
    return {"steps": [{"name": "f", "action": ACTION, "args": args}]}


async def test_a_hostile_schema_is_refused_and_stalls_no_one(
    database_url: str, nats_url: str, subject_prefix: str, nc: NatsClient, tmp_path: Path
) -> None:
    log_path = tmp_path / "scheduler.log"
    scheduler = scheduler_process(service_env(database_url, nats_url, subject_prefix), log_path).start()
    evil, steady, honest = (TestHost(nc, subject_prefix, h) for h in ("evil", "steady", "honest"))
    try:
        await scheduler.wait_logged("serving")
        await honest.request("register", {"devices": [], "actions": [{"name": ACTION, "args_schema": HONEST_SCHEMA}]})
        await steady.register("steady-d1")
        await plain_submit(nc, subject_prefix, selector={"device_id": "steady-d1"}, lease_ttl_s=TTL_S)
        assigned = await steady.next_assignment(timeout=20)
        await steady.claim(assigned)

        refusals: list[ErrorReply] = []
        accepted: list[str] = []
        stop_at = time.monotonic() + ATTACK_S
        schemas = itertools.cycle([*ATTACKS.items(), ("invalid_big", None)])
        numbers = itertools.count()

        async def attacker() -> None:
            while time.monotonic() < stop_at:
                name, schema = next(schemas)
                try:
                    await evil.request("register", registration(schema or invalid_big(next(numbers))))
                except ErrorReply as err:
                    refusals.append(err)
                else:
                    accepted.append(name)

        renewals: list[float] = []
        renewal_failures: list[str] = []

        async def renewer() -> None:
            while time.monotonic() < stop_at:
                started = time.monotonic()
                try:
                    await call(nc, steady.subject("renew"), assigned.lease, timeout=TTL_S)
                except Exception as exc:  # a 409 or no answer within the ttl: the lease is at risk
                    renewal_failures.append(repr(exc))
                renewals.append(time.monotonic() - started)
                await asyncio.sleep(max(0.0, RENEW_EVERY_S - (time.monotonic() - started)))

        submits: list[float] = []

        async def submitter() -> None:
            while time.monotonic() < stop_at:
                started = time.monotonic()
                await plain_submit(nc, subject_prefix, selector={"device_id": "nowhere"})
                submits.append(time.monotonic() - started)
                await asyncio.sleep(0.05)

        checked: list[tuple[float, str]] = []

        async def flash_submitter() -> None:
            """Submits of the action: checked against the honest host's schema, promptly."""
            while time.monotonic() < stop_at:
                started = time.monotonic()
                try:
                    await call(nc, api(subject_prefix, "tasks.submit"), {"plan": flash_plan({"imgae": "x"})})
                except ErrorReply as err:
                    checked.append((time.monotonic() - started, f"{err.status} {err.message}"))
                else:
                    checked.append((time.monotonic() - started, "accepted"))
                await asyncio.sleep(0.1)

        async with asyncio.TaskGroup() as group:  # one failing cancels the others
            for work in (*(attacker() for _ in range(ATTACKERS)), renewer(), submitter(), flash_submitter()):
                group.create_task(work)

        assert accepted == [], f"hostile schemas registered: {accepted}"
        assert len(refusals) >= 2 * len(ATTACKS), len(refusals)
        for err in refusals:
            assert (err.status, err.code) == (400, "invalid_request"), err
            assert [e["path"] for e in err.details["errors"]] == ["actions.0.args_schema"], err.details
            assert err.message.startswith(f"actions.0.args_schema: args schema of {ACTION} "), err.message
            assert "$defs/l" not in err.message
        rules = {err.message.split(f"of {ACTION} ", 1)[1] for err in refusals}
        assert any("cycle" in r for r in rules), rules
        assert any("subschemas with its references inlined" in r for r in rules), rules
        assert any("not a valid JSON Schema" in r for r in rules), rules

        assert renewal_failures == [], renewal_failures[:5]
        renew_p99 = statistics.quantiles(renewals, n=100)[98]
        assert renew_p99 < TTL_S / 3, f"steady host's renewal p99 {renew_p99:.3f} s"
        submit_p99 = statistics.quantiles(submits, n=100)[98]
        assert submit_p99 < SUBMIT_P99_S, f"plain submit p99 {submit_p99:.3f} s"
        assert checked, "no submit of the action was answered"
        for elapsed, outcome in checked:
            assert outcome.startswith("400 plan.steps.0.args"), outcome
            assert elapsed < SUBMIT_P99_S * 2, (elapsed, outcome)

        # The scheduler logged each refusal by its rule, never the schema, and never failed.
        text = log_path.read_text()
        assert "registration refused: unusable args schema" in text
        assert "$defs/l1" not in text
        assert '"p0_0"' not in text
        assert "Traceback" not in text
        print(
            f"\n{len(refusals)} hostile registrations refused in {ATTACK_S:g} s; "
            f"steady host: {len(renewals)} renewals, "
            f"p50 {statistics.median(renewals) * 1000:.1f} ms, p99 {renew_p99 * 1000:.1f} ms, "
            f"max {max(renewals) * 1000:.1f} ms; plain submits: {len(submits)}, p99 {submit_p99 * 1000:.1f} ms; "
            f"action submits: {len(checked)}, max {max(e for e, _ in checked) * 1000:.1f} ms"
        )
    finally:
        for host in (evil, steady, honest):
            await host.close()
        scheduler.kill()
        await delete_streams(nc, subject_prefix)


async def test_a_hostile_schema_an_older_scheduler_stored_is_not_used(
    database_url: str, nats_url: str, subject_prefix: str, nc: NatsClient, tmp_path: Path
) -> None:
    """Stored before the bounds (as an older scheduler did): a submit naming the action is answered at once."""
    scheduler = scheduler_process(service_env(database_url, nats_url, subject_prefix), tmp_path / "s.log").start()
    legacy = TestHost(nc, subject_prefix, "legacy")
    admin = await asyncpg.connect(database_url.replace("postgresql+asyncpg://", "postgresql://", 1), timeout=10)
    try:
        await scheduler.wait_logged("serving")
        await legacy.request("register", {"devices": [], "actions": [{"name": ACTION}]})
        for attack in ("self_reference", "anyof_nest_false_leaf", "allof_nest_true_leaf"):
            offered = json.dumps([{"name": ACTION, "version": None, "args_schema": ATTACKS[attack]}])
            await admin.execute("UPDATE hosts SET actions = $1::jsonb WHERE host_id = 'legacy'", offered)
            for _ in range(2):  # the first builds (and refuses) the validator; the second finds it refused
                started = time.monotonic()
                body = {"plan": flash_plan({"image": "x"})}
                reply = await call(nc, api(subject_prefix, "tasks.submit"), body, timeout=5)
                assert time.monotonic() - started < 2.0, attack
                assert reply["task_id"], attack
        assert scheduler.logged("stored args schema not used")
    finally:
        await admin.close()
        await legacy.close()
        scheduler.kill()
        await delete_streams(nc, subject_prefix)
