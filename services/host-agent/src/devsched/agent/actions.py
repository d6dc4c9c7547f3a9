"""The action registry: `shell`, `sleep`, `noop`, and the plug-ins of the `devsched.actions` entry points.

An action is an async callable taking a `StepContext` and returning an `ActionResult`; it honours the
step's timeout and interrupt itself (the runner only keeps a backstop). Arguments are validated per
action; bad ones raise `ActionError`, which fails the step with the message in its output tail.

The registry also knows what the host advertises of each action when it registers (`offers`): its
version and, for a plug-in, the JSON Schema of its args. A plug-in that cannot be loaded is logged and
left out: the host does not advertise it, so no task that needs it comes here. A schema that breaks the
scheduler's bounds (`devsched.core.schema_limits`) is logged and not advertised: the scheduler would refuse
the registration, and the action still runs, its args checked here only.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Mapping
from importlib.metadata import entry_points

from devsched.agent.shell import shell
from devsched.agent.steps import Action, ActionError, ActionPlugin, ActionResult, StepContext, parse_args
from devsched.core.actions import BUILTIN_ACTIONS
from devsched.core.schema_limits import schema_limit_problem
from devsched.protocol.hosts import ActionOffer
from devsched.protocol.plans import NoopArgs, SleepArgs, StepStatus

log = logging.getLogger(__name__)

#: The entry-point group plug-in packages declare their actions in.
PLUGIN_GROUP = "devsched.actions"


class ActionRegistry:
    """Actions by name."""

    def __init__(self, actions: Mapping[str, Action] | None = None) -> None:
        self._actions: dict[str, Action] = {}
        self._offers: dict[str, ActionOffer] = {}
        for name, action in (actions or {}).items():
            self.register(name, action)

    def register(
        self,
        name: str,
        action: Action,
        *,
        replace: bool = False,
        version: str | None = None,
        args_schema: dict[str, object] | None = None,
    ) -> None:
        """Make `action` available to steps as `name`, advertised with `version` and `args_schema`.

        Raises:
            ValueError: `name` is taken and `replace` is false.
        """
        if name in self._actions and not replace:
            raise ValueError(f"action {name!r} is already registered")
        self._actions[name] = action
        self._offers[name] = ActionOffer.model_validate({"name": name, "version": version, "args_schema": args_schema})

    def offers(self) -> list[ActionOffer]:
        """What the host advertises at registration: every action, by name."""
        return [self._offers[name] for name in sorted(self._offers)]

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


def advertised_schema(action: str, schema: dict[str, object] | None) -> dict[str, object] | None:
    """`schema`, or None when it breaks the scheduler's bounds (logged).

    The scheduler would refuse the whole registration; unadvertised, the action is checked only here, by
    the plug-in's model, when a step runs.
    """
    if schema is not None and (problem := schema_limit_problem(schema)) is not None:
        log.warning("plug-in args schema not advertised", extra={"action": action, "error": f"args schema {problem}"})
        return None
    return schema


def load_plugins(registry: ActionRegistry, *, group: str = PLUGIN_GROUP) -> list[str]:
    """Add every action of the installed plug-in packages (entry points of `group`); returns their names.

    A plug-in that fails to load, is not an `ActionPlugin`, or takes a built-in's or another plug-in's name
    is logged as an error and left out.
    """
    loaded = []
    for entry in sorted(entry_points(group=group), key=lambda e: e.name):
        where = {"action": entry.name, "entry_point": entry.value}
        try:
            plugin = entry.load()
            if not isinstance(plugin, ActionPlugin):
                raise TypeError(f"{entry.value} is a {type(plugin).__name__}, not an ActionPlugin")
            if entry.name in BUILTIN_ACTIONS or entry.name in registry:
                raise ValueError(f"action {entry.name!r} is already registered")
            version = plugin.version or (entry.dist.version if entry.dist is not None else None)
            schema = advertised_schema(entry.name, plugin.args.model_json_schema() if plugin.args is not None else None)
            registry.register(entry.name, plugin.run, version=version, args_schema=schema)
        except Exception as exc:
            log.error("plug-in action not loaded", extra={**where, "error": repr(exc)})
            continue
        log.info("plug-in action loaded", extra={**where, "version": version})
        loaded.append(entry.name)
    return loaded


def agent_registry() -> ActionRegistry:
    """The registry of a real agent: the built-ins and every installed plug-in."""
    registry = default_registry()
    load_plugins(registry)
    return registry


__all__ = [
    "PLUGIN_GROUP",
    "ActionError",
    "ActionPlugin",
    "ActionRegistry",
    "agent_registry",
    "default_registry",
    "load_plugins",
    "noop",
    "shell",
    "sleep",
]
