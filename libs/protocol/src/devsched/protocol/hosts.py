"""Hosts and devices: `P.api.hosts.list|drain`, `P.api.devices.drain|forget|label`, `P.host.<id>.register|heartbeat`."""

from __future__ import annotations

from collections import Counter
from typing import Annotated

from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from devsched.core.status import DeviceState
from devsched.protocol.base import (
    MAX_VERSION_CHARS,
    JsonObject,
    Labels,
    Lax,
    Name,
    Reason,
    ReplyModel,
    RequestModel,
    Seconds,
    Timestamp,
    Token,
    bounded_text,
    text_schema,
)
from devsched.protocol.plans import refuse_reserved_labels

__all__ = [
    "ActionOffer",
    "ActionView",
    "DeviceDrainView",
    "DeviceForgottenView",
    "DeviceRegistration",
    "DeviceView",
    "DrainRequest",
    "ForgetDeviceRequest",
    "HeartbeatReply",
    "HeartbeatRequest",
    "HostDrainRequest",
    "HostView",
    "HostsListReply",
    "HostsListRequest",
    "LabelDeviceRequest",
    "RegisterReply",
    "RegisterRequest",
]

#: Most actions a host may advertise.
MAX_ACTIONS = 100
#: Longest action name and version a host may advertise, in characters.
MAX_ACTION_NAME_CHARS = 200
MAX_ACTION_VERSION_CHARS = 100
#: Longest reason an operator may give for forgetting a device, in characters.
MAX_FORGET_REASON_CHARS = 1000
#: Most labels one `devices.label` request may pin or unpin.
MAX_OPERATOR_LABELS = 100


class HostsListRequest(RequestModel):
    """`P.api.hosts.list`: every registered host with its devices, by host id."""

    after: Token | None = Field(default=None, exclude_if=lambda v: v is None)
    """Addition: the `next` of the previous reply: only hosts after it; left out when null."""


class DeviceView(ReplyModel):
    """A device as operators see it."""

    device_id: Token
    """Unique across all hosts."""
    labels: dict[str, str]
    """What selectors match against."""
    state: Lax[DeviceState]
    """`available`, `reserved`, `offline`, `drained` or `quarantined` (an addition)."""
    drained: bool = False
    """Taken out of service by an operator (an addition; `state` shows `drained` first)."""
    drain_reason: str | None = None
    """Why it was drained (an addition)."""
    quarantined: bool = False
    """Taken out of service by the scheduler after consecutive infrastructure failures (an addition; `state`
    shows `quarantined` unless the device is also drained). A passing health check or a return to service
    (`drained: false`) lifts it."""
    quarantine_reason: str | None = None
    """Why it was quarantined (an addition), e.g. `3 consecutive infrastructure failures (last: infra)`."""
    quarantined_since: Timestamp | None = None
    """When it was quarantined (an addition)."""
    infra_failures: int = 0
    """Its consecutive infrastructure failures so far (an addition); a success resets it."""
    operator_labels: dict[str, str] = Field(default_factory=dict)
    """The labels an operator pinned (`P.api.devices.label`, an addition); `labels` shows them too, where
    they win over the host's."""


class ActionView(ReplyModel):
    """An action a host offers, as operators see it (an addition)."""

    name: Name
    """The action's name, as plans use it."""
    version: str | None = None
    """Its version (the plug-in package's), when the host said."""


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
    actions: list[ActionView] = Field(default_factory=list)
    """The actions of its latest registration, built-ins included (an addition); empty for an agent that
    predates plug-ins, which runs the built-ins only."""
    logs_closed_until: Timestamp | None = None
    """An addition: while set, the host's logs stream refuses its new records until then, because the host
    wrote past its output rate share; null when it takes them (or the answering replica does not watch)."""


class HostsListReply(ReplyModel):
    """Answer to a hosts list."""

    hosts: list[HostView]
    """Every registered host, by host id (up to `next`)."""
    next: str | None = None
    """Addition: set when the hosts left would make the reply larger than NATS's `max_payload`: pass it as
    `after` for the rest; null when every host is listed."""


class DrainRequest(RequestModel):
    """`P.api.devices.drain`: take a device out of service, or put it back."""

    device_id: Token
    """The device."""
    drained: bool = True
    """True: no new work goes to it (a running attempt goes on); false: back in service, which also lifts
    a quarantine."""
    reason: Reason | None = None
    """Why, for other operators. At most 1024 characters."""


class HostDrainRequest(RequestModel):
    """`P.api.hosts.drain` (an addition): drain every device a host lists, and tell its agent to finish.

    The agent finishes its running attempts, takes no more work, and exits 0 once idle. The devices stay
    drained when the agent starts again (`"drained": false` returns them all to service).
    """

    host_id: Token
    """The host."""
    drained: bool = True
    """True: drain the host's devices and tell its agent; false: return them to service."""
    reason: Reason | None = None
    """Why, for other operators (kept as each device's `drain_reason`). At most 1024 characters."""


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
    quarantined: bool = False
    """Taken out of service by the scheduler after consecutive infrastructure failures (an addition; `state`
    shows `quarantined` unless the device is also drained). A passing health check or a return to service
    (`drained: false`) lifts it."""
    quarantine_reason: str | None = None
    """Why it was quarantined (an addition), e.g. `3 consecutive infrastructure failures (last: infra)`."""
    quarantined_since: Timestamp | None = None
    """When it was quarantined (an addition)."""
    infra_failures: int = 0
    """Its consecutive infrastructure failures so far (an addition); a success resets it."""
    operator_labels: dict[str, str] = Field(default_factory=dict)
    """The labels an operator pinned (`P.api.devices.label`, an addition); `labels` shows them too, where
    they win over the host's."""


