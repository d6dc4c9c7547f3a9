from __future__ import annotations

import json
import math
import re
import uuid
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from devsched.core.errors import InvalidRequest
from devsched.core.ids import TOKEN_PATTERN
from devsched.core.status import EventKind, Outcome, TaskStatus
from devsched.protocol import messages as m
from devsched.protocol.codec import decode, encode

from .samples import LEASE_ID, PLAN, SAMPLES, SUMMARY_FIELDS, T0, T1, TASK_ID

pytestmark = pytest.mark.unit

DOC = Path(__file__).resolve().parents[3] / "docs" / "protocol.md"


# -- round trips ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_every_message_round_trips(name: str) -> None:
    sample = SAMPLES[name]
    data = encode(sample)
    assert decode(type(sample), data) == sample
    assert encode(decode(type(sample), data)) == data  # byte-stable


def test_every_protocol_message_has_a_sample() -> None:
    names = {
        "SubmitRequest", "SubmitReply", "GetTaskRequest", "TaskView", "AttemptView", "Progress",
        "ListTasksRequest", "ListTasksReply", "CancelRequest", "CancelReply", "HostsListRequest",
        "HostsListReply", "DrainRequest", "DeviceDrainView", "RegisterRequest", "RegisterReply",
        "HeartbeatRequest", "HeartbeatReply", "ClaimRequest", "RenewRequest", "LeaseReply",
        "ReportRequest", "ReportReply", "Assignment", "TaskEvent", "Nudge", "ErrorBody",
        "ReleaseRequest", "ReleaseReply", "HostDrainRequest", "DrainNotice",
    }  # fmt: skip
    assert names <= {type(s).__name__ for s in SAMPLES.values()} | set(SAMPLES)


def test_encode_is_compact_and_writes_nulls() -> None:
    data = encode(m.SubmitReply(task_id=TASK_ID, status=TaskStatus.QUEUED, created=True))
    assert data == b'{"task_id":"0b6f8d7e-2c1a-4e59-9a7f-3d2b1c0e9f11","status":"queued","created":true}'
    event = json.loads(encode(SAMPLES["TaskEvent(submitted)"]))
    assert event["attempt"] is None
    assert event["host_id"] is None
    assert event["progress"] is None


def test_defaults_of_submit() -> None:
    req = decode(m.SubmitRequest, b'{"plan": {"steps": [{"name": "a", "action": "noop"}]}}')
    assert (req.priority, req.max_attempts, req.lease_ttl_s) == (0, 3, 30)
    assert req.selector == m.Selector(labels={}, device_id=None)
    assert req.name is None
    assert req.idempotency_key is None
    assert req.metadata == {}
    step = req.plan.steps[0]
    assert (step.timeout_s, step.interruptible, step.always, step.args) == (3600.0, False, False, {})


