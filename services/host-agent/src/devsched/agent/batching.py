"""Group commit for the host's batched requests: what callers ask for together goes out in one request.

Never a timer, so a lone item waits for nothing and a busy host sends fewer, fuller requests: an item asked
for when no request is in flight goes out at the end of the loop turn, with the others asked for in that
turn; those asked for while a request is in flight go out together as soon as it is answered, in chunks
the batcher bounds. A key (a lease, a report) goes once in a batch: a repeat of a waiting one waits for the
next. Each caller gets its own item's answer, or the error the single request would have raised for it; a
failure of the whole request reaches each caller as a transient error, never one that ends its item.

Only while the scheduler says it serves the batched request: when nothing serves it (an older scheduler
during a rolling upgrade) the chunk goes out one single request per item, and the client's flag is cleared
until a register or heartbeat reply sets it again.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from abc import ABC, abstractmethod
from collections.abc import Coroutine, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

from devsched.core.errors import DevschedError, Internal, Unavailable
from devsched.protocol.transport import NoReply

Item = TypeVar("Item")
Answer = TypeVar("Answer")


def not_served(exc: BaseException, refusals: tuple[type[DevschedError], ...]) -> bool:
    """Whether `exc` says nothing serves the request (no responders) or the scheduler refuses it as such."""
    if isinstance(exc, NoReply):
        return exc.details.get("reason") == "no_responders"
    return isinstance(exc, refusals)


def whole_failure(exc: BaseException, request: str, ending: tuple[type[DevschedError], ...]) -> DevschedError:
    """A copy of `exc` for each caller of a `request` that failed as a whole; `Unavailable` where it would end one."""
    if isinstance(exc, DevschedError) and not isinstance(exc, ending):
        err = type(exc)(exc.message)
        err.details = dict(exc.details)
        return err
    return Unavailable(f"{request} request failed: {type(exc).__name__}")


@dataclass(frozen=True, slots=True)
class Waiting(Generic[Item, Answer]):
    """An item waiting for its batch, its caller's future, and the context its requests run in."""

    item: Item
    future: asyncio.Future[Answer]
    #: The caller's context (trace, log fields), or None: the flusher's.
    context: contextvars.Context | None


