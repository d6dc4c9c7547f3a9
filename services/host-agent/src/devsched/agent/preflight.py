"""`devsched-agent --check-config`: what the agent would meet at start, checked without starting it.

The configuration file is read and validated first (a bad one exits 2, as a start would). Then, one line
each: the step user, the spool and work directories, and NATS (the credentials and TLS files read, then
connected to as this host, within a few seconds). Nothing is created, locked, registered or taken.
"""

from __future__ import annotations

import os
import pwd
from pathlib import Path

from devsched.agent.config import AgentConfig, ConfigError
from devsched.agent.workspace import check_secret_files, resolve_step_user
from devsched.service.preflight import Check, CheckFailed, passed, reach_nats


def _writable(path: Path) -> str:
    """Whether the agent's user may use `path` as a directory, or create it (nothing is created)."""
    if path.exists():
        if not path.is_dir():
            raise CheckFailed(f"{path} is not a directory")
        if not os.access(path, os.W_OK | os.X_OK):
            raise CheckFailed(f"{path} is not writable by {_me()}")
        return f"{path} is writable"
    parent = next(p for p in path.parents if p.exists())
    if not os.access(parent, os.W_OK | os.X_OK):
        raise CheckFailed(f"{path} does not exist and {_me()} cannot create it in {parent}")
    return f"{path} will be created"


def _me() -> str:
    try:
        return f"user {pwd.getpwuid(os.geteuid()).pw_name}"
    except KeyError:  # pragma: no cover - a uid without a passwd entry (some containers)
        return f"uid {os.geteuid()}"


def agent_checks(config: AgentConfig) -> list[Check]:
    """The agent's checks, in the order its start meets them."""

    async def step_user() -> str:
        user = resolve_step_user(config.step_user) if config.step_user is not None else None
        warnings = check_secret_files(config, user)
        who = f"steps run as {config.step_user}" if user is not None else f"steps run as the agent's {_me()}"
        return "; ".join([who, *warnings])

    async def spool() -> str:
        return _writable(config.spool_dir)

    async def work() -> str:
        return _writable(config.work_dir)

    async def nats() -> str:
        return await reach_nats(config, name=f"devsched-agent-{config.host_id}-check", host_id=config.host_id)

    return [
        passed("config", f"host {config.host_id}, {len(config.devices)} device(s)"),
        Check("step_user", step_user, (ConfigError,)),
        Check("spool_dir", spool),
        Check("work_dir", work),
        Check("NATS", nats),
    ]
