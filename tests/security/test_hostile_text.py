"""Hostile text at the edge: what the store cannot keep, or keep indexed, is refused before it reaches it.

Against the real scheduler process, behind a nats-server with the deploy accounts
(deploy/nats/accounts.conf): a submitter or operator sends through the operator user, a host through its own
account. A NUL (`\\u0000`), a lone surrogate (`\\ud800`) or an oversize value in each free-text field a client
or a host sends is answered 400 `invalid_request` naming the field, and nothing changed (no task created,
the claimed attempt still active, the registration as it was); an honest host's work goes on, and another
host renews its lease all along (none lost, p99 under a third of its ttl). Every refusal's log line names
code, status and field paths: a recognisable secret sent through every refusal path reachable appears in no
line of the scheduler's log.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client as NatsClient

from support.deploy_lab import DeployLab, deploy_lab
from support.scheduler_harness import ErrorReply, TestHost, api, call, check, get_task, plan, raw_request, submit
from support.secured_nats import SecuredNats, secured_nats
from support.steady_renewals import renew_until

pytestmark = [pytest.mark.security, pytest.mark.e2e]

#: A value no log line may ever hold: it stands for a token a user pasted where it did not belong.
SECRET = "s3cr3t-" + uuid.uuid4().hex

#: Each hostile kind: how it replaces the `@` marker in a JSON body (raw JSON text).
KINDS: dict[str, Callable[[str], str]] = {
    "nul": lambda body: body.replace("@", "\\u0000" + SECRET),
    "surrogate": lambda body: body.replace("@", SECRET + "\\ud800"),
    "oversize": lambda body: body.replace("@", SECRET + "x" * 70_000),  # above every bound, 64 KiB of metadata too
}


#: The host that sends hostile text, and another that renews its lease meanwhile.
CARELESS, STEADY = "careless", "steady"
TTL_S = 3


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[SecuredNats]:
    with secured_nats(tmp_path / "nats", hosts=(CARELESS, STEADY)) as server:
        yield server


async def refused(lab: DeployLab, host: TestHost, subject: str, raw: str) -> ErrorReply:
    """Send `raw` as the deploy's party for `subject` (the host through its account, else the operator user):
    the scheduler's error reply."""
    nc = host.nc if subject.startswith(host.subject("")) else lab.operator
    msg = await raw_request(nc, subject, raw.encode())
    with pytest.raises(ErrorReply) as err:
        check(msg)
    return err.value


async def task_count(nc: NatsClient, prefix: str) -> int:
    return len((await call(nc, api(prefix, "tasks.list"), {"limit": 1000}))["tasks"])


async def test_unstorable_or_oversize_text_is_refused_naming_the_field_and_nothing_changes(
    secured: SecuredNats, database_url: str, tmp_path: Path
) -> None:
    async with deploy_lab(secured, database_url, tmp_path / "scheduler.log") as lab:
        nc, prefix = lab.operator, lab.prefix
        host, steady = await lab.host(CARELESS), await lab.host(STEADY)
        await steady.register("steady-d1")
        await submit(nc, prefix, selector={"device_id": "steady-d1"}, lease_ttl_s=TTL_S)
        steady_assigned = await steady.next_assignment(timeout=20)
        await steady.claim(steady_assigned)
        done = asyncio.Event()
        renewing = asyncio.create_task(renew_until(steady, steady_assigned.lease, TTL_S, done.is_set))
        try:
            await attack_with_hostile_text(lab, host)
        finally:
            done.set()
        print("\n" + (await renewing).assert_unaffected("steady host"))
        # And nothing of the hostile values reached a log line.
        assert SECRET not in lab.scheduler.log_text(), "a submitted value was logged"
        for host_id in (CARELESS, STEADY):
            assert lab.violations(host_id) == [], f"{host_id} sent only what its account allows"


