"""Plug-in args checked at submit against the schemas hosts advertise (`scheduler.plugin_args`)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from devsched.plugins.adb import InstrumentArgs

from devsched.core.errors import InvalidRequest
from devsched.protocol.hosts import ActionOffer
from devsched.protocol.plans import Plan
from devsched.scheduler.plugin_args import (
    ARGS_BUDGET_S,
    check_args,
    check_offers,
    check_plugin_args,
    schema_problem,
)
from support.hostile_schemas import ATTACKS

ADB = InstrumentArgs.model_json_schema()
LOOSE: dict[str, Any] = {"type": "object"}


def plan(*steps: tuple[str, dict[str, Any]]) -> Plan:
    return Plan.model_validate(
        {"steps": [{"name": f"s{i}", "action": a, "args": args} for i, (a, args) in enumerate(steps)]}
    )


def test_args_that_the_advertised_schema_accepts_pass() -> None:
    check_args(
        plan(("adb-instrument", {"runner": "a/b", "instrument_args": {"class": "X"}})), {"adb-instrument": [ADB]}
    )


def test_refused_args_name_each_path_and_why() -> None:
    with pytest.raises(InvalidRequest) as caught:
        check_args(
            plan(("noop", {}), ("adb-instrument", {"runner": "a/b", "instrument_args": {"class": 3}, "speed": 1})),
            {"adb-instrument": [ADB]},
        )
    paths = {e["path"] for e in caught.value.details["errors"]}
    assert paths == {"plan.steps.1.args", "plan.steps.1.args.instrument_args.class"}
    assert any("'speed' was unexpected" in e["message"] for e in caught.value.details["errors"])
    assert all(e["message"].startswith("invalid adb-instrument args: ") for e in caught.value.details["errors"])


def test_a_host_can_only_loosen_the_check_never_block_other_hosts_work() -> None:
    """Refused only when every advertised schema refuses: a rogue host's strict schema blocks nothing."""
    rogue: dict[str, Any] = {"type": "object", "required": ["never"]}
    good = plan(("adb-instrument", {"runner": "a/b"}))
    check_args(good, {"adb-instrument": [rogue, ADB]})
    check_args(good, {"adb-instrument": [rogue, None]})  # a host that checks nothing accepts anything
    with pytest.raises(InvalidRequest):
        check_args(good, {"adb-instrument": [rogue]})


def test_an_action_no_host_offers_is_not_checked_here() -> None:
    check_args(plan(("flash-firmware", {"anything": [1, 2]})), {})


def test_schemas_with_regular_expressions_or_outside_references_are_unusable() -> None:
    assert schema_problem(ADB) is None
    assert schema_problem(LOOSE) is None
    assert "pattern" in str(schema_problem({"type": "string", "pattern": "(a+)+$"}))
    assert "patternProperties" in str(schema_problem({"patternProperties": {"^x": {}}}))
    assert "references" in str(schema_problem({"$ref": "https://example.com/s.json"}))
    assert schema_problem({"$defs": {"a": {"type": "string"}}, "$ref": "#/$defs/a"}) is None
    assert "not a valid JSON Schema" in str(schema_problem({"type": "no-such-type"}))


def test_a_property_named_like_a_forbidden_keyword_is_only_a_name() -> None:
    assert schema_problem({"type": "object", "properties": {"pattern": {"type": "string"}}}) is None


@pytest.mark.parametrize("name", sorted(ATTACKS))
async def test_a_registration_with_a_hostile_schema_is_refused_naming_the_action(name: str) -> None:
    offers = [
        ActionOffer(name="shell"),
        ActionOffer(name="adb-instrument", args_schema=ADB),
        ActionOffer(name="evil", args_schema=ATTACKS[name]),
    ]
    with pytest.raises(InvalidRequest) as caught:
        await check_offers(offers)
    assert [e["path"] for e in caught.value.details["errors"]] == ["actions.2.args_schema"]
    assert caught.value.message.startswith("actions.2.args_schema: args schema of evil ")
    await check_offers(offers[:2])  # the honest ones pass


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_a_stored_hostile_schema_is_not_used_at_submit(name: str) -> None:
    """One an older scheduler stored: as if the host advertised none (the agent checks), never a 500."""
    started = time.perf_counter()
    check_args(plan(("evil", {"anything": 1})), {"evil": [ATTACKS[name]]})
    assert time.perf_counter() - started < 1.0


