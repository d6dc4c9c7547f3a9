"""What `devsched up` keeps on disk, under one data directory (`./.devsched` by default).

```
.devsched/
  up.lock              held while a `devsched up` runs on this directory (a second one refuses)
  env                  `export DEVSCHED_NATS_URL=...` lines for the shell: `source .devsched/env`
  nats/                the embedded nats-server: JetStream store, config, nats.log
  postgres/            the embedded PostgreSQL: cluster (pgdata/), postgres.log
  agents/<host>.toml   the simulated hosts' agent configurations (rewritten by every `up`)
  agents/<host>/spool  their report spools (kept)
  examples/hello.yaml  a plan to try `devsched submit` with
  logs/                scheduler.log, sweeper.log, agent-<host>.log (appended, JSON lines)
```
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import IO

#: Label every simulated device has.
PLATFORM_LABEL = ("platform", "sim")
#: The pool of the hosts the demo's ordinary tasks run on.
MAIN_POOL = "main"
#: The pool of the last host when there are several: the demo crashes its agent once.
FLAKY_POOL = "flaky"

EXAMPLE_PLAN = """\
# A plan to try: devsched submit .devsched/examples/hello.yaml --selector platform=sim --wait
steps:
  - name: hello
    action: shell
    args:
      command: echo "hello from $DEVSCHED_DEVICE_ID (task $DEVSCHED_TASK_ID, attempt $DEVSCHED_ATTEMPT)"
  - name: work
    action: sleep
    args: {seconds: 3}
    interruptible: true
  - name: collect-logs
    action: shell
    args: {command: echo collecting logs}
    always: true
"""


class LockedError(Exception):
    """Another `devsched up` holds the data directory."""


@dataclass(frozen=True, slots=True)
class SimDevice:
    """A simulated device of a simulated host."""

    device_id: str
    labels: dict[str, str]


@dataclass(frozen=True, slots=True)
class SimHost:
    """A simulated host: one agent process with its devices."""

    host_id: str
    pool: str
    devices: tuple[SimDevice, ...]


def sim_hosts(hosts: int, devices_per_host: int) -> list[SimHost]:
    """`sim-1` ... `sim-N`, each with devices `sim-<n>-d1` ...; the last of several is in the flaky pool."""
    out: list[SimHost] = []
    for n in range(1, hosts + 1):
        host_id = f"sim-{n}"
        pool = FLAKY_POOL if hosts > 1 and n == hosts else MAIN_POOL
        devices = tuple(
            SimDevice(
                device_id=f"{host_id}-d{d}",
                labels={PLATFORM_LABEL[0]: PLATFORM_LABEL[1], "pool": pool, "host": host_id, "slot": str(d)},
            )
            for d in range(1, devices_per_host + 1)
        )
        out.append(SimHost(host_id, pool, devices))
    return out


def _toml_str(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def _toml_table(values: dict[str, str]) -> str:
    return "{ " + ", ".join(f"{_toml_str(k)} = {_toml_str(v)}" for k, v in values.items()) + " }"


class Layout:
    """The paths under the data directory."""

    def __init__(self, root: Path) -> None:
        self.root = root.absolute()
        self._lock: IO[str] | None = None

    @property
    def nats_dir(self) -> Path:
        """Home of the embedded nats-server."""
        return self.root / "nats"

    @property
    def postgres_dir(self) -> Path:
        """Home of the embedded PostgreSQL."""
        return self.root / "postgres"

    @property
    def logs_dir(self) -> Path:
        """Logs of the services and agents."""
        return self.root / "logs"

    @property
    def agents_dir(self) -> Path:
        """Agent configurations and spools."""
        return self.root / "agents"

    @property
    def env_file(self) -> Path:
        """Shell lines exporting how to reach the running stack."""
        return self.root / "env"

    @property
    def example_plan(self) -> Path:
        """A plan file to try `devsched submit` with."""
        return self.root / "examples" / "hello.yaml"

    def create(self) -> None:
        """Create the directories (kept between runs)."""
        for path in (self.root, self.logs_dir, self.agents_dir, self.example_plan.parent):
            path.mkdir(parents=True, exist_ok=True)
        if not self.example_plan.exists():
            self.example_plan.write_text(EXAMPLE_PLAN)

    def lock(self) -> None:
        """Take the directory's lock for this process.

        Raises:
            LockedError: another `devsched up` holds it.
        """
        handle = (self.root / "up.lock").open("a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "?"
            handle.close()
            raise LockedError(f"another `devsched up` (pid {holder}) is running on {self.root}") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        self._lock = handle

    def unlock(self) -> None:
        """Release the lock (also released by the OS when we exit)."""
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def agent_config(self, host: SimHost) -> Path:
        """The agent TOML of `host`."""
        return self.agents_dir / f"{host.host_id}.toml"

    def write_agent_config(self, host: SimHost, *, nats_url: str, prefix: str, creds: Path | None) -> Path:
        """Write the agent TOML of `host` (see ARCHITECTURE.md for the format) and return its path."""
        spool = self.agents_dir / host.host_id / "spool"
        spool.mkdir(parents=True, exist_ok=True)
        lines = [
            f"# Written by `devsched up` for the simulated host {host.host_id}; rewritten at every start.",
            f"host_id = {_toml_str(host.host_id)}",
            f"spool_dir = {_toml_str(str(spool))}",
            f"nats_url = {_toml_str(nats_url)}",
            f"subject_prefix = {_toml_str(prefix)}",
            "stop_grace_s = 2.0",
            "shutdown_grace_s = 3.0",
            "drain_timeout_s = 2.0",
        ]
        if creds is not None:
            lines.append(f"nats_creds = {_toml_str(str(creds))}")
        for device in host.devices:
            lines += [
                "",
                "[[devices]]",
                f"device_id = {_toml_str(device.device_id)}",
                f"labels = {_toml_table(device.labels)}",
                f"env = {_toml_table({'SIM_SERIAL': device.device_id.upper()})}",
            ]
        path = self.agent_config(host)
        path.write_text("\n".join(lines) + "\n")
        return path

    def write_env(self, values: dict[str, str]) -> None:
        """Write `export NAME=value` lines for `source .devsched/env`."""
        text = "".join(f"export {name}={shlex.quote(value)}\n" for name, value in values.items())
        self.env_file.write_text("# Written by `devsched up`: how to reach the stack it runs.\n" + text)
