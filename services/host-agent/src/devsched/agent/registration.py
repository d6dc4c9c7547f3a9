"""The host's standing with the scheduler: registration, retried until it succeeds, and heartbeats.

Both are answered with the heartbeat interval. A scheduler that answers 404 (to a heartbeat, a report, or
while the host's consumer is missing) no longer knows the host, which then registers again.

When the agent stops taking work (shutdown, drain) it withdraws its devices: it registers again with none,
so the scheduler assigns it nothing it would not run (and a task it gives back goes to another host).
Running attempts keep their devices until they end. The next start registers the devices again.

A device id belongs to the host that first registered it until an operator frees it (`devsched devices
forget`): a registration naming another host's device is refused whole (409 `device_conflict`). Only an
operator can resolve that, so the agent says so once (an ERROR line naming the devices), retries slowly
(`CONFLICT_RETRY_S`) to notice the fix, and is not ready meanwhile (`refused_devices`, `health.py`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from devsched.agent.client import HostClient
from devsched.agent.config import DeviceConfig
from devsched.core.backoff import backoff_delay, retry_after
from devsched.core.errors import DeviceConflict, InvalidRequest, NotFound, StorageFull
from devsched.protocol import messages as wire
from devsched.service import sleep_or_stop

logger = logging.getLogger(__name__)

#: Seconds between registrations refused for another host's device: an operator has to act first.
CONFLICT_RETRY_S = 60.0


class Registration:
    """Registers the host's devices and keeps the host alive with heartbeats."""

    def __init__(
        self,
        client: HostClient,
        devices: Sequence[DeviceConfig],
        version: str,
        *,
        registered: asyncio.Event,
        actions: Sequence[wire.ActionOffer] | None = None,
    ) -> None:
        self._client = client
        self._devices = [wire.DeviceRegistration(device_id=d.device_id, labels=d.labels) for d in devices]
        self._version = version
        self._actions = list(actions) if actions is not None else None
        self._lock = asyncio.Lock()
        self._heartbeats: asyncio.Task[None] | None = None
        #: Set once registered (the agent's `registered`, for tests and health checks).
        self.registered = registered
        #: As the scheduler last said.
        self.heartbeat_interval_s = 5.0
        #: Set once the devices are withdrawn: every later registration (a 404's) lists none.
        self._withdrawn = False
        #: The devices of the last registration refused as another host's (`device_conflict`); empty once
        #: registered (readiness says which, `health.py`).
        self.refused_devices: tuple[str, ...] = ()

    async def register(self) -> None:
        """Register once (any failure raises)."""
        devices = [] if self._withdrawn else self._devices
        async with self._lock:
            reply = await self._client.register(devices, self._version, self._actions)
        self.heartbeat_interval_s = reply.heartbeat_interval_s
        self.refused_devices = ()
        self.registered.set()
        logger.info("registered", extra={"devices": len(devices), "heartbeat_interval_s": reply.heartbeat_interval_s})

    async def withdraw(self) -> None:
        """Offer no device any more (the agent takes no more work); never raises, one try.

        Best effort: if the scheduler cannot be reached, an assignment it makes meanwhile waits in the
        host's consumer for the next start (or its lease runs out).
        """
        self._withdrawn = True
        try:
            await self.register()
        except Exception as exc:
            logger.warning("devices not withdrawn", extra={"error": repr(exc)})
        else:
            logger.info("devices withdrawn: no new work comes to this host", extra={"devices": len(self._devices)})

    async def register_until_done(self, stop: asyncio.Event) -> bool:
        """Register, retrying with backoff; False if `stop` was set first."""
        failures = 0
        while not stop.is_set():
            pause = 0.0
            try:
                await self.register()
                return True
            except DeviceConflict as exc:
                failures += 1
                pause = self._refused(exc)
            except Exception as exc:
                pause = retry_after(exc)
                failures += 1
                refused = DeviceConflict | InvalidRequest | StorageFull
                level = logging.ERROR if isinstance(exc, refused) else logging.WARNING
                extra: dict[str, object] = {"error": repr(exc), "failures": failures}
                if isinstance(exc, InvalidRequest) and exc.details.get("errors"):
                    extra["errors"] = exc.details["errors"]  # every refused field, not only the first
                logger.log(level, "registration failed, will retry", extra=extra)
            await sleep_or_stop(stop, max(backoff_delay(failures, base_s=0.2, cap_s=10.0), pause))
        return False

    def _refused(self, exc: DeviceConflict) -> float:
        """Note a registration refused for another host's devices; the pause before the next try.

        One ERROR line per distinct set of devices (the retries that meet the same refusal log at DEBUG).
        """
        owners = exc.details.get("devices")
        devices = tuple(sorted(owners)) if isinstance(owners, dict) and owners else ("?",)
        level = logging.DEBUG if devices == self.refused_devices else logging.ERROR
        self.refused_devices = devices
        logger.log(
            level,
            "registration refused: device %s belongs to another host; an operator frees it with"
            " `devsched devices forget`, or remove it from this agent's config (retrying every %g s)",
            ", ".join(devices),
            CONFLICT_RETRY_S,
            extra={"devices": " ".join(devices)},
        )
        return CONFLICT_RETRY_S

    async def reregister(self) -> None:
        """Register again (the scheduler answered 404: it no longer knows this host); never raises."""
        try:
            await self.register()
        except DeviceConflict as exc:
            self._refused(exc)
        except Exception as exc:
            logger.warning("re-registration failed", extra={"error": repr(exc)})

    def start_heartbeats(self, on_answer: Callable[[], None]) -> None:
        """Heartbeat in the background; `on_answer` is called after each answered one (the scheduler is up)."""
        self._heartbeats = asyncio.create_task(self._heartbeat_loop(on_answer))

    async def _heartbeat_loop(self, on_answer: Callable[[], None]) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_interval_s)
            try:
                reply = await self._client.heartbeat()
                self.heartbeat_interval_s = reply.heartbeat_interval_s
                on_answer()
            except NotFound:
                await self.reregister()
            except Exception as exc:
                logger.warning("heartbeat failed", extra={"error": repr(exc)})

    def cancel(self) -> list[asyncio.Task[None]]:
        """Cancel the heartbeats; the task to await."""
        if self._heartbeats is None:
            return []
        self._heartbeats.cancel()
        return [self._heartbeats]
