"""Every request/reply endpoint of the protocol, declared once: group, verb, request model, reply model.

As nats.py micro's `add_group(name=...)` then `add_endpoint(name=...)`, the rest is derived from the entry:
its subject (`Subjects.endpoint`, `Subjects.served`), its micro name, its `$SRV.INFO` schemas, a host's
NATS permissions (deploy/nats/host_user.py) and what the clients send and decode. The scheduler binds each
entry to the handler that `@handles` it. Entries are listed in the order `nats micro info` lists them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from devsched.core.ids import is_token
from devsched.protocol import messages as m
from devsched.protocol.subjects import HostVerb

Req = TypeVar("Req", bound=BaseModel)
Rep = TypeVar("Rep", bound=BaseModel)

#: The group of the host endpoints: `P.host.<host_id>.<verb>`, whose subject names the requesting host.
HOST_GROUP = "host"


@dataclass(frozen=True, slots=True, eq=False)
class Endpoint(Generic[Req, Rep]):
    """One request/reply endpoint: `P.api.<group>.<verb>`, or `P.host.<host_id>.<verb>` for group `host`.

    Compared by identity: each is one entry of `ENDPOINTS`.
    """

    group: str
    """The resource (`tasks`, `hosts`, ...), or `host` for a host's own requests."""
    verb: str
    """The last token of the subject."""
    request: type[Req]
    """The model of a request."""
    reply: type[Rep]
    """The model of a success reply."""

    @property
    def name(self) -> str:
        """The micro endpoint name, `<group>-<verb>` (`tasks-submit`, `host-claim`), as `nats micro info` lists it."""
        return f"{self.group}-{self.verb}"

    @property
    def host(self) -> bool:
        """A host's endpoint: served on `P.host.*.<verb>`, the host id taken from the request's subject."""
        return self.group == HOST_GROUP


_declared: list[Endpoint[Any, Any]] = []


def _declare(group: str, verb: str, request: type[Req], reply: type[Rep]) -> Endpoint[Req, Rep]:
    if not (is_token(group) and is_token(verb)):
        raise ValueError(f"an endpoint's group and verb are subject tokens, got {group!r} {verb!r}")
    endpoint = Endpoint(group, verb, request, reply)
    if any(e.name == endpoint.name for e in _declared):
        raise ValueError(f"endpoint {endpoint.name} declared twice")
    _declared.append(endpoint)
    return endpoint


def _host(verb: HostVerb, request: type[Req], reply: type[Rep]) -> Endpoint[Req, Rep]:
    return _declare(HOST_GROUP, verb.value, request, reply)


# -- operators and clients: `P.api.<group>.<verb>` ---------------------------------------------------------------

TASKS_SUBMIT = _declare("tasks", "submit", m.SubmitRequest, m.SubmitReply)
TASKS_GET = _declare("tasks", "get", m.GetTaskRequest, m.TaskView)
TASKS_LIST = _declare("tasks", "list", m.ListTasksRequest, m.ListTasksReply)
TASKS_CANCEL = _declare("tasks", "cancel", m.CancelRequest, m.CancelReply)
HOSTS_LIST = _declare("hosts", "list", m.HostsListRequest, m.HostsListReply)
DEVICES_DRAIN = _declare("devices", "drain", m.DrainRequest, m.DeviceDrainView)
#: (an addition) drain every device of a host and tell its agent.
HOSTS_DRAIN = _declare("hosts", "drain", m.HostDrainRequest, m.HostView)
#: (an addition) free a device from its host; operators only.
DEVICES_FORGET = _declare("devices", "forget", m.ForgetDeviceRequest, m.DeviceForgottenView)
#: (an addition) pin or unpin operator labels on a device; operators only.
DEVICES_LABEL = _declare("devices", "label", m.LabelDeviceRequest, m.DeviceDrainView)
#: (an addition) the artifacts of a task.
TASKS_ARTIFACTS = _declare("tasks", "artifacts", m.ListArtifactsRequest, m.ListArtifactsReply)
#: (an addition) create or replace a health check; operators only.
HEALTH_SET = _declare("health", "set", m.HealthCheckSetRequest, m.HealthCheckView)
#: (an addition) the health checks in force; operators only.
HEALTH_LIST = _declare("health", "list", m.HealthCheckListRequest, m.HealthCheckListReply)
#: (an addition) remove a health check; operators only.
HEALTH_DELETE = _declare("health", "delete", m.HealthCheckDeleteRequest, m.HealthCheckView)

