from __future__ import annotations

import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from devsched.core.ids import TOKEN_PATTERN
from devsched.protocol import endpoints
from devsched.protocol.endpoints import ENDPOINTS, HOST_ENDPOINT_VERBS
from devsched.protocol.subjects import (
    DEFAULT_PREFIX,
    HostVerb,
    Subjects,
    assignment_msg_id,
    assignment_resend_msg_id,
    device_event_msg_id,
    event_msg_id,
)

pytestmark = pytest.mark.unit

TASK_ID = uuid.UUID("0b6f8d7e-2c1a-4e59-9a7f-3d2b1c0e9f11")
S = Subjects()


def test_default_prefix() -> None:
    assert S.prefix == DEFAULT_PREFIX == "devsched"
    assert Subjects() == Subjects("devsched")


def test_api_subjects() -> None:
    assert S.endpoint(endpoints.TASKS_SUBMIT) == "devsched.api.tasks.submit"
    assert S.endpoint(endpoints.TASKS_ARTIFACTS) == "devsched.api.tasks.artifacts"
    assert S.endpoint(endpoints.DEVICES_LABEL) == "devsched.api.devices.label"
    assert S.served(endpoints.HOSTS_LIST) == S.endpoint(endpoints.HOSTS_LIST) == "devsched.api.hosts.list"
    with pytest.raises(ValueError, match="not a host endpoint"):
        S.endpoint(endpoints.TASKS_GET, "h1")


def test_host_endpoint_subjects() -> None:
    assert S.endpoint(endpoints.HOST_CLAIM, "bench-07") == "devsched.host.bench-07.claim"
    assert S.served(endpoints.HOST_CLAIM) == "devsched.host.*.claim"
    with pytest.raises(ValueError, match="names the host"):
        S.endpoint(endpoints.HOST_CLAIM)
    with pytest.raises(ValueError, match="host id"):
        S.endpoint(endpoints.HOST_CLAIM, "*")


@pytest.mark.parametrize("verb", list(HostVerb))
def test_host_subjects(verb: HostVerb) -> None:
    assert S.host("bench-07", verb) == f"devsched.host.bench-07.{verb.value}"
    assert S.host("bench-07", verb.value) == S.host("bench-07", verb)
    assert S.parse_host(S.host("bench-07", verb)) == ("bench-07", verb)


def test_every_host_verb_but_nudge_is_an_endpoint() -> None:
    assert set(HOST_ENDPOINT_VERBS) == set(HostVerb) - {HostVerb.NUDGE}
    assert [e.verb for e in ENDPOINTS if e.host] == list(HOST_ENDPOINT_VERBS)


def test_host_id_of() -> None:
    assert S.host_id_of("devsched.host.h_1.report") == "h_1"


@pytest.mark.parametrize(
    "subject",
    [
        "devsched.host.h1",  # too short
        "devsched.host.h1.report.x",  # too long
        "other.host.h1.report",  # another deployment
        "devsched.api.h1.report",
        "devsched.host.h1.dance",  # unknown verb
        "devsched.host.*.report",  # a wildcard is not a host id
        "devsched.host..report",
    ],
)
def test_parse_host_rejects_other_subjects(subject: str) -> None:
    with pytest.raises(ValueError, match=r"host"):
        S.parse_host(subject)


@pytest.mark.parametrize("host_id", ["", "*", ">", "a.b", "a b", "h" * 65, "ä", "h1\n"])
def test_host_ids_must_be_tokens(host_id: str) -> None:
    with pytest.raises(ValueError, match="host id"):
        S.host(host_id, HostVerb.CLAIM)
    with pytest.raises(ValueError, match="host id"):
        S.assign(host_id)
    with pytest.raises(ValueError, match="host id"):
        Subjects.consumer(host_id)


def test_unknown_verb_is_rejected() -> None:
    with pytest.raises(ValueError, match="dance"):
        S.host("h1", "dance")


def test_jetstream_names() -> None:
    assert S.assign("h1") == "devsched.assign.h1"
    assert S.assign_all == "devsched.assign.>"
    assert S.task_events(TASK_ID) == f"devsched.events.task.{TASK_ID}"
    assert S.task_events(str(TASK_ID).upper()) == S.task_events(TASK_ID)
    assert S.task_events_all == "devsched.events.task.*"
    assert S.device_events("h1-d1") == "devsched.events.device.h1-d1"
    assert S.device_events_all == "devsched.events.device.*"
    assert S.events_all == "devsched.events.>"
    assert S.assignments_stream == "DEVSCHED_ASSIGNMENTS"
    assert S.events_stream == "DEVSCHED_EVENTS"
    assert S.consumer("h1") == "host-h1"


def test_task_events_needs_a_uuid() -> None:
    with pytest.raises(ValueError, match="badly formed"):
        S.task_events("*")


def test_service_name() -> None:
    assert S.service_name == "devsched-scheduler"
    assert S.queue_group == "devsched-scheduler"


def test_prefix_with_dash() -> None:
    s = Subjects("lab-2_x")
    assert s.assignments_stream == "LAB_2_X_ASSIGNMENTS"
    assert s.events_stream == "LAB_2_X_EVENTS"
    assert s.service_name == "lab-2_x-scheduler"
    assert s.endpoint(endpoints.TASKS_SUBMIT) == "lab-2_x.api.tasks.submit"
    assert s.served(endpoints.HOST_RENEW) == "lab-2_x.host.*.renew"
    assert s.parse_host("lab-2_x.host.h1.renew") == ("h1", HostVerb.RENEW)
    with pytest.raises(ValueError, match="prefix"):
        s.parse_host("devsched.host.h1.renew")


@pytest.mark.parametrize("prefix", ["", "a.b", "a b", "*", ">", "p" * 65, "dev/sched"])
def test_prefix_must_be_a_token(prefix: str) -> None:
    with pytest.raises(ValueError, match="prefix"):
        Subjects(prefix)


def test_subjects_is_an_immutable_value() -> None:
    assert hash(Subjects("a")) == hash(Subjects("a"))
    with pytest.raises(AttributeError):
        S.prefix = "other"  # type: ignore[misc]


def test_msg_ids() -> None:
    assert assignment_msg_id(TASK_ID, 2) == f"{TASK_ID}.2"
    assert event_msg_id(str(TASK_ID), 7) == f"{TASK_ID}:7"
    assert device_event_msg_id("h1-d1", 12) == "device.h1-d1.12"
    with pytest.raises(ValueError, match="device id"):
        device_event_msg_id("h1.>", 12)
    assert assignment_resend_msg_id(TASK_ID, 2, 1767225600123) == f"{TASK_ID}.2.resync.1767225600123"


@given(prefix=st.from_regex(TOKEN_PATTERN, fullmatch=True), host_id=st.from_regex(TOKEN_PATTERN, fullmatch=True))
def test_any_tokens_make_well_formed_subjects(prefix: str, host_id: str) -> None:
    s = Subjects(prefix)
    for verb in HostVerb:
        subject = s.host(host_id, verb)
        assert all(subject.split("."))  # no empty tokens
        assert s.parse_host(subject) == (host_id, verb)
    assert s.assignments_stream.replace("_", "").isalnum()