class ForgetDeviceRequest(RequestModel):
    """`P.api.devices.forget` (an addition): free a device from the host that registered it.

    A device id belongs to the host that first registered it; another host's registration naming it is
    refused (`device_conflict`) until an operator frees it. Refused (`conflict`) while it runs an attempt
    or is in its grace after an expired one.
    """

    device_id: Token
    """The device."""
    reason: str = Field(min_length=1, max_length=MAX_FORGET_REASON_CHARS)
    """Why, kept in the audit record."""


class DeviceForgottenView(ReplyModel):
    """Answer to a forget (an addition): what was freed, and the audit record of it."""

    device_id: Token
    """The device."""
    host_id: Token
    """The host it belonged to; the next host that registers it owns it."""
    freed_at: Timestamp
    """When it was freed (a repeated forget answers the first one)."""
    reason: str
    """The reason given."""
    actor: str
    """Who freed it: `operator-api` (the operator endpoint; there are no operator identities yet)."""
    audit_id: int
    """The audit record's id."""


class LabelDeviceRequest(RequestModel):
    """`P.api.devices.label` (an addition): pin operator labels on a device, or unpin them.

    Operator labels are kept apart from the host's and win: a host's registration can neither override
    nor remove them. Selectors match the effective labels, the host's overlaid by the operator's.
    """

    device_id: Token
    """The device."""
    labels: dict[str, str] = Field(default_factory=dict, max_length=MAX_OPERATOR_LABELS)
    """Labels to pin (a pinned key gets the new value)."""
    unset: list[Name] = Field(default_factory=list, max_length=MAX_OPERATOR_LABELS)
    """Keys to unpin: the host's value, if it asserts one, shows again."""

    _no_reserved_labels = field_validator("labels")(refuse_reserved_labels)

    @field_validator("unset")
    @classmethod
    def _no_reserved_keys(cls, unset: list[str], info: ValidationInfo) -> list[str]:
        refuse_reserved_labels(dict.fromkeys(unset, ""))
        both = sorted(set(info.data.get("labels") or ()) & set(unset))
        if both:
            raise PydanticCustomError(
                "label_set_and_unset", "a key is either set or unset, not both: {keys}", {"keys": ", ".join(both)}
            )
        return unset

    @model_validator(mode="after")
    def _something(self) -> LabelDeviceRequest:
        if not self.labels and not self.unset:
            raise PydanticCustomError("nothing_to_label", "give labels to set or keys to unset", {})
        return self


class DeviceRegistration(RequestModel):
    """One device a host offers."""

    device_id: Token
    """Unique across all hosts (another host's id: `device_conflict`)."""
    labels: Labels = Field(default_factory=dict)
    """What selectors match against: at most 100, keys and values at most 256 characters each."""

    _no_reserved_labels = field_validator("labels")(refuse_reserved_labels)


class ActionOffer(RequestModel):
    """An action a host runs, as it advertises it at registration (an addition)."""

    name: Name = Field(max_length=MAX_ACTION_NAME_CHARS)
    """The action's name, as plans use it."""
    version: str | None = Field(default=None, max_length=MAX_ACTION_VERSION_CHARS)
    """Its version (the plug-in package's)."""
    args_schema: JsonObject | None = None
    """The JSON Schema of its `args` (a plug-in's), which the scheduler checks at submit; null: unchecked."""


class RegisterRequest(RequestModel):
    """`P.host.<host_id>.register`: the host's full device list, replacing the previous one."""

    devices: list[DeviceRegistration] = Field(default_factory=list)
    """May be empty; device ids are unique within the request."""
    agent_version: Annotated[str, bounded_text(MAX_VERSION_CHARS), text_schema(MAX_VERSION_CHARS)] | None = None
    """The agent's version, for operators. At most 200 characters."""
    actions: list[ActionOffer] | None = Field(default=None, max_length=MAX_ACTIONS)
    """Every action the agent runs, built-ins included (an addition). Null (an agent that predates plug-ins):
    the built-ins only. Each plug-in among them becomes a reserved label on every device of the host."""

    @field_validator("actions")
    @classmethod
    def _unique_actions(cls, actions: list[ActionOffer] | None) -> list[ActionOffer] | None:
        repeated = sorted(a for a, n in Counter(a.name for a in actions or ()).items() if n > 1)
        if repeated:
            raise PydanticCustomError(
                "duplicate_action", "action names must be unique; repeated: {names}", {"names": ", ".join(repeated)}
            )
        return actions

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
    take_next: bool = False
    """Whether a report may carry `take_next` (an addition): the reply then hands the device's next attempt
    over, already dispatched. An older scheduler rejects the unknown field, and an older agent ignores this one."""
    renewals: bool = False
    """Whether the scheduler serves `P.host.<host_id>.renewals` (an addition): several leases renewed in one
    request. An older scheduler does not serve it, and an older agent ignores this field."""
    reports: bool = False
    """Whether the scheduler serves `P.host.<host_id>.reports` (an addition): several reports in one request.
    An older scheduler does not serve it, and an older agent ignores this field."""


class HeartbeatRequest(RequestModel):
    """`P.host.<host_id>.heartbeat`: a sign of life. Takes no fields."""


#: The heartbeat reply is the register reply.
HeartbeatReply = RegisterReply
