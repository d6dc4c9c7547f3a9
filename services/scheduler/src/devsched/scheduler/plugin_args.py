"""Plug-in actions' args, checked at submit against the JSON Schemas their hosts advertise.

A built-in action's args are checked by the protocol's models; a plug-in's by the schema each host sends
with its registration (`RegisterRequest.actions[].args_schema`), so a typo fails at submit, not on the
device hours later. Hosts are not trusted, so a host's schema may only ever loosen the check, never block
other hosts' work: args are refused only when every schema advertised for the action refuses them (a host
that advertises none checks nothing).

Nor may a schema stall the scheduler. A registration is refused when a schema breaks the bounds of
`devsched.core.schema_limits` (which keep its cost linear in its size) or is not a valid JSON Schema
2020-12. Both checks, and every args check, run on worker threads, never on the event loop: hosts'
schemas on one, users' args on others, so a host's registrations never delay a submit. An args check has
a time budget, enforced at every keyword the validator evaluates; args that cannot be checked within it
are refused. Validators are built once per distinct schema.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import SchemaError, ValidationError
from jsonschema.protocols import Validator

from devsched.core.actions import plugin_actions
from devsched.core.errors import InvalidRequest, Unavailable
from devsched.core.schema_limits import schema_limit_problem
from devsched.protocol.hosts import ActionOffer
from devsched.protocol.plans import Plan
from devsched.store import Store

log = logging.getLogger("devsched.scheduler.plugin_args")

T = TypeVar("T")

#: Most problems one refusal lists.
MAX_PROBLEMS = 20
#: Longest problem message (a validator's message may quote the args).
MAX_MESSAGE_CHARS = 300
#: Time one submit's args checks may take on their worker thread.
ARGS_BUDGET_S = 1.0
#: Time one registration's schema checks may take on their worker thread.
SCHEMAS_BUDGET_S = 5.0
#: Beyond its budget, how long a check may wait for a worker thread before the request is answered 503.
QUEUE_GRACE_S = 2.0

#: Users' args checks; hosts' schema checks. Apart, so neither can make the other wait.
_ARGS_THREADS = ThreadPoolExecutor(max_workers=2, thread_name_prefix="devsched-args-check")
_SCHEMA_THREADS = ThreadPoolExecutor(max_workers=1, thread_name_prefix="devsched-schema-check")


class OverBudget(Exception):
    """An args check ran out of time (raised inside the validator, so the thread stops at once)."""


#: The deadline (`time.monotonic()`) of the check running on this thread; none outside a check.
_deadline = threading.local()


def _within_budget(keyword: Callable[..., Any]) -> Callable[..., Any]:
    """A keyword's check that first makes sure the check's deadline has not passed."""

    @functools.wraps(keyword)
    def check(validator: Any, value: Any, instance: Any, schema: Any) -> Any:
        _in_time()
        return keyword(validator, value, instance, schema)

    return check


def _in_time() -> None:
    """Raise OverBudget when the deadline of the check on this thread has passed."""
    at: float | None = getattr(_deadline, "at", None)
    if at is not None and time.monotonic() > at:
        raise OverBudget


def _unique_items(validator: Any, unique: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    """`uniqueItems` in linear time: jsonschema's compares objects pairwise (2,000 of them take seconds)."""
    if unique and isinstance(instance, list) and len({_identity(item) for item in instance}) < len(instance):
        yield ValidationError("has non-unique elements")


def _identity(value: Any) -> object:
    """A hashable stand-in for a JSON value, equal for equal values as JSON Schema compares them.

    Numbers by value (1 and 1.0 are equal), booleans apart from numbers, objects whatever their keys' order.
    """
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, dict):
        _in_time()
        return ("object", frozenset((k, _identity(v)) for k, v in value.items()))
    if isinstance(value, list):
        _in_time()
        return ("array", tuple(_identity(v) for v in value))
    return (type(value).__name__ if isinstance(value, str) or value is None else "number", value)


