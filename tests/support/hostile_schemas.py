"""Args schemas a hostile host advertises to stall the scheduler, each within the payload and the metaschema.

Each is small on the wire; without bounds, checking a submit's args against it never ends (a cycle) or
takes exponential time and memory (references that double at every level).
"""

from __future__ import annotations

from typing import Any


def self_reference() -> dict[str, Any]:
    """`{"$ref": "#"}`: the check recurses until Python gives up (a RecursionError, a 500 on every submit)."""
    return {"$ref": "#"}


def doubling_nest(combinator: str = "anyOf", levels: int = 25, leaf: bool = False) -> dict[str, Any]:
    """`levels` definitions, each a `combinator` of two references to the next; the last is `leaf`.

    About 1.8 KB for 25 levels, and 2^25 subschemas to evaluate: with `anyOf` and a false leaf no branch
    ever succeeds early; with `allOf` and a true leaf every branch must be evaluated.
    """
    defs: dict[str, Any] = {
        f"l{i}": {combinator: [{"$ref": f"#/$defs/l{i + 1}"}, {"$ref": f"#/$defs/l{i + 1}"}]} for i in range(levels)
    }
    defs[f"l{levels}"] = leaf
    return {"$defs": defs, "$ref": "#/$defs/l0"}


def doubling_properties(levels: int = 25) -> dict[str, Any]:
    """A DAG of definitions without combinators: each object's two properties refer to the next definition."""
    defs: dict[str, Any] = {
        f"d{i}": {"type": "object", "properties": {p: {"$ref": f"#/$defs/d{i + 1}"} for p in "ab"}}
        for i in range(levels)
    }
    defs[f"d{levels}"] = {"type": "object"}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


def indirect_cycle() -> dict[str, Any]:
    """Two definitions that refer to each other through `items`."""
    return {
        "$defs": {"a": {"type": "array", "items": {"$ref": "#/$defs/b"}}, "b": {"anyOf": [{"$ref": "#/$defs/a"}]}},
        "$ref": "#/$defs/a",
    }


#: Every attack, by name.
ATTACKS: dict[str, dict[str, Any]] = {
    "self_reference": self_reference(),
    "anyof_nest_false_leaf": doubling_nest("anyOf", 25, False),
    "allof_nest_true_leaf": doubling_nest("allOf", 25, True),
    "doubling_defs_dag": doubling_properties(25),
    "indirect_cycle": indirect_cycle(),
}