def test_args_that_cannot_be_checked_within_the_budget_are_refused_naming_the_step() -> None:
    """An admitted schema, args large enough: the validator stops at the deadline (it does not finish)."""
    schema = {"type": "object", "properties": {"xs": {"type": "array", "items": {"allOf": [{"type": "integer"}] * 60}}}}
    assert schema_problem(schema) is None
    big = plan(("noop", {}), ("big", {"xs": list(range(200_000))}))
    started = time.perf_counter()
    with pytest.raises(InvalidRequest) as caught:
        check_args(big, {"big": [schema]}, budget_s=0.05)
    assert time.perf_counter() - started < 0.5
    assert caught.value.details["errors"] == [
        {
            "path": "plan.steps.1.args",
            "message": "big args could not be checked against the schemas hosts advertise for it within 0.05 s; "
            "send smaller args",
        }
    ]


def test_unique_items_is_checked_in_linear_time_with_json_equality() -> None:
    schema = {"type": "object", "properties": {"xs": {"type": "array", "uniqueItems": True}}}
    many = plan(("u", {"xs": [{"a": i, "b": [i, {"c": None}]} for i in range(2_000)]}))
    started = time.perf_counter()
    check_args(many, {"u": [schema]}, budget_s=30)
    assert time.perf_counter() - started < 5  # compared pairwise, they took 25 s on a loaded machine
    check_args(plan(("u", {"xs": [1, True, "1", [1], {"1": 1}, None, 0, False]})), {"u": [schema]})
    for same in ([1, 1.0], [{"a": 1, "b": 2}, {"b": 2, "a": 1}], [[1, {"x": 2}], [1.0, {"x": 2.0}]], [None, None]):
        with pytest.raises(InvalidRequest, match="non-unique"):
            check_args(plan(("u", {"xs": same})), {"u": [schema]})


def test_the_first_schema_that_accepts_ends_the_check() -> None:
    """Schemas are tried in turn: a costly one after one that accepts is never evaluated."""
    costly = {"type": "object", "properties": {"xs": {"items": {"allOf": [{"type": "integer"}] * 60}}}}
    big = plan(("a", {"xs": list(range(200_000))}))
    check_args(big, {"a": [LOOSE, costly]}, budget_s=0.05)
    with pytest.raises(InvalidRequest, match="could not be checked"):
        check_args(big, {"a": [costly, LOOSE]}, budget_s=0.05)


class SchemaStore:
    """What `check_plugin_args` reads of the store: the schemas advertised per action."""

    def __init__(self, schemas: dict[str, list[dict[str, Any] | None]]) -> None:
        self.schemas = schemas

    async def action_schemas(self, names: list[str]) -> dict[str, list[dict[str, Any] | None]]:
        return {n: self.schemas[n] for n in names if n in self.schemas}


async def test_the_check_runs_off_the_event_loop_and_a_plan_of_built_ins_reads_nothing() -> None:
    schema = {"type": "object", "properties": {"xs": {"type": "array", "items": {"allOf": [{"type": "integer"}] * 60}}}}
    store = SchemaStore({"big": [schema]})
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    big = plan(("big", {"xs": list(range(300_000))}))
    ticking = asyncio.create_task(ticker())
    try:
        started = time.perf_counter()
        with pytest.raises(InvalidRequest, match="could not be checked"):
            await check_plugin_args(store, big)  # type: ignore[arg-type]
        elapsed = time.perf_counter() - started
    finally:
        ticking.cancel()
    assert ARGS_BUDGET_S <= elapsed < ARGS_BUDGET_S + 1.0
    assert ticks >= elapsed / 0.01 / 10  # the loop kept turning meanwhile (the thread shares the GIL)
    await check_plugin_args(None, plan(("noop", {})))  # type: ignore[arg-type]