#: Draft 2020-12, each keyword checking the deadline. Admitted schemas declare no other dialect below
#: their top (`schema_limits`), so every subschema is checked by this class.
BudgetedValidator: type[Validator] = validators.extend(  # type: ignore[no-untyped-call]
    Draft202012Validator,
    {k: _within_budget(f) for k, f in (Draft202012Validator.VALIDATORS | {"uniqueItems": _unique_items}).items()},
)


def schema_problem(schema: Mapping[str, Any]) -> str | None:
    """Why `schema` cannot be an action's args schema; None when it can.

    The bounds first: they are linear and stop early, and keep the metaschema check off what is too big.
    """
    problem = schema_limit_problem(schema)
    if problem is not None:
        return problem
    return _metaschema_problem(json.dumps(schema, sort_keys=True))


@functools.lru_cache(maxsize=1024)
def _metaschema_problem(schema_json: str) -> str | None:
    """Remembered: the metaschema check is slow (milliseconds a kilobyte), and agents register the same schemas."""
    try:
        Draft202012Validator.check_schema(json.loads(schema_json))
    except SchemaError as exc:
        return f"is not a valid JSON Schema 2020-12 ({_culprit(exc)} fails the metaschema's `{exc.validator}`)"
    return None


#: Keywords a metaschema refusal may name (any other key is the schema's own text: a property's name).
_KEYWORDS = frozenset(Draft202012Validator.VALIDATORS) | {
    "$defs", "$id", "$schema", "$comment", "title", "description", "default", "examples", "deprecated",
    "readOnly", "writeOnly", "contentEncoding", "contentMediaType", "minContains", "maxContains",
}  # fmt: skip


def _culprit(exc: SchemaError) -> str:
    """The keyword that fails, when the schema's path ends at one (never a name the host chose)."""
    last = exc.absolute_path[-1] if exc.absolute_path else None
    if last is None:
        return "its top"
    return f"a `{last}`" if last in _KEYWORDS else "a subschema"


def offer_problems(offers: Sequence[ActionOffer], deadline: float) -> list[dict[str, str]]:
    """Each offer's args schema that cannot be used, as `actions.N.args_schema` errors naming the action.

    Raises:
        OverBudget: `deadline` passed before every schema was checked (those checked are remembered).
    """
    errors = []
    for index, offer in enumerate(offers):
        if offer.args_schema is None:
            continue
        if time.monotonic() > deadline:
            raise OverBudget
        problem = schema_problem(offer.args_schema)
        if problem is not None:
            errors.append({"path": f"actions.{index}.args_schema", "message": f"args schema of {offer.name} {problem}"})
    return errors


async def check_offers(offers: Sequence[ActionOffer]) -> None:
    """Refuse a registration whose offers carry a schema that cannot be used (on the hosts' worker thread).

    Raises:
        InvalidRequest: naming each `actions.N.args_schema`, its action and the rule broken.
        Unavailable: the schemas could not be checked within `SCHEMAS_BUDGET_S` (the agent registers again).
    """
    if all(o.args_schema is None for o in offers):
        return
    deadline = time.monotonic() + SCHEMAS_BUDGET_S
    try:
        errors = await _on_thread(_SCHEMA_THREADS, functools.partial(offer_problems, offers, deadline), deadline)
    except OverBudget:
        raise Unavailable(f"the args schemas could not be checked within {SCHEMAS_BUDGET_S:g} s; try again") from None
    if errors:
        log.warning("registration refused: unusable args schema", extra={"errors": errors[:MAX_PROBLEMS]})
        raise InvalidRequest(f"{errors[0]['path']}: {errors[0]['message']}", errors=errors[:MAX_PROBLEMS])


async def _on_thread(threads: ThreadPoolExecutor, work: Callable[[], T], deadline: float) -> T:
    """`work` on one of `threads`; OverBudget if it has not ended `QUEUE_GRACE_S` after `deadline`."""
    future = asyncio.get_running_loop().run_in_executor(threads, work)
    try:
        return await asyncio.wait_for(future, timeout=deadline + QUEUE_GRACE_S - time.monotonic())
    except TimeoutError:
        raise OverBudget from None