async def attack_with_hostile_text(lab: DeployLab, host: TestHost) -> None:
    """Every field's hostile text refused, naming the field; nothing changed; the host's own work goes on."""
    nc, prefix = lab.operator, lab.prefix
    device = f"{host.host_id}-d1"
    await host.register((device, {"os": "linux"}))
    task_id = await submit(nc, prefix, selector={"device_id": device}, plan=plan("a"), lease_ttl_s=60)
    assigned = await host.next_assignment(timeout=20)
    await host.claim(assigned)
    lease = assigned.lease
    tasks_before = await task_count(nc, prefix)
    hosts_before = await call(nc, api(prefix, "hosts.list"))

    submit_subject = api(prefix, "tasks.submit")
    noop = {"name": "a", "action": "noop"}
    # (subject, body with `@` where the hostile text goes, the path the refusal must name)
    cases: list[tuple[str, dict[str, Any], str]] = [
        (submit_subject, {"plan": {"steps": [noop]}, "name": "@"}, "name"),
        (submit_subject, {"plan": {"steps": [noop]}, "metadata": {"k": "@"}}, "metadata.k"),
        (submit_subject, {"plan": {"steps": [noop]}, "selector": {"labels": {"os": "@"}}}, "selector.labels.os"),
        (submit_subject, {"plan": {"steps": [noop]}, "idempotency_key": "@"}, "idempotency_key"),
        (
            submit_subject,
            {"plan": {"steps": [{"name": "@", "action": "noop"}]}},
            "plan.steps.0.name",
        ),
        (api(prefix, "tasks.cancel"), {"task_id": task_id, "reason": "@"}, "reason"),
        (host.subject("report"), {**lease, "outcome": "failed", "reason": "@"}, "reason"),
        (host.subject("release"), {**lease, "reason": "@"}, "reason"),
        (
            host.subject("register"),
            {"devices": [{"device_id": device, "labels": {"os": "@"}}]},
            "devices.0.labels.os",
        ),
        (host.subject("register"), {"devices": [{"device_id": device}], "agent_version": "@"}, "agent_version"),
        (api(prefix, "devices.drain"), {"device_id": device, "reason": "@"}, "reason"),
    ]
    # Free-form JSON: no length of its own (the payload cap bounds it), but a NUL or a surrogate is refused.
    free_form: list[tuple[str, dict[str, Any], str]] = [
        (
            submit_subject,
            {"plan": {"steps": [{"name": "a", "action": "lab.x", "args": {"x": ["@"]}}]}},
            "plan.steps.0.args.x.0",
        ),
        (
            host.subject("report"),
            {
                **lease,
                "outcome": "done",
                "result": {"steps": [{"name": "a", "status": "done", "output_tail": "@"}]},
            },
            "result.steps.0.output_tail",
        ),
        (host.subject("renew"), {**lease, "progress": {"step": "@", "index": 0, "of": 1}}, "progress.step"),
    ]
    answers: list[str] = []
    for kind, spoil in KINDS.items():
        for subject, body, path in cases + free_form:
            if kind == "oversize" and path == "plan.steps.0.args.x.0":
                continue  # args are bounded by the payload cap only
            err = await refused(lab, host, subject, spoil(json.dumps(body)))
            answers.append(f"{kind} {path}: {err.status} {err.code}")
            assert (err.status, err.code) == (400, "invalid_request"), answers[-1]
            if kind == "oversize" and path == "metadata.k":
                path = "metadata"  # metadata is bounded as a whole
            assert path in [e["path"] for e in err.details["errors"]], (kind, err.details)
            assert SECRET not in json.dumps(err.details), (kind, path)
    # A 4 KB idempotency key (once a btree error, `internal`) names its field too.
    raw = json.dumps({"plan": {"steps": [noop]}, "idempotency_key": "k" * 4096})
    err = await refused(lab, host, submit_subject, raw)
    assert (err.status, err.code) == (400, "invalid_request")
    assert [e["path"] for e in err.details["errors"]] == ["idempotency_key"]

    # Nothing changed: no task, the attempt still running, the registration as it was.
    assert await task_count(nc, prefix) == tasks_before
    view = await get_task(nc, prefix, task_id)
    assert view["status"] == "dispatched"
    assert not view["cancel_requested"]
    assert view["attempts"][-1]["status"] == "active"
    assert await call(nc, api(prefix, "hosts.list")) == hosts_before
    # The honest host goes on: it renews and reports.
    await host.renew(assigned, {"step": "a", "index": 0, "of": 1})
    assert (await host.report(assigned))["status"] == "done"


