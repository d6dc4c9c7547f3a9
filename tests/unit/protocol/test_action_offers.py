"""What hosts advertise of their actions, and the reserved action labels no one may write by hand."""

from __future__ import annotations

import pytest

from devsched.core.errors import InvalidRequest
from devsched.protocol import messages as m
from devsched.protocol.codec import decode


def errors_of(model: type[m.WireModel], body: bytes) -> list[dict[str, str]]:
    with pytest.raises(InvalidRequest) as caught:
        decode(model, body)
    return list(caught.value.details["errors"])


def test_a_registration_advertises_actions_with_versions_and_schemas() -> None:
    req = decode(
        m.RegisterRequest,
        b'{"devices": [], "actions": [{"name": "shell"}, {"name": "adb-instrument", "version": "0.1.0",'
        b' "args_schema": {"type": "object"}}]}',
    )
    assert req.actions is not None
    assert [(a.name, a.version, a.args_schema) for a in req.actions] == [
        ("shell", None, None),
        ("adb-instrument", "0.1.0", {"type": "object"}),
    ]
    assert decode(m.RegisterRequest, b'{"devices": []}').actions is None  # an agent from before plug-ins


def test_an_action_advertised_twice_is_refused() -> None:
    (error,) = errors_of(m.RegisterRequest, b'{"actions": [{"name": "flash"}, {"name": "flash"}]}')
    assert error["path"] == "actions"
    assert "repeated: flash" in error["message"]


@pytest.mark.parametrize(
    ("model", "body", "path"),
    [
        (m.RegisterRequest, b'{"devices": [{"device_id": "d1", "labels": {"devsched.action.x": "true"}}]}',
         "devices.0.labels"),
        (m.SubmitRequest, b'{"plan": {"steps": [{"name": "a", "action": "noop"}]},'
         b' "selector": {"labels": {"devsched.action.flash": "true"}}}', "selector.labels"),
    ],
)  # fmt: skip
def test_the_reserved_action_labels_cannot_be_written_by_hand(model: type[m.WireModel], body: bytes, path: str) -> None:
    (error,) = errors_of(model, body)
    assert error["path"] == path
    assert "reserved" in error["message"]
