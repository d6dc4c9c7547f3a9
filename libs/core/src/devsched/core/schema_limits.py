"""The bounds a plug-in's args schema (JSON Schema 2020-12) must keep, so checking args against it is cheap.

Hosts are not trusted, and the scheduler checks every submit's plug-in args against the schemas hosts
advertise. A schema's cost is what it takes to walk it with every `$ref` replaced by its target: a
reference to itself never ends (`{"$ref": "#"}`), and a few hundred bytes of definitions that each refer
twice to the next are exponential (2^25 subschemas in 25 levels). So a schema must stay small in bytes,
values and depth, refer only inside itself along JSON pointers, without cycles, and stay small with its
references inlined (counted once per definition, so the count itself is cheap); no subschema may apply
more than a few dozen others to one value. Some keywords are refused outright: regular expressions (one
crafted pattern can backtrack for minutes), dynamic references, and `unevaluated*` (their check evaluates
the sibling subschemas again, at every level).

Pure: the scheduler refuses a registration whose schema breaks a bound, and the agent leaves such a schema
out of its registration (its plug-in then runs unchecked at submit) instead of being refused.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote

#: Largest schema, in bytes of compact UTF-8 JSON.
MAX_SCHEMA_BYTES = 16_384
#: Most JSON values (objects, arrays, strings, numbers, ...) in one schema.
MAX_SCHEMA_VALUES = 2_048
#: Deepest nesting of JSON objects and arrays in one schema.
MAX_SCHEMA_DEPTH = 32
#: Most subschemas once every reference is replaced by its target.
MAX_INLINED_SUBSCHEMAS = 4_096
#: Deepest nesting of subschemas once every reference is replaced by its target.
MAX_INLINED_DEPTH = 32
#: Most subschemas one subschema applies to the same value (allOf, anyOf, oneOf, not, if/then/else,
#: dependentSchemas, $ref together), and most entries of one prefixItems.
MAX_BRANCHES = 64

#: Keywords a schema may not use, at any subschema.
FORBIDDEN_KEYWORDS = frozenset(
    {
        "pattern",
        "patternProperties",
        "$dynamicRef",
        "$recursiveRef",
        "$dynamicAnchor",
        "$recursiveAnchor",
        "unevaluatedProperties",
        "unevaluatedItems",
    }
)
#: Keywords allowed only at the top: below, they would change how references resolve or which rules apply.
TOP_ONLY_KEYWORDS = frozenset({"$id", "$schema"})
#: The only dialect a schema may declare (`$schema`).
DIALECT = "https://json-schema.org/draft/2020-12/schema"

#: Keywords whose value is one subschema applied to the value itself (the rest apply to its parts).
_SAME_VALUE_ONE = ("not", "if", "then", "else")
#: Keywords whose value is a list of subschemas applied to the value itself.
_SAME_VALUE_MANY = ("allOf", "anyOf", "oneOf")
#: Keywords whose value is one subschema (applied to the value or its parts).
_ONE = (
    *_SAME_VALUE_ONE,
    "items",
    "contains",
    "additionalProperties",
    "propertyNames",
    "unevaluatedItems",
    "unevaluatedProperties",
    "contentSchema",
    "additionalItems",
)
#: Keywords whose value is a list of subschemas.
_MANY = (*_SAME_VALUE_MANY, "prefixItems")
#: Keywords whose value maps names to subschemas that may apply.
_NAMED = ("properties", "patternProperties", "dependentSchemas")
#: Keywords whose value maps names to subschemas that apply only when referred to.
_DEFINITIONS = ("$defs", "definitions")


class _Breach(Exception):
    """A bound broken: its message says which, never quoting the schema."""


def schema_limit_problem(schema: object) -> str | None:
    """Which bound `schema` breaks (a message naming the rule, never a value of the schema); None if none."""
    try:
        _check_document(schema)
        _check_references(schema)
    except _Breach as breach:
        return str(breach)
    return None


def _check_document(schema: object) -> None:
    """Values and depth first (walked without recursion, stopping early), then bytes."""
    stack: list[tuple[object, int]] = [(schema, 0)]
    values = 0
    while stack:
        node, depth = stack.pop()
        values += 1
        if values > MAX_SCHEMA_VALUES:
            raise _Breach(f"holds more than {MAX_SCHEMA_VALUES} JSON values")
        if isinstance(node, dict | list):
            if depth >= MAX_SCHEMA_DEPTH:
                raise _Breach(f"nests JSON objects and arrays deeper than {MAX_SCHEMA_DEPTH} levels")
            stack.extend((child, depth + 1) for child in (node.values() if isinstance(node, dict) else node))
    size = len(json.dumps(schema, separators=(",", ":"), ensure_ascii=False).encode())
    if size > MAX_SCHEMA_BYTES:
        raise _Breach(f"is larger than {MAX_SCHEMA_BYTES} bytes as compact JSON")


def _subschemas(node: dict[str, Any]) -> Iterator[tuple[object, bool]]:
    """Each subschema of `node` and whether it applies (definitions apply only through a reference)."""
    for key in _ONE:
        if key in node:
            value = node[key]
            yield from ((v, True) for v in value) if isinstance(value, list) else [(value, True)]
    for key in _MANY:
        if isinstance(node.get(key), list):
            yield from ((v, True) for v in node[key])
    for key in _NAMED + _DEFINITIONS:
        if isinstance(node.get(key), dict):
            yield from ((v, key in _NAMED) for v in node[key].values())


def _branches(node: dict[str, Any]) -> int:
    """How many subschemas `node` applies to the value itself."""
    count = sum(key in node for key in _SAME_VALUE_ONE) + ("$ref" in node)
    count += sum(len(node[key]) for key in _SAME_VALUE_MANY if isinstance(node.get(key), list))
    dependent = node.get("dependentSchemas")
    return count + (len(dependent) if isinstance(dependent, dict) else 0)


def _resolve(root: object, ref: object) -> object:
    """The target of a reference inside the schema: `#` or `#/<JSON pointer>`."""
    if not isinstance(ref, str) or not ref.startswith("#"):
        raise _Breach("refers outside itself: only `#` and `#/<JSON pointer>` references are allowed")
    fragment = unquote(ref[1:])
    if fragment and not fragment.startswith("/"):
        raise _Breach("refers to an anchor: only `#` and `#/<JSON pointer>` references are allowed")
    target = root
    for token in fragment.split("/")[1:] if fragment else ():
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(target, dict) and token in target:
            target = target[token]
        elif isinstance(target, list) and token.isdigit() and (token == "0" or not token.startswith("0")):
            if int(token) >= len(target):
                raise _Breach("has a reference that points to nothing in it")
            target = target[int(token)]
        else:
            raise _Breach("has a reference that points to nothing in it")
    if not isinstance(target, dict | bool):
        raise _Breach("has a reference that points to something that is not a schema")
    return target


def _check_node(node: dict[str, Any], top: bool) -> None:
    forbidden = sorted(FORBIDDEN_KEYWORDS.intersection(node))
    if forbidden:
        raise _Breach(
            "uses keywords that are not allowed (regular expressions, dynamic references, unevaluated*): "
            + ", ".join(forbidden)
        )
    if not top and not TOP_ONLY_KEYWORDS.isdisjoint(node):
        raise _Breach("uses $id or $schema below the top")
    if top and "$schema" in node and node["$schema"] != DIALECT:
        raise _Breach(f"declares another dialect than JSON Schema 2020-12 ({DIALECT})")
    if _branches(node) > MAX_BRANCHES:
        raise _Breach(
            f"has a subschema that applies more than {MAX_BRANCHES} subschemas to one value "
            "(allOf, anyOf, oneOf, not, if/then/else, dependentSchemas, $ref together)"
        )
    if isinstance(node.get("prefixItems"), list) and len(node["prefixItems"]) > MAX_BRANCHES:
        raise _Breach(f"has a prefixItems of more than {MAX_BRANCHES} subschemas")


def _check_references(root: object) -> None:
    """Every subschema, references followed: keywords, fan-out, no cycle, and the inlined size and depth.

    A depth-first walk without recursion; each subschema is measured once (memoised by identity), so a
    chain of definitions that doubles at every level costs as many steps as it has definitions.
    """
    size: dict[int, int] = {}  # finished subschemas: subschemas, references inlined
    depth: dict[int, int] = {}  # finished subschemas: nesting, references inlined
    open_: set[int] = set()  # subschemas on the current path
    stack: list[tuple[object, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        key = id(node)
        if not isinstance(node, dict):
            size[key], depth[key] = 1, 1
            continue
        children = list(_subschemas(node))
        target = _resolve(root, node["$ref"]) if "$ref" in node else None
        if target is not None:
            children.append((target, True))
        if finished:
            applied = [id(c) for c, applies in children if applies]
            size[key] = min(1 + sum(size[c] for c in applied), MAX_INLINED_SUBSCHEMAS + 1)
            depth[key] = 1 + max((depth[c] for c in applied), default=0)
            open_.discard(key)
            if size[key] > MAX_INLINED_SUBSCHEMAS:
                raise _Breach(f"has more than {MAX_INLINED_SUBSCHEMAS} subschemas with its references inlined")
            if depth[key] > MAX_INLINED_DEPTH:
                raise _Breach(f"nests subschemas deeper than {MAX_INLINED_DEPTH} levels with its references inlined")
            continue
        if key in size:
            continue
        if key in open_:
            raise _Breach("has references that form a cycle (a recursive schema)")
        _check_node(node, node is root)
        open_.add(key)
        stack.append((node, True))
        for child, _ in children:
            if id(child) in open_:
                raise _Breach("has references that form a cycle (a recursive schema)")
            if id(child) not in size:
                stack.append((child, False))
