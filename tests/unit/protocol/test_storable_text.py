"""The edge refuses text the store cannot keep, and every free string and object of a request is bounded.

Postgres keeps no NUL and no lone surrogate (`22P05`): such a request used to pass decoding and fail in the
store as `internal`. `decode` now refuses it with the field's path and the rule, never the value.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from devsched.core.errors import InvalidRequest, NotFound
from devsched.core.text import RULE, is_storable, storable, unstorable_paths
from devsched.protocol import messages as m
from devsched.protocol.artifacts import MAX_NAME_BYTES, normalise_name
from devsched.protocol.base import (
    MAX_CURSOR_CHARS,
    MAX_LABEL_CHARS,
    MAX_LABELS,
    MAX_METADATA_BYTES,
    MAX_NAME_CHARS,
    MAX_REASON_CHARS,
    MAX_VERSION_CHARS,
)
from devsched.protocol.codec import MAX_LOGGED_PATHS, decode, from_jsonable, refusal_log_fields
from devsched.protocol.plans import MAX_CWD_CHARS, MAX_OUTPUT_TAIL_CHARS
from devsched.protocol.transport import stats_error

pytestmark = pytest.mark.unit

SECRET = "tok-5ecret-7d1a"
IDS = {"task_id": str(uuid.uuid4()), "attempt": 1, "lease_id": str(uuid.uuid4())}
STEP = {"name": "a", "action": "noop"}

#: The escapes that give unstorable text, in each spelling JSON allows (hex in either case).
BAD_ESCAPES = ["\\u0000", "\\ud800", "\\uDFFF", "\\uDc00", "\\udbff"]


def submit(**fields: Any) -> dict[str, Any]:
    return {"plan": {"steps": [STEP]}, **fields}


def refused(model: type[Any], raw: str) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as err:
        decode(model, raw.encode())
    return err.value


def paths(err: InvalidRequest) -> list[str]:
    return [e["path"] for e in err.details["errors"]]


def with_escape(body: dict[str, Any], escape: str) -> str:
    """`body` as JSON, each `@` replaced by the raw escape (json.dumps would double its backslash)."""
    return json.dumps(body).replace("@", escape)


# -- the check at every kind of place ---------------------------------------------------------------------

#: (model, body with `@` where the escape goes, the path the refusal names)
PLACES: list[tuple[type[Any], dict[str, Any], str]] = [
    (m.SubmitRequest, submit(name="a@b"), "name"),
    (m.SubmitRequest, submit(idempotency_key="k@"), "idempotency_key"),
    (m.SubmitRequest, submit(metadata={"k": "v@"}), "metadata.k"),
    (m.SubmitRequest, submit(metadata={"k": {"deep": [1, {"x": "@"}]}}), "metadata.k.deep.1.x"),
    (m.SubmitRequest, submit(metadata={"k@": 1}), "metadata.<key>"),
    (m.SubmitRequest, submit(selector={"labels": {"os": "@"}}), "selector.labels.os"),
    (m.SubmitRequest, submit(selector={"labels": {"@os": "x"}}), "selector.labels.<key>"),
    (m.SubmitRequest, {"plan": {"steps": [{"name": "a", "action": "x", "args": {"x": "@"}}]}}, "plan.steps.0.args.x"),
    (m.SubmitRequest, {"plan": {"steps": [{"name": "a@", "action": "noop"}]}}, "plan.steps.0.name"),
    (
        m.SubmitRequest,
        {"plan": {"steps": [{"name": "a", "action": "shell", "args": {"command": "echo @"}}]}},
        "plan.steps.0.args.command",
    ),
    (m.CancelRequest, {"task_id": IDS["task_id"], "reason": "@"}, "reason"),
    (m.ReportRequest, {**IDS, "outcome": "failed", "reason": "r@"}, "reason"),
    (
        m.ReportRequest,
        {**IDS, "outcome": "done", "result": {"steps": [{"name": "a", "status": "done", "output_tail": "@"}]}},
        "result.steps.0.output_tail",
    ),
    (m.ReleaseRequest, {**IDS, "reason": "@"}, "reason"),
    (m.RenewRequest, {**IDS, "progress": {"step": "@", "index": 0, "of": 1}}, "progress.step"),
    (m.RegisterRequest, {"devices": [{"device_id": "d1", "labels": {"k": "@"}}]}, "devices.0.labels.k"),
    (m.RegisterRequest, {"agent_version": "@"}, "agent_version"),
    (m.DrainRequest, {"device_id": "d1", "reason": "@"}, "reason"),
    (m.HostDrainRequest, {"host_id": "h1", "reason": "@"}, "reason"),
    (m.ListTasksRequest, {"after": "@"}, "after"),
    (m.SubmitRequest, {"@": 1, "plan": {"steps": [STEP]}}, "<key>"),
]


@pytest.mark.parametrize("escape", BAD_ESCAPES)
@pytest.mark.parametrize(("model", "body", "path"), PLACES, ids=[p[2] + "-" + p[0].__name__ for p in PLACES])
def test_unstorable_text_is_refused_with_its_path_and_rule_never_its_value(
    model: type[Any], body: dict[str, Any], path: str, escape: str
) -> None:
    err = refused(model, with_escape(body, escape + SECRET))
    assert err.code == "invalid_request"
    assert err.details["errors"] == [{"path": path, "message": RULE}]
    assert SECRET not in err.message
    assert SECRET not in json.dumps(err.details)


def test_every_place_is_named_not_just_the_first() -> None:
    body = submit(name="@", metadata={"a": "@", "b": ["ok", "@"]})
    err = refused(m.SubmitRequest, with_escape(body, "\\u0000"))
    assert paths(err) == ["name", "metadata.a", "metadata.b.1"]
    assert "(and 2 more)" in err.message


@pytest.mark.parametrize("text", ["\\ud83d\\ude00", "\\u00e9", "\\\\u0000", "\\u0001", "\\uFFFD", "plain"])
def test_storable_text_passes_even_when_escaped_or_looking_suspect(text: str) -> None:
    # A surrogate pair is one character; an escaped backslash followed by `u0000` is no escape.
    req = decode(m.SubmitRequest, with_escape(submit(metadata={"k": "@"}), text).encode())
    assert is_storable(req.metadata["k"])  # type: ignore[arg-type]


def test_a_nul_in_raw_json_is_not_json_and_refused_as_such() -> None:
    err = refused(m.SubmitRequest, '{"plan": {"steps": [{"name": "a\x00", "action": "noop"}]}}')
    assert "not valid JSON" in err.message


def test_deep_nesting_is_refused_not_crashed() -> None:
    deep = "[" * 5000 + '"\\u0000"' + "]" * 5000
    err = refused(m.SubmitRequest, '{"plan": {"steps": [{"name": "a", "action": "x", "args": {"x": ' + deep + "}}]}}")
    assert err.code == "invalid_request"


def test_core_text_helpers() -> None:
    assert storable("a\x00b\ud800c") == "a\ufffdb\ufffdc"
    assert storable("fine") == "fine"
    assert not is_storable("\udfff")
    assert is_storable("\U0001f600")
    assert list(unstorable_paths({"a": ["x", {"b\x00": 1}], "c": "\x00"})) == [("a", "1", "<key>"), ("c",)]


# -- lengths ----------------------------------------------------------------------------------------------

TOO_LONG: list[tuple[type[Any], dict[str, Any], str]] = [
    (m.SubmitRequest, submit(name="n" * (MAX_NAME_CHARS + 1)), "name"),
    (m.SubmitRequest, submit(idempotency_key="k" * (MAX_NAME_CHARS + 1)), "idempotency_key"),
    (m.SubmitRequest, submit(idempotency_key="k" * 4096), "idempotency_key"),
    (m.SubmitRequest, submit(metadata={"k": "v" * MAX_METADATA_BYTES}), "metadata"),
    (m.SubmitRequest, submit(selector={"labels": {"k": "v" * (MAX_LABEL_CHARS + 1)}}), "selector.labels.k"),
    (m.SubmitRequest, submit(selector={"labels": {"k" * (MAX_LABEL_CHARS + 1): "v"}}), "selector.labels.<key>"),
    (m.SubmitRequest, submit(selector={"labels": {f"k{i}": "v" for i in range(MAX_LABELS + 1)}}), "selector.labels"),
    (
        m.SubmitRequest,
        {"plan": {"steps": [{"name": "s" * (MAX_NAME_CHARS + 1), "action": "noop"}]}},
        "plan.steps.0.name",
    ),
    (
        m.SubmitRequest,
        {"plan": {"steps": [{"name": "a", "action": "x" * (MAX_NAME_CHARS + 1)}]}},
        "plan.steps.0.action",
    ),
    (
        m.SubmitRequest,
        {
            "plan": {
                "steps": [{"name": "a", "action": "shell", "args": {"command": "c", "cwd": "d" * (MAX_CWD_CHARS + 1)}}]
            }
        },
        "plan.steps.0.args.cwd",
    ),
    (m.CancelRequest, {"task_id": IDS["task_id"], "reason": "r" * (MAX_REASON_CHARS + 1)}, "reason"),
    (m.ReportRequest, {**IDS, "outcome": "failed", "reason": "r" * (MAX_REASON_CHARS + 1)}, "reason"),
    (
        m.ReportRequest,
        {
            **IDS,
            "outcome": "done",
            "result": {"steps": [{"name": "a", "status": "done", "output_tail": "t" * (MAX_OUTPUT_TAIL_CHARS + 1)}]},
        },
        "result.steps.0.output_tail",
    ),
    (m.ReleaseRequest, {**IDS, "reason": "r" * (MAX_REASON_CHARS + 1)}, "reason"),
    (m.RenewRequest, {**IDS, "progress": {"step": "s" * (MAX_NAME_CHARS + 1), "index": 0, "of": 1}}, "progress.step"),
    (m.RegisterRequest, {"agent_version": "v" * (MAX_VERSION_CHARS + 1)}, "agent_version"),
    (m.RegisterRequest, {"devices": [{"device_id": "d", "labels": {"k": "v" * 300}}]}, "devices.0.labels.k"),
    (m.DrainRequest, {"device_id": "d1", "reason": "r" * (MAX_REASON_CHARS + 1)}, "reason"),
    (m.HostDrainRequest, {"host_id": "h1", "reason": "r" * (MAX_REASON_CHARS + 1)}, "reason"),
    (m.ListTasksRequest, {"after": "c" * (MAX_CURSOR_CHARS + 1)}, "after"),
    (
        m.HealthCheckSetRequest,
        {"name": "c", "plan": {"steps": [STEP]}, "selector": {"labels": {"k": "v" * 300}}},
        "selector.labels.k",
    ),
]


@pytest.mark.parametrize(("model", "body", "path"), TOO_LONG, ids=[p[2] + "-" + p[0].__name__ for p in TOO_LONG])
def test_an_oversize_value_is_refused_with_its_path(model: type[Any], body: dict[str, Any], path: str) -> None:
    err = refused(model, json.dumps(body))
    assert path in paths(err)


def test_values_at_the_limits_are_accepted() -> None:
    at = submit(
        name="n" * MAX_NAME_CHARS,
        idempotency_key="\U0001f600" * MAX_NAME_CHARS,  # 800 bytes of UTF-8: far below a btree entry's 2704
        selector={"labels": {f"{i:0{MAX_LABEL_CHARS}d}": "v" * MAX_LABEL_CHARS for i in range(MAX_LABELS)}},
        metadata={"k": "v" * (MAX_METADATA_BYTES - 10)},
    )
    req = decode(m.SubmitRequest, json.dumps(at).encode())
    assert req.idempotency_key is not None
    assert len(req.idempotency_key.encode()) == 800


def test_an_artifact_name_too_long_in_bytes_for_its_index_is_refused() -> None:
    name = "/".join(["\U0001f600" * 60] * 10)  # 609 characters, 2409 bytes
    assert len(name.encode()) > MAX_NAME_BYTES
    with pytest.raises(ValueError, match="bytes of UTF-8"):
        normalise_name(name)


# -- what a refusal's log line may say --------------------------------------------------------------------


def test_a_refusal_logs_code_status_and_paths_never_the_message() -> None:
    err = refused(m.SubmitRequest, json.dumps(submit(priority=SECRET)))
    fields = refusal_log_fields(err)
    assert fields == {"error": "invalid_request", "status": 400, "paths": "priority"}
    assert SECRET not in json.dumps(fields)
    assert refusal_log_fields(NotFound(f"no such task {SECRET}")) == {"error": "not_found", "status": 404}


def test_a_refusal_logs_a_bounded_number_of_paths() -> None:
    err = refused(m.SubmitRequest, with_escape(submit(metadata={f"k{i}": "@" for i in range(50)}), "\\u0000"))
    assert len(refusal_log_fields(err)["paths"].split()) == MAX_LOGGED_PATHS


def test_micro_stats_name_the_paths_of_a_refusal_not_its_message() -> None:
    err = refused(m.SubmitRequest, json.dumps(submit(priority=SECRET)))
    assert stats_error(err) == "400:invalid_request priority"
    assert stats_error(refused(m.SubmitRequest, "{" + SECRET)) == "400:invalid_request <body>"
    assert stats_error(NotFound("no such task")) == "404:not_found no such task"


def test_a_value_read_back_is_shown_whatever_the_request_bounds() -> None:
    """A row stored before a bound existed still renders: the bounds guard requests, not what is shown.

    Otherwise one old task with a long step name would make every `tasks.list` page holding it fail.
    """
    long_name = "s" * (MAX_NAME_CHARS + 1)
    labels = {f"k{i}": "v" * (MAX_LABEL_CHARS + 1) for i in range(MAX_LABELS + 1)}
    plan = {"steps": [{"name": long_name, "action": "shell", "args": {"command": "true"}}]}
    with pytest.raises(InvalidRequest) as refused:
        decode(m.Plan, json.dumps(plan).encode())
    assert refused.value.details["errors"][0]["path"] == "steps.0.name"
    with pytest.raises(InvalidRequest):
        decode(m.Selector, json.dumps({"labels": labels}).encode())
    # Read back: a view built from stored values, and a reply decoded by a client.
    assert from_jsonable(m.Plan, plan).steps[0].name == long_name
    assert m.Selector.from_value(type("Row", (), {"labels": labels, "device_id": None})()).labels == labels
    attempt = {
        "attempt": 1,
        "lease_id": str(uuid.uuid4()),
        "host_id": "h1",
        "device_id": "d1",
        "status": "active",
        "assigned_at": "2026-01-02T03:04:05Z",
        "expires_at": "2026-01-02T03:05:05Z",
        "progress": {"step": long_name, "index": 0, "of": 1},
    }
    progress = decode(m.AttemptView, json.dumps(attempt).encode()).progress
    assert progress is not None
    assert progress.step == long_name