@pytest.mark.parametrize(
    ("body", "rule"),
    [
        (b'{"device_id": "d1", "labels": {"a": "1"}, "unset": ["a"]}', "'unset'"),
        (b'{"device_id": "d1"}', "labels to set or keys to unset"),
        (b'{"device_id": "d1", "labels": {"devsched.action.flash": "1"}}', "'labels'"),
        (b'{"device_id": "d1", "unset": ["devsched.action.flash"]}', "'unset'"),
    ],
)
def test_a_label_request_sets_or_unsets_each_key_and_no_reserved_one(body: bytes, rule: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        decode(m.LabelDeviceRequest, body)
    assert rule in repr(err.value.details)


def test_a_forget_needs_a_reason() -> None:
    for body in (b'{"device_id": "d1"}', b'{"device_id": "d1", "reason": ""}'):
        with pytest.raises(InvalidRequest):
            decode(m.ForgetDeviceRequest, body)


def test_defaults_of_list_and_drain() -> None:
    assert decode(m.ListTasksRequest, b"{}") == m.ListTasksRequest(status=None, limit=100, after=None)
    assert decode(m.DrainRequest, b'{"device_id": "d1"}').drained is True
    assert decode(m.RegisterRequest, b"{}").devices == []


# -- the examples of PROTOCOL.md ------------------------------------------------------------------------

_PLACEHOLDERS = {
    "task_id": str(TASK_ID),
    "lease_id": str(LEASE_ID),
    **{k: "2025-03-04T05:06:07.890123Z" for k in ("created_at", "updated_at", "assigned_at", "dispatched_at")},
    **{k: "2025-03-04T05:06:07.890123Z" for k in ("expires_at", "started_at", "finished_at")},
}


def _doc_examples() -> list[str]:
    blocks = re.findall(r"```json\n(.*?)```", DOC.read_text(), flags=re.S)
    filled = []
    for block in blocks:
        for key, value in _PLACEHOLDERS.items():
            block = block.replace(f'"{key}": "..."', f'"{key}": "{value}"')
        block = block.replace('"selector": {...}', '"selector": {}')
        block = block.replace('"plan": {...}', '"plan": {"steps": [{"name": "flash", "action": "noop"}]}')
        filled.append(block)
    return filled


def test_doc_has_the_six_examples() -> None:
    assert len(_doc_examples()) == 6


def test_doc_retry_policy_example_decodes() -> None:
    (block,) = [b for b in _doc_examples() if '"retry"' in b]
    req = decode(m.SubmitRequest, block.encode())
    assert req.retry is not None
    assert [s.infra for s in req.plan.steps] == [True, False]
    assert (req.queue_timeout_s, req.attempt_timeout_s) == (600, 1800)


def test_doc_submit_example_decodes() -> None:
    req = decode(m.SubmitRequest, _doc_examples()[0].encode())
    assert req.selector.labels == {"platform": "android"}
    assert [s.name for s in req.plan.steps] == ["flash", "wait"]
    assert req.plan.steps[1].builtin_args() == m.SleepArgs(seconds=5)
    assert req.idempotency_key == "ci-run-1234"


def test_doc_get_reply_example_decodes() -> None:
    view = decode(m.TaskView, _doc_examples()[1].encode())
    assert view.status is TaskStatus.DISPATCHED
    assert view.attempts[0].progress == m.Progress(step="flash", index=0, of=2)
    assert view.attempts[0].ended_at is None


def test_doc_report_example_decodes() -> None:
    report = decode(m.ReportRequest, _doc_examples()[2].encode())
    assert report.outcome == "done"
    assert report.result is not None
    assert report.result.steps[0].exit_code == 0


def test_doc_release_example_decodes() -> None:
    release = decode(m.ReleaseRequest, _doc_examples()[3].encode())
    assert release.reason == "shutdown: agent shutting down"
    assert release.result is not None
    assert [s.status for s in release.result.steps] == ["done", "interrupted", "done"]


def test_doc_log_record_example_decodes() -> None:
    record = decode(m.LogRecord, _doc_examples()[4].encode())
    assert (record.kind, record.stream, record.seq, record.offset) == ("output", "stdout", 7, 131072)
    assert record.content() == b"flashing...\n"
    assert json.loads(encode(record)) == json.loads(_doc_examples()[4]), "every field, as the agent writes it"


# -- timestamps ------------------------------------------------------------------------------------------


def test_timestamps_are_utc_with_microseconds_and_z() -> None:
    reply = m.LeaseReply(expires_at=datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC), ttl_s=30, cancel_requested=False)
    assert json.loads(encode(reply))["expires_at"] == "2025-01-02T03:04:05.000000Z"
    assert m.format_timestamp(datetime(2025, 1, 2, 3, 4, 5, 6, tzinfo=UTC)) == "2025-01-02T03:04:05.000006Z"


