"""Helpers of the agent's integration tests: plan steps, and an agent serving in the test's loop."""

from __future__ import annotations

import asyncio
from typing import Any

from devsched.agent.agent import Agent
from devsched.agent.config import AgentConfig
from devsched.protocol import messages as m
from support.polling import eventually

HOST = "host-a"


def step(name: str, action: str, args: dict[str, Any] | None = None, **options: Any) -> m.Step:
    """A plan step."""
    return m.Step(name=name, action=action, args=args or {}, **options)


def shell(name: str, command: str, **options: Any) -> m.Step:
    """A `shell` plan step."""
    return step(name, "shell", {"command": command}, **options)


class Running:
    """An agent serving in a task of the test's loop."""

    def __init__(self, config: AgentConfig) -> None:
        self.agent = Agent(config)
        self.stop = asyncio.Event()
        self.task = asyncio.create_task(self.agent.serve(self.stop))

    async def ready(self) -> None:
        await eventually(lambda: self.agent.bound.is_set() or self.task.done(), message="agent bound")
        assert not self.task.done(), self.task.result()

    async def shut_down(self, within_s: float = 30) -> int:
        self.stop.set()
        return await asyncio.wait_for(self.task, within_s)
