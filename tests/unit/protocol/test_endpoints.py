"""The endpoint table: every name derived from one entry, and a handler bound to each entry exactly once."""

from __future__ import annotations

import pytest

from devsched.protocol import endpoints
from devsched.protocol import messages as m
from devsched.protocol.endpoints import ENDPOINTS, handlers, handles
from devsched.protocol.subjects import Subjects

pytestmark = pytest.mark.unit


def test_names_and_subjects_are_unique() -> None:
    s = Subjects("lab")
    assert len({e.name for e in ENDPOINTS}) == len(ENDPOINTS)
    assert len({s.served(e) for e in ENDPOINTS}) == len(ENDPOINTS)
    assert all(e.name == f"{e.group}-{e.verb}" for e in ENDPOINTS)
    assert endpoints.HOST_RENEW.host
    assert not endpoints.HOSTS_LIST.host


class _OneHandler:
    @handles(endpoints.TASKS_GET)
    async def get(self, req: m.GetTaskRequest, subject: str) -> m.TaskView:
        raise NotImplementedError


def test_an_endpoint_without_a_handler_is_named() -> None:
    with pytest.raises(LookupError, match="tasks-submit has 0 handlers on _OneHandler"):
        handlers(_OneHandler())


def test_an_endpoint_with_two_handlers_is_named() -> None:
    class Twice(_OneHandler):
        @handles(endpoints.TASKS_GET)
        async def get_again(self, req: m.GetTaskRequest, subject: str) -> m.TaskView:
            raise NotImplementedError

    every = {e.name: e for e in ENDPOINTS}
    for name, endpoint in every.items():  # the others once each, so that only tasks-get is wrong
        if name != "tasks-get":
            setattr(Twice, name.replace("-", "_"), handles(endpoint)(lambda self, req, subject: None))
    with pytest.raises(LookupError, match="tasks-get has 2 handlers"):
        handlers(Twice())


@pytest.mark.parametrize(("group", "verb"), [("tasks", "a.b"), ("*", "get"), ("tasks", ""), ("tasks", "submit")])
def test_an_entry_must_be_tokens_and_new(group: str, verb: str) -> None:
    with pytest.raises(ValueError, match=r"token|twice"):
        endpoints._declare(group, verb, m.GetTaskRequest, m.TaskView)
    assert len(endpoints._declared) == len(ENDPOINTS)
