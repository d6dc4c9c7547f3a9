"""A host cannot stall the scheduler with a plug-in args schema.

The real scheduler process, behind a nats-server with the deploy accounts (deploy/nats/accounts.conf): each
host speaks through its own account, submitters through the operator user. A hostile host registers, over
and over for a few seconds, each of the schemas that froze an unbounded scheduler
(`support.hostile_schemas`: a self-reference, 25 levels of anyOf/allOf whose references double at each
level, a doubling DAG of definitions, a cycle) and a large, ever-different schema that only the (slow)
metaschema check refuses. Each registration is refused, 400 `invalid_request`, naming
`actions.0.args_schema`, the action and the rule, never the schema's text (or, past the host's fair share of
the scheduler, 429 `too_many_requests`, which the attackers honour so that most reach the schema check).
Meanwhile another host renews its lease every 0.1 s (none lost, p99 under a third of its ttl), another
user's plain submits are answered promptly, and a submit of the action is checked against the honest host's schema only.

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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from support.deploy_lab import deploy_lab
from support.hostile_schemas import ATTACKS
from support.scheduler_harness import ErrorReply, api, call
from support.scheduler_harness import submit as plain_submit
from support.secured_nats import SecuredNats, secured_nats
from support.steady_renewals import renew_until

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


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[SecuredNats]:
    with secured_nats(tmp_path / "nats", hosts=("evil", "steady", "honest", "legacy")) as server:
        yield server


async def test_a_hostile_schema_is_refused_and_stalls_no_one(
    secured: SecuredNats, database_url: str, tmp_path: Path
) -> None:
    log_path = tmp_path / "scheduler.log"
    async with deploy_lab(secured, database_url, log_path) as lab:
        nc, prefix = lab.operator, lab.prefix
        evil, steady, honest = [await lab.host(h) for h in ("evil", "steady", "honest")]
        await honest.request("register", {"devices": [], "actions": [{"name": ACTION, "args_schema": HONEST_SCHEMA}]})
        await steady.register("steady-d1")
        await plain_submit(nc, prefix, selector={"device_id": "steady-d1"}, lease_ttl_s=TTL_S)
        assigned = await steady.next_assignment(timeout=20)
        await steady.claim(assigned)

        refusals: list[ErrorReply] = []
        throttled: list[ErrorReply] = []
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
                    if err.code == "too_many_requests":  # the host's fair share: also a refusal, and paced
                        throttled.append(err)
                        await asyncio.sleep(min(float(err.details.get("retry_after_s", 0.05)), 0.5))
                    else:
                        refusals.append(err)
                else:
                    accepted.append(name)

        submits: list[float] = []

        async def submitter() -> None:
            while time.monotonic() < stop_at:
                started = time.monotonic()
                await plain_submit(nc, prefix, selector={"device_id": "nowhere"})
                submits.append(time.monotonic() - started)
                await asyncio.sleep(0.05)

        checked: list[tuple[float, str]] = []

        async def flash_submitter() -> None:
            """Submits of the action: checked against the honest host's schema, promptly."""
            while time.monotonic() < stop_at:
                started = time.monotonic()
                try:
                    await call(nc, api(prefix, "tasks.submit"), {"plan": flash_plan({"imgae": "x"})})
                except ErrorReply as err:
                    checked.append((time.monotonic() - started, f"{err.status} {err.message}"))
                else:
                    checked.append((time.monotonic() - started, "accepted"))
                await asyncio.sleep(0.1)

        async with asyncio.TaskGroup() as group:  # one failing cancels the others
            for work in (*(attacker() for _ in range(ATTACKERS)), submitter(), flash_submitter()):
                group.create_task(work)
            renewing = group.create_task(
                renew_until(steady, assigned.lease, TTL_S, lambda: time.monotonic() >= stop_at, every_s=RENEW_EVERY_S)
            )

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

        renewed = renewing.result().assert_unaffected("steady host")
        submit_p99 = statistics.quantiles(submits, n=100)[98]
        assert submit_p99 < SUBMIT_P99_S, f"plain submit p99 {submit_p99:.3f} s"
        assert checked, "no submit of the action was answered"
        for elapsed, outcome in checked:
            assert outcome.startswith("400 plan.steps.0.args"), outcome
            assert elapsed < SUBMIT_P99_S * 2, (elapsed, outcome)
        for host_id in ("evil", "steady", "honest"):
            assert lab.violations(host_id) == [], f"{host_id} sent only what its account allows"

        # The scheduler logged each refusal by its rule, never the schema, and never failed.
        text = log_path.read_text()
        assert "registration refused: unusable args schema" in text
        assert "$defs/l1" not in text
        assert '"p0_0"' not in text
        assert "Traceback" not in text
        print(
            f"\n{len(refusals)} hostile registrations refused ({len(throttled)} more throttled) in {ATTACK_S:g} s; "
            f"{renewed}; "
            f"plain submits: {len(submits)}, p99 {submit_p99 * 1000:.1f} ms; "
            f"action submits: {len(checked)}, max {max(e for e, _ in checked) * 1000:.1f} ms"
        )


async def test_a_hostile_schema_an_older_scheduler_stored_is_not_used(
    secured: SecuredNats, database_url: str, tmp_path: Path
) -> None:
    """Stored before the bounds (as an older scheduler did): a submit naming the action is answered at once."""
    admin = await asyncpg.connect(database_url.replace("postgresql+asyncpg://", "postgresql://", 1), timeout=10)
    try:
        async with deploy_lab(secured, database_url, tmp_path / "s.log") as lab:
            legacy = await lab.host("legacy")
            await legacy.request("register", {"devices": [], "actions": [{"name": ACTION}]})
            for attack in ("self_reference", "anyof_nest_false_leaf", "allof_nest_true_leaf"):
                offered = json.dumps([{"name": ACTION, "version": None, "args_schema": ATTACKS[attack]}])
                await admin.execute("UPDATE hosts SET actions = $1::jsonb WHERE host_id = 'legacy'", offered)
                for _ in range(2):  # the first builds (and refuses) the validator; the second finds it refused
                    started = time.monotonic()
                    body = {"plan": flash_plan({"image": "x"})}
                    reply = await call(lab.operator, api(lab.prefix, "tasks.submit"), body, timeout=5)
                    assert time.monotonic() - started < 2.0, attack
                    assert reply["task_id"], attack
            assert lab.scheduler.logged("stored args schema not used")
    finally:
        await admin.close()
