from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from devsched.agent.actions import ActionRegistry, default_registry, noop, sleep
from devsched.agent.steps import ActionError, ActionResult, StepContext, tail_text
from devsched.protocol.plans import StepStatus

from .helpers import IDENTITY

pytestmark = pytest.mark.unit


def context(args: dict[str, Any], *, timeout_s: float = 30.0, interrupt: asyncio.Event | None = None) -> StepContext:
    return StepContext(
        args=args,
        device_env={},
        identity=IDENTITY,
        interrupt=interrupt or asyncio.Event(),
        timeout_s=timeout_s,
        stop_grace_s=0.5,
    )


async def custom(ctx: StepContext) -> ActionResult:
    return ActionResult(StepStatus.DONE, 0, "custom")


def test_default_registry_has_the_builtin_actions() -> None:
    registry = default_registry()
    assert list(registry) == ["noop", "shell", "sleep"]
    assert "shell" in registry
    assert "flash" not in registry


def test_unknown_action_names_what_the_agent_has() -> None:
    with pytest.raises(ActionError, match=r"unknown action 'flash' \(this agent has: noop, shell, sleep\)"):
        default_registry().get("flash")


def test_actions_can_be_plugged_in_but_not_silently_replaced() -> None:
    registry = default_registry()
    registry.register("flash", custom)
    assert registry.get("flash") is custom
    with pytest.raises(ValueError, match="already registered"):
        registry.register("sleep", custom)
    registry.register("sleep", custom, replace=True)
    assert registry.get("sleep") is custom
    assert list(ActionRegistry()) == []


async def test_noop_succeeds_and_takes_no_arguments() -> None:
    assert (await noop(context({}))).status is StepStatus.DONE
    with pytest.raises(ActionError, match="x: unknown argument"):
        await noop(context({"x": 1}))


async def test_sleep_sleeps() -> None:
    started = time.monotonic()
    result = await sleep(context({"seconds": 0.05}))
    assert result.status is StepStatus.DONE
    assert time.monotonic() - started >= 0.05


async def test_sleep_longer_than_its_timeout_times_out() -> None:
    result = await sleep(context({"seconds": 60}, timeout_s=0.05))
    assert result.status is StepStatus.TIMED_OUT
    assert "exceeds timeout_s 0.05" in result.output_tail


async def test_sleep_wakes_early_when_interrupted() -> None:
    interrupt = asyncio.Event()
    task = asyncio.create_task(sleep(context({"seconds": 60}, interrupt=interrupt)))
    await asyncio.sleep(0)
    interrupt.set()
    result = await asyncio.wait_for(task, 20)
    assert result.status is StepStatus.INTERRUPTED


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ({}, "seconds: Field required"),
        ({"seconds": 0}, "seconds: Input should be greater than 0"),
        ({"seconds": -1.5}, "seconds: Input should be greater than 0"),
        ({"seconds": "5"}, "seconds: Input should be a valid number"),
        ({"seconds": True}, "seconds: Input should be a valid number"),
        ({"seconds": float("nan")}, "seconds: Input should be a finite number"),
        ({"seconds": 1, "extra": 1}, "extra: unknown argument"),
    ],
)
async def test_sleep_arguments_are_validated(args: dict[str, Any], expected: str) -> None:
    with pytest.raises(ActionError, match="invalid args for action 'sleep'") as caught:
        await sleep(context(args))
    assert expected in str(caught.value)


def test_tail_text_drops_a_character_cut_in_half() -> None:
    data = "aé".encode() * 10  # 3 bytes per pair
    # The last 4 bytes start with the second byte of an é: dropped, not shown as a replacement character.
    assert tail_text(data, limit=4) == "aé"
    assert tail_text(b"short", limit=100) == "short"
    assert tail_text(b"\xff\xfe", limit=100) == "\ufffd\ufffd"
