"""Fixtures for the agent's unit tests."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import uvloop

from devsched.agent.runner import PlanRunner, PlanStep, RenewHook
from devsched.agent.stop import StopSignal

from .helpers import IDENTITY

#: Test modules that run each test on both loops: asyncio's, and uvloop's (the services' loop, `lifecycle.run`).
BOTH_LOOPS = {"test_shell"}


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> Mapping[str, Any]:
    """The shell action's tests run on asyncio's loop and on uvloop's (they start processes differently).

    The other tests here run on asyncio's alone (a hook must name a loop for every test it sees).
    """
    del config
    module = getattr(item, "module", None)
    if module is not None and module.__name__.rsplit(".", 1)[-1] in BOTH_LOOPS:
        return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
    return {"asyncio": asyncio.new_event_loop}


@pytest.fixture
def make_runner() -> Callable[..., PlanRunner]:
    """Build a PlanRunner with test defaults (short stop grace, no renewals)."""

    def build(
        steps: Sequence[PlanStep],
        *,
        stop: StopSignal | None = None,
        renew: RenewHook | None = None,
        **kwargs: Any,
    ) -> PlanRunner:
        options: dict[str, Any] = {"stop_grace_s": 0.5, **kwargs}
        if renew is not None:
            options["renew"] = renew
        return PlanRunner(steps, identity=IDENTITY, stop=stop or StopSignal(), **options)

    return build


@pytest.fixture(autouse=True)
def _no_stray_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("DEVSCHED_NATS_URL", "DEVSCHED_SUBJECT_PREFIX", "DEVSCHED_NATS_CREDS"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def passable() -> Iterator[Path]:
    """A 0755 directory under the system temp dir (pytest's tmp_path has a 0700 parent others cannot pass)."""
    path = Path(tempfile.mkdtemp(prefix="devsched-agent-test-"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)
