"""The scheduler's admission: reply subjects confined to the requester's inbox, fair share bookkeeping."""

from __future__ import annotations

import logging

import pytest

from devsched.core.fairshare import PerDevice, ShareLimits
from devsched.scheduler.admission import Admission, host_prefixes, reply_within
from devsched.scheduler.settings import SchedulerSettings

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def admission(clock: Clock, per_device: PerDevice | None = None, **limits: float) -> Admission:
    return Admission(
        host_inbox_prefixes=("_INBOX.{host_id}.", "_R_."),
        operator_inbox_prefixes=("_INBOX.",),
        limits=ShareLimits(
            max_in_flight=int(limits.get("max_in_flight", 2)),
            rate_per_s=limits.get("rate_per_s", 10.0),
            burst=int(limits.get("burst", 3)),
        ),
        per_device=per_device,
        clock=clock,
    )


@pytest.mark.parametrize(
    ("reply", "allowed"),
    [
        ("_INBOX.h1.abc.1", True),
        ("_R_.xyz.abc", True),
        ("_INBOX.h2.abc.1", False),  # another host's inbox
        ("_INBOX.h1.", False),  # the bare prefix is no inbox
        ("_INBOX.h1x.abc", False),  # a host whose id starts with h1
        ("_INBOX.abc", False),
        ("devsched.assign.h2", False),
        ("devsched.events.task.6b1f0c1e-3c5a-4d7e-9f00-000000000001", False),
        ("devsched.host.h2.nudge", False),
        ("$JS.API.STREAM.DELETE.DEVSCHED_EVENTS", False),
        ("_INBOX.h1.>", False),
        ("_INBOX.h1.*", False),
        ("", False),
        (None, False),
    ],
)
def test_a_host_is_answered_only_in_its_own_inbox(reply: str | None, allowed: bool) -> None:
    assert admission(Clock()).host_reply_allowed("h1", "devsched.host.h1.renew", reply) is allowed


def test_operator_replies_need_an_operator_inbox() -> None:
    a = admission(Clock())
    assert a.operator_reply_allowed("devsched.api.tasks.get", "_INBOX.abc.1")
    assert not a.operator_reply_allowed("devsched.api.tasks.get", "devsched.assign.h1")
    assert not a.operator_reply_allowed("devsched.api.tasks.get", None)


def test_helpers() -> None:
    assert host_prefixes(("_INBOX.{host_id}.", "_R_."), "b7") == ("_INBOX.b7.", "_R_.")
    assert reply_within("a.b", ("a.",))
    assert not reply_within("a.>", ("a.",))


def test_refusals_are_logged_with_the_host_and_rate_limited(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    a = admission(clock)
    with caplog.at_level(logging.WARNING, logger="devsched.scheduler.admission"):
        for _ in range(5):
            a.host_reply_allowed("h1", "devsched.host.h1.renew", "devsched.assign.h2")
        clock.now = 11.0
        a.host_reply_allowed("h1", "devsched.host.h1.renew", "devsched.assign.h2")
    records = [r for r in caplog.records if r.name == "devsched.scheduler.admission"]
    assert len(records) == 2
    assert records[0].__dict__["host_id"] == "h1"
    assert records[0].__dict__["reply"] == "devsched.assign.h2"
    assert records[1].__dict__["suppressed"] == 4


def test_shares_are_per_host_and_slots_come_back() -> None:
    clock = Clock()
    a = admission(clock, max_in_flight=2, burst=10)
    assert a.take("h1", "s") is None
    assert a.take("h1", "s") is None
    retry = a.take("h1", "s")
    assert retry is not None
    assert retry > 0
    assert a.take("h2", "s") is None  # another host is not affected
    assert a.in_flight("h1") == 2
    a.give_back("h1")
    assert a.in_flight("h1") == 1
    assert a.take("h1", "s") is None


def test_a_host_that_registered_devices_gets_their_share_too() -> None:
    clock = Clock()
    a = admission(clock, PerDevice(in_flight=1, rate_per_s=1.0, burst=2), max_in_flight=100, burst=3)
    a.registered("big", 4)  # burst 3 + 4 x 2
    assert [a.take("big", "s") for _ in range(11)] == [None] * 11
    assert a.take("big", "s") is not None
    assert [a.take("small", "s") for _ in range(3)] == [None] * 3  # no devices registered: the base share
    assert a.take("small", "s") is not None
    a.registered("big", 0)  # a withdrawal: back to the base share
    assert a.limits_of("big") == a.limits


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("operator_inbox_prefixes", "_INBOX"),
        ("operator_inbox_prefixes", "_INBOX.>"),
        ("host_inbox_prefixes", "_INBOX.{host}."),
        ("host_inbox_prefixes", ""),
    ],
)
def test_bad_prefixes_are_refused_with_the_setting_named(name: str, value: str) -> None:
    with pytest.raises(ValueError, match=name):
        SchedulerSettings(**{name: value})


def test_prefixes_read_comma_separated_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEVSCHED_HOST_INBOX_PREFIXES", "_R_., _INBOX.{host_id}.")
    assert SchedulerSettings().host_inbox_prefixes == ("_R_.", "_INBOX.{host_id}.")