# -- hosts: `P.host.<host_id>.<verb>` ----------------------------------------------------------------------------

HOST_REGISTER = _host(HostVerb.REGISTER, m.RegisterRequest, m.RegisterReply)
HOST_HEARTBEAT = _host(HostVerb.HEARTBEAT, m.HeartbeatRequest, m.HeartbeatReply)
HOST_CLAIM = _host(HostVerb.CLAIM, m.ClaimRequest, m.LeaseReply)
HOST_RENEW = _host(HostVerb.RENEW, m.RenewRequest, m.LeaseReply)
HOST_REPORT = _host(HostVerb.REPORT, m.ReportRequest, m.ReportReply)
#: (an addition) give an attempt back.
HOST_RELEASE = _host(HostVerb.RELEASE, m.ReleaseRequest, m.ReleaseReply)
#: (an addition) store a file of an attempt's artifacts.
HOST_ARTIFACT = _host(HostVerb.ARTIFACT, m.ArtifactCommit, m.ArtifactView)
#: (an addition) renew several leases of the host in one request.
HOST_RENEWALS = _host(HostVerb.RENEWALS, m.RenewalsRequest, m.RenewalsReply)
#: (an addition) report several attempts of the host in one request.
HOST_REPORTS = _host(HostVerb.REPORTS, m.ReportsRequest, m.ReportsReply)

#: Every endpoint, in the order the service registers them (and `nats micro info` lists them).
ENDPOINTS: tuple[Endpoint[Any, Any], ...] = tuple(_declared)
#: The verbs a host sends requests on, `P.host.<host_id>.<verb>` (what its NATS permissions allow).
HOST_ENDPOINT_VERBS: tuple[str, ...] = tuple(e.verb for e in ENDPOINTS if e.host)

#: A handler of an endpoint: a method taking the validated request and the concrete subject, returning the reply.
Handler = Callable[[Any, Req, str], Awaitable[Rep]]

_HANDLES = "__devsched_endpoint__"


def handles(endpoint: Endpoint[Req, Rep]) -> Callable[[Handler[Req, Rep]], Handler[Req, Rep]]:
    """Mark a method as the handler of `endpoint`; mypy checks its request and reply against the entry."""

    def mark(method: Handler[Req, Rep]) -> Handler[Req, Rep]:
        setattr(method, _HANDLES, endpoint)
        return method

    return mark


def handlers(owner: object) -> list[tuple[Endpoint[Any, Any], Callable[[Any, str], Awaitable[BaseModel]]]]:
    """Each endpoint of `ENDPOINTS` with the bound method of `owner` that `@handles` it, in the table's order.

    Raises:
        LookupError: an endpoint has no handler on `owner`, or two.
    """
    found: dict[Endpoint[Any, Any], list[Callable[[Any, str], Awaitable[BaseModel]]]] = {}
    for attribute in dir(type(owner)):
        endpoint = getattr(getattr(type(owner), attribute, None), _HANDLES, None)
        if isinstance(endpoint, Endpoint):
            found.setdefault(endpoint, []).append(getattr(owner, attribute))
    bound = []
    for endpoint in ENDPOINTS:
        methods = found.get(endpoint, [])
        if len(methods) != 1:
            raise LookupError(f"endpoint {endpoint.name} has {len(methods)} handlers on {type(owner).__name__}, not 1")
        bound.append((endpoint, methods[0]))
    return bound