@functools.lru_cache(maxsize=256)
def _validator(schema_json: str) -> Validator | None:
    """The validator of an advertised schema, built once; None for one that breaks the rules.

    Registrations are checked, but a schema stored by an older scheduler may not be: it is then not used
    (as if the host advertised none, so only the agent checks), and said once.
    """
    schema = json.loads(schema_json)
    problem = schema_problem(schema)
    if problem is not None:
        log.warning("stored args schema not used", extra={"error": problem})
        return None
    validator: Validator = BudgetedValidator(schema)
    return validator


def _problems(validator: Validator, args: Mapping[str, Any]) -> list[tuple[str, str]]:
    found = []
    for error in validator.iter_errors(dict(args)):
        found.append((".".join(str(p) for p in error.absolute_path), _cut(error.message)))
        if len(found) >= MAX_PROBLEMS:
            break
    return found


def _cut(message: str) -> str:
    return message if len(message) <= MAX_MESSAGE_CHARS else message[: MAX_MESSAGE_CHARS - 1] + "…"


def check_args(
    plan: Plan,
    schemas: Mapping[str, Sequence[Mapping[str, Any] | None]],
    *,
    budget_s: float = ARGS_BUDGET_S,
    abandoned_at: float | None = None,
) -> None:
    """Refuse `plan` when a plug-in step's args fail every schema advertised for its action.

    The schemas are tried in turn until one accepts; all must refuse. Runs within `budget_s`, counted
    from its start (on a worker thread: the validator raises when it is spent), and stops by
    `abandoned_at` (`time.monotonic()`), when no one waits for its answer any more.

    Raises:
        InvalidRequest: naming each offending `plan.steps.N.args...` path (checked against the newest schema),
            or the first step whose args could not be checked within the budget.
    """
    errors: list[dict[str, str]] = []
    _deadline.at = min(time.monotonic() + budget_s, abandoned_at if abandoned_at is not None else float("inf"))
    try:
        for index, step in enumerate(plan.steps):
            where = f"plan.steps.{index}.args"
            try:
                verdicts = _verdicts(step.args, schemas.get(step.action, ()))
            except OverBudget:
                message = (
                    f"{step.action} args could not be checked against the schemas hosts advertise for it "
                    f"within {budget_s:g} s; send smaller args"
                )
                raise InvalidRequest(f"{where}: {message}", errors=[{"path": where, "message": message}]) from None
            for path, message in verdicts:
                errors.append(
                    {"path": where + (f".{path}" if path else ""), "message": f"invalid {step.action} args: {message}"}
                )
    finally:
        _deadline.at = None
    if errors:
        first = errors[0]
        raise InvalidRequest(f"{first['path']}: {first['message']}", errors=errors[:MAX_PROBLEMS])


def _verdicts(args: Mapping[str, Any], advertised: Sequence[Mapping[str, Any] | None]) -> list[tuple[str, str]]:
    """The problems of `args` under the first advertised schema, or none when any schema accepts them."""
    if not advertised or any(s is None for s in advertised):
        return []
    first: list[tuple[str, str]] | None = None
    for schema in advertised:
        assert schema is not None
        validator = _validator(json.dumps(schema, sort_keys=True))
        if validator is None:
            return []  # a schema not used checks nothing, as if none was advertised
        problems = _problems(validator, args)
        if not problems:
            return []
        first = problems if first is None else first
    return first or []


async def check_plugin_args(store: Store, plan: Plan) -> None:
    """`check_args` with the schemas hosts advertise now; nothing to read for a plan of built-ins only.

    Raises:
        InvalidRequest: see `check_args`.
        Unavailable: no worker thread was free in time to check them (others' checks were running).
    """
    plugins = plugin_actions(plan.actions())
    if not plugins:
        return
    schemas = await store.action_schemas(plugins)
    if not any(schemas.values()):
        return
    deadline = time.monotonic() + ARGS_BUDGET_S
    try:
        work = functools.partial(check_args, plan, schemas, abandoned_at=deadline + QUEUE_GRACE_S)
        await _on_thread(_ARGS_THREADS, work, deadline)
    except OverBudget:
        raise Unavailable("the plug-in args could not be checked in time (the checks are busy); try again") from None
