"""The bounds of a plug-in's args schema (`core.schema_limits`): the attacks refused, honest schemas kept."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from devsched.plugins.adb import InstrumentArgs
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from devsched.core.schema_limits import (
    MAX_BRANCHES,
    MAX_INLINED_DEPTH,
    MAX_INLINED_SUBSCHEMAS,
    MAX_SCHEMA_BYTES,
    MAX_SCHEMA_DEPTH,
    MAX_SCHEMA_VALUES,
    schema_limit_problem,
)
from support.hostile_schemas import ATTACKS, doubling_nest


class Point(BaseModel):
    x: int
    y: int


class Shape(BaseModel):
    """Shared definitions referred to from several places, as pydantic writes them."""

    corners: list[Point]
    centre: Point
    anchor: Point | None = None
    pattern: str = "solid"  # a property named like a forbidden keyword is only a name


@pytest.mark.parametrize("schema", [InstrumentArgs.model_json_schema(), Shape.model_json_schema(), {}, True])
def test_honest_schemas_are_within_the_bounds(schema: Any) -> None:
    assert schema_limit_problem(schema) is None


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_each_attack_is_refused_at_once_naming_the_rule(name: str) -> None:
    started = time.perf_counter()
    problem = schema_limit_problem(ATTACKS[name])
    assert time.perf_counter() - started < 0.1
    assert problem is not None
    expected = "cycle" if "cycle" in name or name == "self_reference" else f"more than {MAX_INLINED_SUBSCHEMAS}"
    assert expected in problem
    assert "$defs/l" not in problem  # the rule, never the schema
    assert "#" not in problem


def test_a_doubling_nest_is_refused_only_past_the_inlined_bound() -> None:
    """Memoised: 11 levels (2^12 subschemas inlined) are too many, 10 are not, and both are measured at once."""
    assert schema_limit_problem(doubling_nest("anyOf", 10, False)) is None
    assert f"more than {MAX_INLINED_SUBSCHEMAS}" in str(schema_limit_problem(doubling_nest("anyOf", 11, False)))


@pytest.mark.parametrize(
    ("schema", "rule"),
    [
        ({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}, "cycle"),
        ({"properties": {"a": {"items": {"$ref": "#"}}}}, "cycle"),
        ({"$defs": {"never": {"not": {"$ref": "#/$defs/never"}}}}, "cycle"),  # even a definition not used
        ({"$ref": "https://example.com/s.json"}, "only `#` and `#/<JSON pointer>` references"),
        ({"$ref": "#anchor", "$defs": {"a": {"$anchor": "anchor"}}}, "anchor"),
        ({"$ref": "#/$defs/missing"}, "points to nothing"),
        ({"$ref": "#/required/5", "required": ["a"]}, "points to nothing"),
        ({"$ref": "#/required", "required": ["a"]}, "not a schema"),
        ({"type": "string", "pattern": "(a+)+$"}, "pattern"),
        ({"patternProperties": {"^x": {}}}, "patternProperties"),
        ({"properties": {"a": {"$dynamicRef": "#meta"}}}, "$dynamicRef"),
        ({"allOf": [{"unevaluatedProperties": False}]}, "unevaluatedProperties"),
        ({"properties": {"a": {"$id": "urn:a", "$ref": "#"}}}, "$id or $schema below the top"),
        ({"$schema": "http://json-schema.org/draft-07/schema#"}, "another dialect"),
        ({"anyOf": [{}] * (MAX_BRANCHES + 1)}, f"more than {MAX_BRANCHES} subschemas to one value"),
        ({"allOf": [{}] * 40, "oneOf": [{}] * 25}, f"more than {MAX_BRANCHES} subschemas to one value"),
        ({"prefixItems": [{}] * (MAX_BRANCHES + 1)}, "prefixItems"),
    ],
)
def test_each_rule_is_named(schema: dict[str, Any], rule: str) -> None:
    assert rule in str(schema_limit_problem(schema))


def test_the_refs_from_the_top_resolve_to_a_json_pointer_with_escapes() -> None:
    schema: dict[str, Any] = {
        "$defs": {"a/b": {"type": "string"}, "c~d": {"type": "integer"}},
        "prefixItems": [{"$ref": "#/$defs/a~1b"}, {"$ref": "#/$defs/c~0d"}, {"$ref": "#/$defs/a~1b/type/../x"}],
    }
    assert "points to nothing" in str(schema_limit_problem(schema))
    schema["prefixItems"] = schema["prefixItems"][:2]
    assert schema_limit_problem(schema) is None


def test_size_values_and_depth_are_bounded() -> None:
    assert f"{MAX_SCHEMA_BYTES} bytes" in str(schema_limit_problem({"description": "x" * MAX_SCHEMA_BYTES}))
    assert schema_limit_problem({"description": "x" * (MAX_SCHEMA_BYTES - 20)}) is None
    assert f"{MAX_SCHEMA_VALUES} JSON values" in str(schema_limit_problem({"enum": list(range(MAX_SCHEMA_VALUES))}))
    deep: Any = {}
    for _ in range(MAX_SCHEMA_DEPTH):
        deep = {"not": deep}
    assert f"deeper than {MAX_SCHEMA_DEPTH} levels" in str(schema_limit_problem(deep))


def test_a_very_deep_document_is_refused_without_recursion() -> None:
    deep: Any = {}
    for _ in range(100_000):
        deep = {"not": deep}
    assert "deeper than" in str(schema_limit_problem(deep))


def test_a_chain_of_references_is_bounded_in_depth() -> None:
    """Each definition small and the whole tiny, but the references nest the check 40 levels deep."""
    defs = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(40)} | {"d40": {"type": "string"}}
    schema = {"$defs": defs, "$ref": "#/$defs/d0"}
    assert f"deeper than {MAX_INLINED_DEPTH} levels with its references inlined" in str(schema_limit_problem(schema))
    defs = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(20)} | {"d20": {"type": "string"}}
    assert schema_limit_problem({"$defs": defs, "$ref": "#/$defs/d0"}) is None


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.sampled_from(["#", "#/$defs/a", "#/$defs/b", "#/x", "a"]),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(["$ref", "$defs", "a", "b", "anyOf", "allOf", "not", "items", "properties", "$id", "x"]),
            inner,
            max_size=4,
        )
    ),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(JSON)
def test_any_json_gets_an_answer_never_an_exception(schema: Any) -> None:
    problem = schema_limit_problem(schema)
    assert problem is None or isinstance(problem, str)
    if problem is None and isinstance(schema, dict):
        assert len(json.dumps(schema)) <= MAX_SCHEMA_BYTES
