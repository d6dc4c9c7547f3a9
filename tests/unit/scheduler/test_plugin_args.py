"""Plug-in args checked at submit against the schemas hosts advertise (`scheduler.plugin_args`)."""

from __future__ import annotations

from typing import Any

import pytest
from devsched.plugins.adb import InstrumentArgs

from devsched.core.errors import InvalidRequest
from devsched.protocol.plans import Plan
from devsched.scheduler.plugin_args import check_args, schema_problem

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
