"""No orphans: the processes of a step do not outlive the agent, however it dies.

Two mechanisms, because neither covers everything:

- A parent-death signal. The process the agent starts for a step (its group's leader) has the kernel
  send it SIGKILL when the agent dies (`die_with_agent`, run in the child before exec). The kernel sends
  it when the *thread* that forked exits, so steps are started from the event loop's thread, which lives
  as long as the agent. It does not reach the leader's own children.
- Records and a sweep. Before a step's command runs, its process group (pgid, session, the leader's start
  time, the boot id) and its attempt are recorded in the spool's `groups/` (`StepGroups`); the record is
  removed once the group is stopped. At start, before anything else runs, each recorded group that still
  exists as the same group is killed (SIGKILL to the group), and every record is removed (`sweep`).

The same group: the kernel hands out no pid that a live process still has as its group or session id,
so while anything of the recorded group lives, no other group has its number. A group is killed only if
the boot is the recorded one, the process whose pid is the pgid (if any) has the recorded start time
(else the pid went to another process: the recorded group died out), and every live member is in the
recorded session and started no earlier than the recorded leader. A number reused by a group whose own
leader died too would pass only if the pid space wrapped round, a new session leader got that pid, forked
and died, all between two starts of the agent.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from devsched.agent.procfs import PROC, ProcStat, boot_id, group_members, processes, read_stat
from devsched.agent.spool import Records, Spool
from devsched.agent.steps import RunIdentity

logger = logging.getLogger(__name__)

#: The spool directory of the records.
KIND = "groups"
#: How long the sweep waits for the groups it killed to be gone.
SWEEP_WAIT_S = 2.0
_POLL_S = 0.02

_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_SIGKILL = int(signal.SIGKILL)
# Resolved here, in the parent: the child between fork and exec should do as little as it can.
_prctl = getattr(ctypes.CDLL(None, use_errno=True), "prctl", None)


def die_with_agent() -> Callable[[], None]:
    """A `preexec_fn` that has the kernel SIGKILL the child when this process (the agent) dies.

    Call it in the thread that starts the child: the signal comes when that thread exits.
    """
    agent = os.getpid()

    def arm() -> None:
        if _prctl is not None:
            _prctl(_PR_SET_PDEATHSIG, _SIGKILL, 0, 0, 0)
        if os.getppid() != agent:  # the agent died before the signal was armed
            os._exit(125)

    return arm


@dataclass(frozen=True, slots=True)
class GroupRecord:
    """One step's process group, as recorded before its command ran."""

    pgid: int
    session: int
    #: The leader's start time (clock ticks since boot).
    start_time: int
    #: The boot the start time counts from; None where the kernel does not say.
    boot_id: str | None
    task_id: str
    attempt: int
    lease_id: str
    device_id: str

    @property
    def key(self) -> str:
        """Its record's key: the leader's pid and start time."""
        return f"{self.pgid}.{self.start_time}"

    def log_fields(self) -> dict[str, object]:
        """Its attempt's ids and its pgid, for log lines."""
        return {
            "task_id": self.task_id,
            "attempt": self.attempt,
            "lease_id": self.lease_id,
            "device_id": self.device_id,
            "pgid": self.pgid,
        }

    def encode(self) -> bytes:
        """The record's bytes."""
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def decode(cls, body: bytes) -> GroupRecord:
        """A record from its bytes.

        Raises:
            ValueError: not a record.
        """
        try:
            data = json.loads(body)
            boot = data["boot_id"]
            return cls(
                pgid=int(data["pgid"]),
                session=int(data["session"]),
                start_time=int(data["start_time"]),
                boot_id=None if boot is None else str(boot),
                task_id=str(data["task_id"]),
                attempt=int(data["attempt"]),
                lease_id=str(data["lease_id"]),
                device_id=str(data["device_id"]),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a process group record: {exc!r}") from None


def left_running(record: GroupRecord, *, boot: str | None, proc: str = PROC) -> list[ProcStat]:
    """The live processes of the recorded group if it is still that group (module docstring), else none."""
    if record.boot_id is not None and boot is not None and record.boot_id != boot:
        return []  # another boot: every process of the recorded one is gone
    leader = read_stat(record.pgid, proc)
    if leader is not None and leader.start_time != record.start_time:
        return []  # the pid is another process's now: the recorded group died out
    members = group_members(record.pgid, proc)
    if any(p.session != record.session or p.start_time < record.start_time for p in members):
        return []  # a group of the same number, not the recorded one
    return members


class StepGroups:
    """The spool's records of step process groups (a `steps.GroupLedger`), and the sweep at start."""

    def __init__(self, records: Records, *, proc: str = PROC) -> None:
        self._records = records
        self._proc = proc
        self._boot = boot_id()
        self._keys: dict[int, str] = {}

    @classmethod
    def in_spool(cls, spool: Spool) -> StepGroups:
        """The records in `spool` (blocking: creates their directory)."""
        return cls(spool.records(KIND))

    async def record(self, pgid: int, identity: RunIdentity) -> None:
        """Record the group led by `pgid`, durably; a failure is logged and the step runs anyway."""
        fields = {"task_id": identity.task_id, "attempt": identity.attempt, "pgid": pgid}
        leader = read_stat(pgid, self._proc)
        if leader is None:
            logger.warning("step process group not recorded: its leader is gone", extra=fields)
            return
        record = GroupRecord(
            pgid=pgid,
            session=leader.session,
            start_time=leader.start_time,
            boot_id=self._boot,
            task_id=identity.task_id,
            attempt=identity.attempt,
            lease_id=identity.lease_id,
            device_id=identity.device_id,
        )
        try:
            await asyncio.to_thread(self._records.put, record.key, record.encode())
        except OSError as exc:
            logger.error("step process group could not be recorded", extra={**fields, "error": repr(exc)})
            return
        self._keys[pgid] = record.key

    async def forget(self, pgid: int) -> None:
        """Drop the record of the group led by `pgid`."""
        key = self._keys.pop(pgid, None)
        if key is None:
            return
        try:
            await asyncio.to_thread(self._records.remove, key)
        except OSError as exc:
            logger.error("step process group record not removed", extra={"pgid": pgid, "error": repr(exc)})

    def sweep(self) -> list[GroupRecord]:
        """Kill the recorded groups that still run, remove every record; the groups killed (blocking).

        Only at start, with the spool locked: every record is then an earlier agent's.
        """
        killed = []
        for key, body in self._records.items():
            try:
                record = GroupRecord.decode(body)
            except ValueError as exc:
                logger.warning("unreadable process group record dropped", extra={"spool_key": key, "error": str(exc)})
                self._records.remove(key)
                continue
            members = left_running(record, boot=self._boot, proc=self._proc)
            if members:
                try:
                    os.killpg(record.pgid, signal.SIGKILL)
                except ProcessLookupError:
                    pass  # ended meanwhile
                except PermissionError as exc:
                    logger.error(
                        "cannot kill step processes left by an earlier agent",
                        extra={**record.log_fields(), "error": str(exc)},
                    )
                else:
                    logger.warning(
                        "killed step processes left by an earlier agent",
                        extra={**record.log_fields(), "processes": len(members)},
                    )
                    killed.append(record)
            self._records.remove(key)
        self._wait_gone(killed)
        return killed

    def _wait_gone(self, killed: list[GroupRecord]) -> None:
        """Wait (bounded) until the killed groups are gone: their files may be in the attempt directories."""
        deadline = time.monotonic() + SWEEP_WAIT_S
        pgids = {record.pgid for record in killed}
        while pgids and time.monotonic() < deadline:
            live = {p.pgid for p in processes(self._proc) if p.alive}
            pgids &= live
            if pgids:
                time.sleep(_POLL_S)
        for pgid in pgids:
            logger.warning("step processes still there after SIGKILL", extra={"pgid": pgid})
