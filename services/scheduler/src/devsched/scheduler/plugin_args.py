"""Plug-in actions' args, checked at submit against the JSON Schemas their hosts advertise.

A built-in action's args are checked by the protocol's models; a plug-in's by the schema each host sends
with its registration (`RegisterRequest.actions[].args_schema`), so a typo fails at submit, not on the
device hours later. Hosts are not trusted, so a host's schema may only ever loosen the check, never block
other hosts' work: args are refused only when every schema advertised for the action refuses them (a host
that advertises none checks nothing). An advertised schema must be a valid JSON Schema (2020-12) without
regular expressions (`pattern`, `patternProperties`: a crafted one could stall the scheduler's event loop
on every submit) and without references outside itself; another is ignored, and the agent alone checks.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from devsched.core.actions import plugin_actions
from devsched.core.errors import InvalidRequest
from devsched.protocol.plans import Plan
from devsched.store import Store

#: Keywords an advertised schema may not hold, at any depth.
FORBIDDEN_KEYWORDS = frozenset({"pattern", "patternProperties", "$dynamicRef", "$recursiveRef"})
#: Most problems one refusal lists.
MAX_PROBLEMS = 20


def schema_problem(schema: Mapping[str, Any]) -> str | None:
    """Why `schema` cannot be an action's args schema; None when it can."""
    try:
        Draft202012Validator.check_schema(dict(schema))
    except SchemaError as exc:
        return f"not a valid JSON Schema: {exc.message}"
    forbidden = sorted(_keywords(schema) & FORBIDDEN_KEYWORDS)
    if forbidden:
        return f"regular expressions and dynamic references are not allowed: {', '.join(forbidden)}"
    refs = [r for r in _refs(schema) if not r.startswith("#")]
    if refs:
        return f"only references inside the schema are allowed: {refs[0]}"
    return None


def _keywords(node: Any) -> set[str]:
    if isinstance(node, dict):
        return set(node).union(*(_keywords(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(_keywords(v) for v in node))
    return set()


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return found + [r for v in node.values() for r in _refs(v)]
    if isinstance(node, list):
        return [r for v in node for r in _refs(v)]
    return []


@lru_cache(maxsize=256)
def _validator(schema_json: str) -> Draft202012Validator:
    return Draft202012Validator(json.loads(schema_json))


def _problems(schema: Mapping[str, Any], args: Mapping[str, Any]) -> list[tuple[str, str]]:
    validator = _validator(json.dumps(schema, sort_keys=True))
    return [(".".join(str(p) for p in e.absolute_path), e.message) for e in validator.iter_errors(dict(args))]


def check_args(plan: Plan, schemas: Mapping[str, Sequence[Mapping[str, Any] | None]]) -> None:
    """Refuse `plan` when a plug-in step's args fail every schema advertised for its action.

    Raises:
        InvalidRequest: naming each offending `plan.steps.N.args...` path (checked against the newest schema).
    """
    errors: list[dict[str, str]] = []
    for index, step in enumerate(plan.steps):
        advertised = schemas.get(step.action, ())
        if not advertised or any(s is None for s in advertised):
            continue
        verdicts = [_problems(s, step.args) for s in advertised if s is not None]
        if all(verdicts):
            for path, message in verdicts[0]:
                where = f"plan.steps.{index}.args" + (f".{path}" if path else "")
                errors.append({"path": where, "message": f"invalid {step.action} args: {message}"})
    if errors:
        first = errors[0]
        raise InvalidRequest(f"{first['path']}: {first['message']}", errors=errors[:MAX_PROBLEMS])


async def check_plugin_args(store: Store, plan: Plan) -> None:
    """`check_args` with the schemas hosts advertise now; nothing to read for a plan of built-ins only."""
    plugins = plugin_actions(plan.actions())
    if plugins:
        check_args(plan, await store.action_schemas(plugins))
