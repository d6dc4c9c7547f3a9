"""The action registry: `shell`, `sleep`, `noop`, and whatever else an agent plugs in.

An action is an async callable taking a `StepContext` and returning an `ActionResult`; it honours the
step's timeout and interrupt itself (the runner only keeps a backstop). Arguments are validated per
action; bad ones raise `ActionError`, which fails the step with the message in its output tail.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping

from devsched.agent.shell import shell
from devsched.agent.steps import Action, ActionError, ActionResult, StepContext, parse_args
from devsched.protocol.plans import NoopArgs, SleepArgs, StepStatus


class ActionRegistry:
    """Actions by name."""

    def __init__(self, actions: Mapping[str, Action] | None = None) -> None:
        self._actions: dict[str, Action] = {}
        for name, action in (actions or {}).items():
            self.register(name, action)

    def register(self, name: str, action: Action, *, replace: bool = False) -> None:
        """Make `action` available to steps as `name`.

        Raises:
            ValueError: `name` is taken and `replace` is false.
        """
        if name in self._actions and not replace:
            raise ValueError(f"action {name!r} is already registered")
        self._actions[name] = action

    def get(self, name: str) -> Action:
        """The action called `name`.

        Raises:
            ActionError: no such action on this agent.
        """
        try:
            return self._actions[name]
        except KeyError:
            known = ", ".join(sorted(self._actions))
            raise ActionError(f"unknown action {name!r} (this agent has: {known})") from None

    def __contains__(self, name: object) -> bool:
        return name in self._actions

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._actions))


async def noop(ctx: StepContext) -> ActionResult:
    """Do nothing, successfully."""
    parse_args(NoopArgs, "noop", ctx.args)
    return ActionResult(StepStatus.DONE)


async def sleep(ctx: StepContext) -> ActionResult:
    """Sleep `seconds`; wake early when interrupted; time out when `seconds` exceeds `timeout_s`."""
    args = parse_args(SleepArgs, "sleep", ctx.args)
    try:
        async with asyncio.timeout(min(args.seconds, ctx.timeout_s)):
            await ctx.interrupt.wait()
    except TimeoutError:
        if args.seconds <= ctx.timeout_s:
            return ActionResult(StepStatus.DONE)
        return ActionResult(
            StepStatus.TIMED_OUT, None, f"sleep of {args.seconds:g} s exceeds timeout_s {ctx.timeout_s:g}"
        )
    return ActionResult(StepStatus.INTERRUPTED)


def default_registry() -> ActionRegistry:
    """A registry with the built-in actions `shell`, `sleep` and `noop`."""
    return ActionRegistry({"shell": shell, "sleep": sleep, "noop": noop})


__all__ = ["ActionError", "ActionRegistry", "default_registry", "noop", "shell", "sleep"]