class GroupCommit(ABC, Generic[Item, Answer]):
    """Sends items asked for together in one request each; see the module docstring."""

    #: The batched request's name (the flusher task's, and in errors).
    _name: ClassVar[str]
    #: Where warnings go (the batcher's module logger).
    _logger: ClassVar[logging.Logger]
    #: The warning when nothing serves the batched request.
    _not_served: ClassVar[str]
    #: Errors of a request refused whole for what it holds: its items go one by one, the flag stays.
    _refused_whole: ClassVar[tuple[type[DevschedError], ...]] = ()
    #: The warning for such a refusal.
    _refused_warning: ClassVar[str] = ""
    #: A chunk of fewer items goes one by one.
    _min_batch: ClassVar[int] = 1
    #: Whether each request runs in its (first) caller's context instead of the flusher's.
    _callers_context: ClassVar[bool] = False

    def __init__(self, *, max_batch: int, limit: int) -> None:
        if not 1 <= max_batch <= limit:
            raise ValueError(f"max_batch must be in [1, {limit}], got {max_batch}")
        self._max_batch = max_batch
        self._waiting: list[Waiting[Item, Answer]] = []
        self._flusher: asyncio.Task[None] | None = None

    @abstractmethod
    def _served(self) -> bool:
        """Whether the scheduler said it serves the batched request."""

    @abstractmethod
    def _unserve(self) -> None:
        """Clear the client's flag (until a register or heartbeat reply says it again)."""

    @abstractmethod
    def _key(self, item: Item) -> Hashable:
        """What an item may appear once for in a batch."""

    @abstractmethod
    async def _one(self, item: Item) -> Answer:
        """The single request for `item`."""

    @abstractmethod
    async def _request(self, items: list[Item]) -> Sequence[Answer | DevschedError]:
        """The batched request for `items`: each one's answer or error, in their order; raises for the whole."""

    @abstractmethod
    def _unserved(self, exc: Exception) -> bool:
        """Whether a failed request means the scheduler does not take it."""

    @abstractmethod
    def _transient(self, exc: Exception) -> DevschedError:
        """The error each caller gets for a request that failed as a whole."""

    async def _gather_joiners(self) -> None:
        """Let others join the batch about to be taken; none by default."""

    def _chunks(self, batch: list[Waiting[Item, Answer]]) -> list[list[Waiting[Item, Answer]]]:
        """`batch` in requests of at most `max_batch` items."""
        return [batch[i : i + self._max_batch] for i in range(0, len(batch), self._max_batch)]

    async def _submit(self, item: Item) -> Answer:
        """`item`'s answer, with the next batch (alone where batches are not served)."""
        if not self._served():
            return await self._one(item)
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        context = contextvars.copy_context() if self._callers_context else None
        self._waiting.append(Waiting(item, future, context))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush(), name=self._name)
        return await future

    async def _flush(self) -> None:
        """Send batches while items wait; each takes what waits when the previous one is answered."""
        await asyncio.sleep(0)  # what is asked for in this loop turn goes in the same request
        while self._waiting:
            await self._gather_joiners()
            batch = self._take()
            if batch:
                # a request runs in its first item's context (one request carries one trace context)
                await asyncio.gather(*(_task(self._send(chunk), chunk[0]) for chunk in self._chunks(batch)))

    def _take(self) -> list[Waiting[Item, Answer]]:
        """The waiting items still wanted, each key once (a repeat waits for the next batch)."""
        batch: list[Waiting[Item, Answer]] = []
        later: list[Waiting[Item, Answer]] = []
        seen: set[Hashable] = set()
        for waiting in self._waiting:
            if waiting.future.done():  # its caller gave up (timeout, shutdown, cancellation)
                continue
            key = self._key(waiting.item)
            (later if key in seen else batch).append(waiting)
            seen.add(key)
        self._waiting = later
        return batch

    async def _send(self, chunk: list[Waiting[Item, Answer]]) -> None:
        if len(chunk) < self._min_batch or not self._served():
            await self._one_by_one(chunk)
            return
        try:
            answers = await self._request([waiting.item for waiting in chunk])
        except Exception as exc:
            if self._unserved(exc):
                if self._served():
                    self._unserve()
                    self._logger.warning(self._not_served, extra={"error": repr(exc)})
                await self._one_by_one(chunk)
                return
            if isinstance(exc, self._refused_whole):  # each item then meets its own answer
                self._logger.warning(self._refused_warning, extra={"code": exc.code})
                await self._one_by_one(chunk)
                return
            for waiting in chunk:
                _settle(waiting.future, self._transient(exc))
            return
        if len(answers) != len(chunk):
            answers = [Internal(f"a {self._name} reply with another number of answers") for _ in chunk]
        for waiting, answer in zip(chunk, answers, strict=True):
            _settle(waiting.future, answer)

    async def _one_by_one(self, chunk: list[Waiting[Item, Answer]]) -> None:
        async def one(waiting: Waiting[Item, Answer]) -> None:
            try:
                answer = await self._one(waiting.item)
            except Exception as exc:
                _settle(waiting.future, exc)
                return
            _settle(waiting.future, answer)

        # each in its caller's context where kept: the request continues that caller's trace
        await asyncio.gather(*(_task(one(waiting), waiting) for waiting in chunk))


def _task(coro: Coroutine[Any, Any, None], waiting: Waiting[Any, Any]) -> asyncio.Task[None]:
    """Run `coro` in `waiting`'s context (None: a copy of the current one, as any task)."""
    return asyncio.create_task(coro, context=waiting.context)


def _settle(future: asyncio.Future[Answer], answer: Answer | BaseException) -> None:
    """Give `future` its answer or error, unless its caller gave up."""
    if future.done():
        return
    if isinstance(answer, BaseException):
        future.set_exception(answer)
    else:
        future.set_result(answer)