async def test_no_refusal_logs_the_value_it_refused(secured: SecuredNats, database_url: str, tmp_path: Path) -> None:
    """Every refusal path reachable, each carrying the secret; at DEBUG, the most the scheduler logs."""
    async with deploy_lab(secured, database_url, tmp_path / "scheduler.log", log_level="DEBUG") as lab:
        prefix = lab.prefix
        host = await lab.host(CARELESS)
        device = f"{host.host_id}-d1"
        schema = {"type": "object", "properties": {"port": {"type": "integer"}}, "additionalProperties": False}
        await host.request(
            "register",
            {"devices": [{"device_id": device}], "actions": [{"name": "lab.flash", "args_schema": schema}]},
        )
        submit_subject = api(prefix, "tasks.submit")
        attempts: list[tuple[str, str]] = [
            # a plug-in's args against its schema: jsonschema's message quotes the bad value
            (
                submit_subject,
                json.dumps({"plan": {"steps": [{"name": "a", "action": "lab.flash", "args": {"port": SECRET}}]}}),
            ),
            (
                submit_subject,
                json.dumps({"plan": {"steps": [{"name": "a", "action": "lab.flash", "args": {SECRET: 1}}]}}),
            ),
            # the wrong type, a bad enum, a bad id: pydantic's message may name the input
            (submit_subject, json.dumps({"plan": {"steps": [{"name": "a", "action": "noop"}]}, "priority": SECRET})),
            (api(prefix, "tasks.list"), json.dumps({"status": SECRET})),
            (api(prefix, "tasks.get"), json.dumps({"task_id": SECRET})),
            (api(prefix, "tasks.list"), json.dumps({"after": SECRET})),  # not a cursor of ours
            # unstorable, too long, unknown field, not JSON
            (
                submit_subject,
                json.dumps({"plan": {"steps": [{"name": "a", "action": "noop"}]}, "name": "@"}).replace(
                    "@", "\\u0000" + SECRET
                ),
            ),
            (submit_subject, json.dumps({"plan": {"steps": [{"name": "a", "action": "noop"}]}, "name": SECRET * 100})),
            (submit_subject, json.dumps({"plan": {"steps": [{"name": "a", "action": "noop"}]}, SECRET: 1})),
            (submit_subject, "{" + SECRET),
            # not found, and a report for a lease that is not this host's
            (api(prefix, "tasks.cancel"), json.dumps({"task_id": str(uuid.uuid4()), "reason": SECRET})),
            (api(prefix, "devices.drain"), json.dumps({"device_id": "no-such-device", "reason": SECRET})),
            (
                host.subject("report"),
                json.dumps(
                    {
                        "task_id": str(uuid.uuid4()),
                        "attempt": 1,
                        "lease_id": str(uuid.uuid4()),
                        "outcome": "failed",
                        "reason": SECRET,
                    }
                ),
            ),
        ]
        codes = []
        for subject, raw in attempts:
            err = await refused(lab, host, subject, raw)
            codes.append(f"{err.status}:{err.code}")
        assert all(c.startswith(("400:", "404:", "409:")) for c in codes), codes
        assert "400:invalid_request" in codes
        assert "404:not_found" in codes
        log = lab.scheduler.log_text()
        # Those past decoding (plug-in args, not found, another host's lease) are logged, by code and paths.
        refusals = [line for line in log.splitlines() if '"error":' in line and " refused" in line]
        assert len(refusals) >= 5, refusals
        assert SECRET not in log, [line for line in log.splitlines() if SECRET in line][:3]
        assert lab.violations(CARELESS) == []
