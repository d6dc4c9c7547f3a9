"""Hosts and devices: `P.api.hosts.list|drain`, `P.api.devices.drain`, `P.host.<id>.register|heartbeat`."""

from __future__ import annotations

from collections import Counter

from pydantic import Field, field_validator
from pydantic_core import PydanticCustomError

from devsched.core.status import DeviceState
from devsched.protocol.base import Lax, ReplyModel, RequestModel, Seconds, Timestamp, Token


class HostsListRequest(RequestModel):
    """`P.api.hosts.list`: every registered host with its devices. Takes no fields."""


class DeviceView(ReplyModel):
    """A device as operators see it."""

    device_id: Token
    """Unique across all hosts."""
    labels: dict[str, str]
    """What selectors match against."""
    state: Lax[DeviceState]
    """`available`, `reserved`, `offline` or `drained`."""
    drained: bool = False
    """Taken out of service by an operator (an addition; `state` shows `drained` first)."""
    drain_reason: str | None = None
    """Why it was drained (an addition)."""


class HostView(ReplyModel):
    """A registered host."""

    host_id: Token
    """The host's id (a subject token)."""
    online: bool
    """False once the host has been silent for 3 heartbeat intervals."""
    last_seen_at: Timestamp
    """Its latest request of any kind."""
    agent_version: str | None = None
    """What the agent said at registration (an addition)."""
    devices: list[DeviceView]
    """The devices of its latest registration (plus any still running an attempt)."""


class HostsListReply(ReplyModel):
    """Answer to a hosts list."""

    hosts: list[HostView]
    """Every registered host."""


class DrainRequest(RequestModel):
    """`P.api.devices.drain`: take a device out of service, or put it back."""

    device_id: Token
    """The device."""
    drained: bool = True
    """True: no new work goes to it (a running attempt goes on); false: back in service."""
    reason: str | None = None
    """Why, for other operators."""


class HostDrainRequest(RequestModel):
    """`P.api.hosts.drain` (an addition): drain every device a host lists, and tell its agent to finish.

    The agent finishes its running attempts, takes no more work, and exits 0 once idle. The devices stay
    drained when the agent starts again (`"drained": false` returns them all to service).
    """

    host_id: Token
    """The host."""
    drained: bool = True
    """True: drain the host's devices and tell its agent; false: return them to service."""
    reason: str | None = None
    """Why, for other operators (kept as each device's `drain_reason`)."""


class DeviceDrainView(ReplyModel):
    """Answer to a drain: the device after the change."""

    device_id: Token
    """The device."""
    host_id: Token
    """The host that registered it."""
    labels: dict[str, str]
    """Its labels."""
    state: Lax[DeviceState]
    """Its state now."""
    drained: bool
    """Whether it is out of service; survives re-registration of its host."""
    drain_reason: str | None = None
    """The reason given with the drain."""


class DeviceRegistration(RequestModel):
    """One device a host offers."""

    device_id: Token
    """Unique across all hosts (another host's id: `device_conflict`)."""
    labels: dict[str, str] = Field(default_factory=dict)
    """What selectors match against."""


class RegisterRequest(RequestModel):
    """`P.host.<host_id>.register`: the host's full device list, replacing the previous one."""

    devices: list[DeviceRegistration] = Field(default_factory=list)
    """May be empty; device ids are unique within the request."""
    agent_version: str | None = None
    """The agent's version, for operators."""

    @field_validator("devices")
    @classmethod
    def _unique_ids(cls, devices: list[DeviceRegistration]) -> list[DeviceRegistration]:
        repeated = sorted(d for d, n in Counter(d.device_id for d in devices).items() if n > 1)
        if repeated:
            raise PydanticCustomError(
                "duplicate_device_id",
                "device ids must be unique; repeated: {ids}",
                {"ids": ", ".join(repeated)},
            )
        return devices


class RegisterReply(ReplyModel):
    """Answer to register and heartbeat: how often to send a sign of life."""

    heartbeat_interval_s: Seconds
    """Seconds between heartbeats; 3 missed intervals make the host offline."""
    claim_progress: bool = False
    """Whether a claim may carry `progress` (an addition): an older scheduler rejects the unknown field,
    and an older agent ignores this one."""


class HeartbeatRequest(RequestModel):
    """`P.host.<host_id>.heartbeat`: a sign of life. Takes no fields."""


#: The heartbeat reply is the register reply.
HeartbeatReply = RegisterReply