def test_timestamps_with_an_offset_are_normalised_to_utc() -> None:
    body = b'{"expires_at": "2025-01-02T05:04:05.5+02:00", "ttl_s": 30, "cancel_requested": false}'
    reply = decode(m.LeaseReply, body)
    assert reply.expires_at == datetime(2025, 1, 2, 3, 4, 5, 500000, tzinfo=UTC)
    assert reply.expires_at.utcoffset() == timedelta(0)
    assert json.loads(encode(reply))["expires_at"] == "2025-01-02T03:04:05.500000Z"


@pytest.mark.parametrize("stamp", ["2025-01-02T03:04:05", "2025-01-02", "1735787045", "yesterday"])
def test_timestamps_without_offset_or_not_rfc3339_are_rejected(stamp: str) -> None:
    body = json.dumps({"expires_at": stamp, "ttl_s": 30, "cancel_requested": False}).encode()
    with pytest.raises(InvalidRequest) as err:
        decode(m.LeaseReply, body)
    assert err.value.details["errors"][0]["path"] == "expires_at"


@pytest.mark.parametrize("stamp", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00", "2025-13-01T00:00:00Z"])
def test_timestamps_out_of_range_are_invalid_requests(stamp: str) -> None:
    body = json.dumps({"expires_at": stamp, "ttl_s": 30, "cancel_requested": False}).encode()
    with pytest.raises(InvalidRequest) as err:
        decode(m.LeaseReply, body)
    assert err.value.details["errors"][0]["path"] == "expires_at"


def test_a_number_is_not_a_timestamp() -> None:
    with pytest.raises(InvalidRequest):
        decode(m.LeaseReply, b'{"expires_at": 1735787045, "ttl_s": 30, "cancel_requested": false}')


def test_naive_datetimes_are_rejected_in_python_too() -> None:
    with pytest.raises(ValidationError):
        m.LeaseReply(expires_at=datetime(2025, 1, 2), ttl_s=30, cancel_requested=False)


# -- strictness when building models in Python ---------------------------------------------------------


def test_enum_fields_accept_their_string_values_in_python() -> None:
    view = m.CancelReply(task_id=TASK_ID, status="cancelled", cancel_requested=False)  # type: ignore[arg-type]
    assert view.status is TaskStatus.CANCELLED


def test_ints_stay_strict_in_python() -> None:
    with pytest.raises(ValidationError):
        m.SubmitRequest(plan=PLAN, priority=True)
    with pytest.raises(ValidationError):
        m.Nudge(task_id=TASK_ID, attempt="1")  # type: ignore[arg-type]


def test_ids_must_be_uuids() -> None:
    with pytest.raises(ValidationError):
        m.GetTaskRequest(task_id="not-a-uuid")  # type: ignore[arg-type]
    assert decode(m.GetTaskRequest, f'{{"task_id": "{TASK_ID.hex}"}}'.encode()).task_id == TASK_ID


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_floats_cannot_be_built_into_json_fields(bad: float) -> None:
    with pytest.raises(ValidationError):
        m.Step(name="a", action="custom", args={"x": [1, {"y": bad}]})
    with pytest.raises(ValidationError):
        m.SubmitRequest(plan=PLAN, metadata={"x": bad})
    with pytest.raises(ValidationError):
        m.SleepArgs(seconds=bad)


def test_models_are_immutable() -> None:
    with pytest.raises(ValidationError):
        PLAN.steps[0].name = "other"  # type: ignore[misc]


# -- forward compatibility -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(n for n, s in SAMPLES.items() if isinstance(s, m.ReplyModel)))
def test_replies_and_stream_messages_ignore_fields_added_by_newer_servers(name: str) -> None:
    sample = SAMPLES[name]
    body = json.loads(encode(sample))
    body["added_in_v2"] = {"anything": 1}
    assert decode(type(sample), json.dumps(body).encode()) == sample


def test_replies_ignore_added_fields_at_any_depth() -> None:
    body = json.loads(encode(SAMPLES["TaskView"]))
    body["plan"]["steps"][0]["retries"] = 2
    body["attempts"][0]["host_labels"] = {}
    assert decode(m.TaskView, json.dumps(body).encode()) == SAMPLES["TaskView"]


def test_building_any_model_in_python_rejects_unknown_fields() -> None:
    with pytest.raises(ValidationError, match="pending_reson"):
        m.TaskSummary(**{**SUMMARY_FIELDS, "pending_reson": "typo"})
    with pytest.raises(ValidationError, match="seqq"):
        m.Nudge(task_id=TASK_ID, attempt=1, seqq=2)  # type: ignore[call-arg]


@pytest.mark.parametrize("name", sorted(n for n, s in SAMPLES.items() if isinstance(s, m.RequestModel)))
def test_requests_reject_unknown_fields(name: str) -> None:
    sample = SAMPLES[name]
    body = json.loads(encode(sample))
    body["bogus"] = 1
    with pytest.raises(InvalidRequest) as err:
        decode(type(sample), json.dumps(body).encode())
    assert {"path": "bogus", "message": "Extra inputs are not permitted"} in err.value.details["errors"]


# -- specific rules --------------------------------------------------------------------------------------


def test_builtin_args_are_typed_and_plugin_args_are_free() -> None:
    assert PLAN.steps[0].builtin_args() == m.ShellArgs(command="echo flashing")
    assert PLAN.steps[2].builtin_args() == m.NoopArgs()
    assert PLAN.steps[3].builtin_args() is None


@pytest.mark.parametrize(
    ("env", "what"), [({"A=B": "1"}, "'A=B'"), ({"": "1"}, "''"), ({"A\0": "1"}, "NUL"), ({"A": "x\0y"}, "NUL")]
)
def test_a_shell_env_the_agent_could_not_set_is_refused_at_submit(env: dict[str, str], what: str) -> None:
    body = {"plan": {"steps": [{"name": "a", "action": "shell", "args": {"command": "true", "env": env}}]}}
    with pytest.raises(InvalidRequest) as err:
        decode(m.SubmitRequest, json.dumps(body).encode())
    assert what in err.value.details["errors"][0]["message"]


@pytest.mark.parametrize(
    ("action", "args", "path", "message"),
    [
        ("sleep", {"seconds": -1}, "plan.steps.0.args.seconds", "invalid sleep args: Input should be greater than 0"),
        ("sleep", {}, "plan.steps.0.args.seconds", "invalid sleep args: Field required"),
        ("sleep", {"seconds": 1, "typo": 2}, "plan.steps.0.args.typo", "invalid sleep args: Extra inputs"),
        ("shell", {"command": "true", "env": {"A=B": "1"}}, "plan.steps.0.args.env", "invalid shell args: "),
        ("noop", {"x": 1}, "plan.steps.0.args.x", "invalid noop args: Extra inputs"),
    ],
)
def test_a_bad_action_argument_is_named_by_its_own_path(
    action: str, args: dict[str, Any], path: str, message: str
) -> None:
    body = {"plan": {"steps": [{"name": "a", "action": action, "args": args}]}}
    with pytest.raises(InvalidRequest) as err:
        decode(m.SubmitRequest, json.dumps(body).encode())
    errors = err.value.details["errors"]
    assert [e["path"] for e in errors] == [path]
    assert errors[0]["message"].startswith(message), errors
    assert str(err.value).startswith(f"invalid request: {path}: {message}"), str(err.value)


def test_every_bad_argument_of_a_step_is_listed() -> None:
    body = {"plan": {"steps": [{"name": "a", "action": "shell", "args": {"command": "", "cwd": 3}}]}}
    with pytest.raises(InvalidRequest) as err:
        decode(m.SubmitRequest, json.dumps(body).encode())
    assert [e["path"] for e in err.value.details["errors"]] == ["plan.steps.0.args.command", "plan.steps.0.args.cwd"]


def test_progress_index_must_be_below_of() -> None:
    with pytest.raises(ValidationError, match="index must be below of"):
        m.Progress(step="a", index=2, of=2)
    assert m.Progress(step="a", index=0, of=1).index == 0


def test_heartbeat_reply_is_the_register_reply() -> None:
    assert m.HeartbeatReply is m.RegisterReply


def test_a_register_reply_of_an_older_scheduler_accepts_no_progress_on_a_claim() -> None:
    assert decode(m.RegisterReply, b'{"heartbeat_interval_s": 5}').claim_progress is False


def test_a_claim_without_progress_is_encoded_as_an_older_scheduler_takes_it() -> None:
    body = encode(m.ClaimRequest(task_id=TASK_ID, attempt=1, lease_id=LEASE_ID))
    assert json.loads(body) == {"task_id": str(TASK_ID), "attempt": 1, "lease_id": str(LEASE_ID)}
    assert decode(m.ClaimRequest, body).progress is None
    assert decode(m.ClaimRequest, body[:-1] + b', "progress": null}').progress is None


# -- properties ------------------------------------------------------------------------------------------

#: Text the store can keep (no NUL, no lone surrogate: `devsched.core.text`), which valid requests hold.
_storable = st.characters(exclude_characters="\0", exclude_categories=("Cs",))


def _text(*, min_size: int = 0, max_size: int | None = None) -> st.SearchStrategy[str]:
    return st.text(_storable, min_size=min_size, max_size=max_size)


#: What an environment can hold: a name without "=" or NUL, a value without NUL.
_env_names = _text(min_size=1, max_size=200).filter(lambda n: "=" not in n and "\0" not in n)
_env_values = _text().filter(lambda v: "\0" not in v)
_json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | _text()
_json_values = st.recursive(
    _json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
_tokens = st.from_regex(TOKEN_PATTERN, fullmatch=True)
_seconds = st.floats(min_value=1e-6, max_value=1e9, allow_nan=False, allow_infinity=False)


@st.composite
def _steps(draw: st.DrawFn, name: str) -> dict[str, Any]:
    kind = draw(st.sampled_from(["shell", "sleep", "noop", "plugin"]))
    args: dict[str, Any]
    if kind == "shell":
        args = {
            "command": draw(_text(min_size=1, max_size=200)),
            "env": draw(st.dictionaries(_env_names, _env_values, max_size=3)),
        }
        action = "shell"
    elif kind == "sleep":
        args, action = {"seconds": draw(_seconds | st.integers(1, 10**6))}, "sleep"
    elif kind == "noop":
        args, action = {}, "noop"
    else:
        args = draw(st.dictionaries(_text(max_size=8), _json_values, max_size=4))
        action = draw(_text(min_size=1, max_size=200).filter(lambda a: a not in m.BUILTIN_ARGS))
    step: dict[str, Any] = {"name": name, "action": action, "args": args}
    if draw(st.booleans()):
        step["timeout_s"] = draw(_seconds)
    step["interruptible"] = draw(st.booleans())
    step["always"] = draw(st.booleans())
    return step


@st.composite
def _submit_bodies(draw: st.DrawFn) -> dict[str, Any]:
    names = draw(st.lists(_text(min_size=1, max_size=20), min_size=1, max_size=100, unique=True))
    return {
        "name": draw(st.none() | _text(min_size=1, max_size=200)),
        "selector": {
            "labels": draw(st.dictionaries(_text(), _text(), max_size=3)),
            "device_id": draw(st.none() | _tokens),
        },
        "plan": {"steps": [draw(_steps(n)) for n in names]},
        "priority": draw(st.integers(-1000, 1000)),
        "max_attempts": draw(st.integers(1, 100)),
        "lease_ttl_s": draw(st.integers(1, 3600)),
        "idempotency_key": draw(st.none() | _text(min_size=1, max_size=200)),
        "metadata": draw(st.dictionaries(_text(max_size=8), _json_values, max_size=4)),
    }


@given(_submit_bodies())
def test_any_valid_submit_decodes_and_round_trips(body: dict[str, Any]) -> None:
    req = decode(m.SubmitRequest, json.dumps(body).encode())
    assert [s.name for s in req.plan.steps] == [s["name"] for s in body["plan"]["steps"]]
    again = decode(m.SubmitRequest, encode(req))
    assert again == req
    assert encode(again) == encode(req)


@given(st.integers(-(10**20), 10**20))
def test_priority_is_accepted_exactly_in_its_range(priority: int) -> None:
    body = json.dumps({"plan": {"steps": [{"name": "a", "action": "noop"}]}, "priority": priority}).encode()
    if -1000 <= priority <= 1000:
        assert decode(m.SubmitRequest, body).priority == priority
    else:
        with pytest.raises(InvalidRequest) as err:
            decode(m.SubmitRequest, body)
        assert err.value.details["errors"][0]["path"] == "priority"


@given(
    st.datetimes(
        min_value=datetime(1, 1, 2),
        max_value=datetime(9999, 12, 30),
        timezones=st.sampled_from([UTC, timezone(timedelta(hours=-7, minutes=-30)), timezone(timedelta(hours=14))]),
    )
)
def test_any_aware_timestamp_round_trips_as_the_same_instant(at: datetime) -> None:
    event = m.TaskEvent(event=EventKind.SUBMITTED, task_id=uuid.uuid4(), seq=1, status=TaskStatus.QUEUED, at=at)
    text = json.loads(encode(event))["at"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", text)
    assert decode(m.TaskEvent, encode(event)).at == at


def test_samples_are_not_accidentally_shared_models() -> None:
    # Guards the sample table itself: every model used in round trips is a pydantic model with a type.
    assert all(isinstance(s, BaseModel) for s in SAMPLES.values())
    assert T0.tzinfo is UTC


def test_a_drain_notice_and_a_nudge_tell_each_other_apart() -> None:
    # They share the host's nudge subject: each decodes only as itself, so an old agent ignores the notice.
    notice, nudge = encode(SAMPLES["DrainNotice"]), encode(SAMPLES["Nudge"])
    assert json.loads(notice) == {"drain": True, "reason": "kernel update"}
    assert decode(m.DrainNotice, notice) == SAMPLES["DrainNotice"]
    with pytest.raises(InvalidRequest):
        decode(m.Nudge, notice)
    with pytest.raises(InvalidRequest):
        decode(m.DrainNotice, nudge)
    with pytest.raises(InvalidRequest):
        decode(m.DrainNotice, b'{"drain": false}')


def test_a_register_reply_of_an_older_scheduler_takes_no_next_attempt_on_a_report() -> None:
    assert decode(m.RegisterReply, b'{"heartbeat_interval_s": 5}').take_next is False


def test_a_report_not_taking_the_next_attempt_is_encoded_as_an_older_scheduler_takes_it() -> None:
    body = encode(m.ReportRequest(task_id=TASK_ID, attempt=1, lease_id=LEASE_ID, outcome=Outcome.DONE))
    assert "take_next" not in json.loads(body)
    assert decode(m.ReportRequest, body).take_next is False
    taking = encode(
        m.ReportRequest(task_id=TASK_ID, attempt=1, lease_id=LEASE_ID, outcome=Outcome.DONE, take_next=True)
    )
    assert json.loads(taking)["take_next"] is True


def test_a_report_reply_of_an_older_scheduler_hands_nothing_over() -> None:
    reply = m.ReportReply(task_id=TASK_ID, attempt=1, status=TaskStatus.DONE, recorded_at=T1)
    assert "next" not in json.loads(encode(reply))
    assert decode(m.ReportReply, encode(reply)).next is None
