"""The error hierarchy against PROTOCOL.md's error table."""

from __future__ import annotations

import pytest

from devsched.core import errors
from devsched.core.errors import (
    BY_CODE,
    Conflict,
    DevschedError,
    IllegalTransition,
    Internal,
)

pytestmark = pytest.mark.unit

# PROTOCOL.md "Errors": number and code, row by row.
PROTOCOL_TABLE = {
    "invalid_request": 400,
    "not_found": 404,
    "lease_expired": 409,
    "lease_superseded": 409,
    "lease_foreign": 409,
    "task_terminal": 409,
    "outcome_conflict": 409,
    "cancel_not_requested": 409,
    "device_conflict": 409,
    "too_large": 413,
    "unavailable": 503,
    "internal": 500,
    # docs/protocol.md, additions:
    "too_many_requests": 429,
    "artifact_too_large": 413,
    "artifact_quota_exceeded": 413,
    "upload_mismatch": 400,
    "upload_timeout": 408,
    "reply_too_large": 500,
    "storage_full": 507,
}

ALL_CLASSES = [obj for obj in vars(errors).values() if isinstance(obj, type) and issubclass(obj, DevschedError)]


def test_every_protocol_code_has_a_class_with_its_number() -> None:
    assert set(BY_CODE) == set(PROTOCOL_TABLE)
    for code, number in PROTOCOL_TABLE.items():
        cls = BY_CODE[code]
        assert cls.code == code
        assert cls.status == number


@pytest.mark.parametrize("cls", ALL_CLASSES, ids=lambda c: c.__name__)
def test_every_class_has_a_protocol_code_and_a_docstring(cls: type[DevschedError]) -> None:
    assert cls.code in PROTOCOL_TABLE or cls is Conflict
    assert cls.__doc__
    assert isinstance(cls.status, int)
    assert isinstance(cls.retryable, bool)


@pytest.mark.parametrize("code", [c for c, n in PROTOCOL_TABLE.items() if n == 409])
def test_409_codes_are_conflicts(code: str) -> None:
    assert issubclass(BY_CODE[code], Conflict)


def test_only_unavailable_and_too_many_requests_are_retryable() -> None:
    # a 429 changed nothing either: the same request may be sent again after its retry_after_s
    assert {cls.code for cls in ALL_CLASSES if cls.retryable} == {"unavailable", "too_many_requests"}


def test_decoding_by_code_round_trips() -> None:
    for cls in BY_CODE.values():
        err = cls("msg", x=1)
        assert BY_CODE[err.code] is cls


def test_illegal_transition_decodes_as_internal() -> None:
    assert BY_CODE[IllegalTransition.code] is Internal


@pytest.mark.parametrize("cls", ALL_CLASSES, ids=lambda c: c.__name__)
def test_default_message_is_the_first_docstring_line(cls: type[DevschedError]) -> None:
    err = cls()
    assert cls.__doc__
    assert err.message == cls.__doc__.strip().splitlines()[0]
    assert str(err) == err.message
    assert err.details == {}


def test_message_and_details() -> None:
    err = errors.LeaseForeign("not yours", host_id="h2", owner="h1")
    assert err.message == "not yours"
    assert str(err) == "not yours"
    assert err.details == {"host_id": "h2", "owner": "h1"}
    assert isinstance(err, Conflict)
    assert isinstance(err, DevschedError)
    assert isinstance(err, Exception)


def test_class_without_docstring_falls_back_to_its_code() -> None:
    class Nameless(DevschedError):
        code = "nameless"

    assert Nameless().message == "nameless"


def test_details_are_per_instance() -> None:
    a, b = errors.NotFound(task_id="1"), errors.NotFound()
    assert a.details == {"task_id": "1"}
    assert b.details == {}
