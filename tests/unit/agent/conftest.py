"""Fixtures for the agent's unit tests."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from devsched.agent.runner import PlanRunner, PlanStep, RenewHook
from devsched.agent.stop import StopSignal

from .helpers import IDENTITY


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
