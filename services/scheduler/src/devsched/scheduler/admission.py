"""What a request must pass before it is handled: a reply subject of the requester's own, and a fair share.

Both checks run in the dispatcher, before the body is decoded and before a request slot or a database
connection is taken, so a refused request costs almost nothing.

**Replies go only to the requester's inbox.** A NATS responder publishes its answer to whatever reply
subject the request names, with the responder's own rights (and NATS's `allow_responses` lets it answer
any subject a request names). Unchecked, a host could make the scheduler publish into another host's
assignments or a task's event history. So a host endpoint answers only reply subjects under the inbox
prefixes that host is allowed (`_INBOX.<host_id>.` by default; `_R_.` where hosts live in NATS accounts
of their own, whose replies the server rewrites), an operator endpoint only under the operator prefixes
(`_INBOX.` by default). Anything else is dropped unanswered and unhandled, with a warning naming the host.

**Fair share.** Each host has `host_max_in_flight` requests at once and `host_rate_per_s` a second (bursts
of `host_burst`), plus the `host_*_per_device` settings for each device it registered with this scheduler
process (a replica that did not serve its registration gives it the base share); past that it gets 429
`too_many_requests` with `details.retry_after_s` (`devsched.core.fairshare`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from devsched.core.fairshare import PerDevice, Share, ShareLimits, admit, release, scaled

log = logging.getLogger("devsched.scheduler.admission")

#: The host id placeholder in `host_inbox_prefixes`.
HOST_ID_PLACEHOLDER = "{host_id}"
#: Shares kept before idle ones are forgotten (a forgotten idle share is the same as a new one).
_MAX_SHARES = 4096
#: Hosts whose scaled share is kept (more than any scheduler serves; past it the map starts over).
_MAX_HOSTS = 100_000
#: Seconds between two warnings of the same kind about the same host (a flood must not flood the log).
_WARN_EVERY_S = 10.0


def reply_within(reply: str | None, prefixes: Sequence[str]) -> bool:
    """Whether `reply` is a concrete subject under one of `prefixes` (each ends with a dot)."""
    if not reply or "*" in reply or ">" in reply:
        return False
    return any(reply.startswith(prefix) and len(reply) > len(prefix) for prefix in prefixes)


def host_prefixes(templates: Sequence[str], host_id: str) -> tuple[str, ...]:
    """The inbox prefixes of one host: each template with `{host_id}` replaced."""
    return tuple(t.replace(HOST_ID_PLACEHOLDER, host_id) for t in templates)


class Admission:
    """The reply-subject check and the per-host fair share of one scheduler process."""

    def __init__(
        self,
        *,
        host_inbox_prefixes: Sequence[str],
        operator_inbox_prefixes: Sequence[str],
        limits: ShareLimits,
        per_device: PerDevice | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._host_templates = tuple(host_inbox_prefixes)
        self._operator_prefixes = tuple(operator_inbox_prefixes)
        self.limits = limits
        self._per_device = per_device or PerDevice()
        #: The scaled share of each host that registered devices with this process.
        self._limits: dict[str, ShareLimits] = {}
        self._clock = clock
        self._shares: dict[str, Share] = {}
        self._warned: dict[tuple[str, str], tuple[float, int]] = {}

    # -- replies -------------------------------------------------------------------------------------------

    def host_reply_allowed(self, host_id: str, subject: str, reply: str | None) -> bool:
        """Whether a host endpoint may answer `reply`; warns (rate-limited) when not."""
        if reply_within(reply, host_prefixes(self._host_templates, host_id)):
            return True
        self._warn(host_id, "reply", "request refused: the reply subject is not the host's inbox", subject, reply)
        return False

    def operator_reply_allowed(self, subject: str, reply: str | None) -> bool:
        """Whether an operator endpoint may answer `reply`; warns (rate-limited) when not."""
        if reply_within(reply, self._operator_prefixes):
            return True
        self._warn("", "reply", "request refused: the reply subject is not an operator inbox", subject, reply)
        return False

    # -- fair share ----------------------------------------------------------------------------------------

    def take(self, host_id: str, subject: str) -> float | None:
        """Take a slot of `host_id`'s share.

        Returns:
            None when admitted (give the slot back with `give_back`), else the seconds the host should wait.
        """
        now = self._clock()
        decision = admit(self._shares.get(host_id), self.limits_of(host_id), now)
        if len(self._shares) >= _MAX_SHARES and host_id not in self._shares:
            self._forget_idle(now)
        self._shares[host_id] = decision.share
        if decision.retry_after_s is not None:
            self._warn(host_id, "share", "host over its fair share: answered too_many_requests", subject, None)
        return decision.retry_after_s

    def registered(self, host_id: str, devices: int) -> None:
        """`host_id` registered `devices` devices: its share grows (or shrinks) with them."""
        if devices <= 0:
            self._limits.pop(host_id, None)
            return
        if len(self._limits) >= _MAX_HOSTS and host_id not in self._limits:
            self._limits.clear()  # forgotten hosts fall back to the base share until they register again
        self._limits[host_id] = scaled(self.limits, self._per_device, devices)

    def limits_of(self, host_id: str) -> ShareLimits:
        """The share of `host_id`: the base, scaled by the devices it registered with this process."""
        return self._limits.get(host_id, self.limits)

    def give_back(self, host_id: str) -> None:
        """Return the slot of a finished request of `host_id`."""
        share = self._shares.get(host_id)
        if share is not None:
            self._shares[host_id] = release(share)

    def in_flight(self, host_id: str) -> int:
        """Requests of `host_id` being handled now."""
        share = self._shares.get(host_id)
        return share.in_flight if share is not None else 0

    def _forget_idle(self, now: float) -> None:
        for host_id in [h for h, s in self._shares.items() if s.idle(self.limits_of(h), now)]:
            del self._shares[host_id]

    # -- logging -------------------------------------------------------------------------------------------

    def _warn(self, host_id: str, kind: str, message: str, subject: str, reply: str | None) -> None:
        now = self._clock()
        key = (host_id, kind)
        last, suppressed = self._warned.get(key, (float("-inf"), 0))
        if now - last < _WARN_EVERY_S:
            self._warned[key] = (last, suppressed + 1)
            return
        if len(self._warned) >= _MAX_SHARES:
            self._warned.clear()
        self._warned[key] = (now, 0)
        extra: dict[str, object] = {"subject": subject, "suppressed": suppressed}
        if host_id:
            extra["host_id"] = host_id
        if kind == "reply":
            extra["reply"] = (reply or "")[:200]
        log.warning(message, extra=extra)
