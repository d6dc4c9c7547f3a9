"""Task ids as people type them: a whole UUID, or its first 8 or more hex digits (`3af5939c`, as `ls` shows).

A prefix is resolved by the scheduler (`P.api.tasks.list` with `id_prefix`): one task starts with it, and that
is the task; none is `NotFound`; several is `AmbiguousTaskId`, which names them, so nothing is ever done to
a task the user did not mean. A whole id is used as it is, without a round trip.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING

from devsched.client.errors import InvalidRequest, NotFound, invalid
from devsched.protocol.tasks import TASK_ID_PREFIX_PATTERN

if TYPE_CHECKING:
    from devsched.client.client import Client

#: Digits a prefix needs at least: 8 hex digits, 4 billion values, few enough collisions in a lab's history.
MIN_PREFIX_DIGITS = 8
#: Candidates an ambiguity error names at most (the rest are counted).
SHOWN_CANDIDATES = 10

_PREFIX = re.compile(TASK_ID_PREFIX_PATTERN)
_HEX = re.compile(r"^[0-9a-f]{8,32}$")
#: Where the written form of a UUID has its hyphens (after these many digits).
_HYPHENS_AFTER = (8, 12, 16, 20)


class AmbiguousTaskId(InvalidRequest):
    """More than one task id starts with the prefix given: give more digits."""


def task_ref(text: uuid.UUID | str, path: str = "task_id") -> uuid.UUID | str:
    """A whole task id as a UUID, or a prefix in its written form (lowercase, hyphens in place).

    The prefix may be typed with or without its hyphens and in either case: `3AF5939C1B` is `3af5939c-1b`.

    Raises:
        InvalidRequest: neither a UUID nor 8 or more of its leading hex digits (path `path`), before anything
            is sent.
    """
    if isinstance(text, uuid.UUID):
        return text
    written = str(text).strip().lower()
    digits = written.replace("-", "")
    if len(digits) == 32:
        try:
            return uuid.UUID(written)
        except ValueError:
            pass
    elif _PREFIX.match(written):
        return written
    elif _HEX.match(digits):  # the right digits, hyphens elsewhere or none: put them where the id has them
        return _written(digits)
    raise invalid(
        path,
        f"not a task id: give the whole id or its first {MIN_PREFIX_DIGITS} or more hex digits, not {str(text)[:80]!r}",
    )


def _written(digits: str) -> str:
    parts, start = [], 0
    for end in (*_HYPHENS_AFTER, 32):
        if start >= len(digits):
            break
        parts.append(digits[start:end])
        start = end
    return "-".join(parts)


def one_task(prefix: str, candidates: Sequence[uuid.UUID], *, more: bool = False) -> uuid.UUID:
    """The one task among the ids that start with `prefix` (`more`: the scheduler has others besides these).

    Raises:
        NotFound: no task id starts with it.
        AmbiguousTaskId: several do; the error names them (at most `SHOWN_CANDIDATES`) in `details.candidates`.
    """
    if not candidates:
        raise NotFound(f"no task id starts with {prefix}")
    if len(candidates) == 1 and not more:
        return candidates[0]
    shown = [str(c) for c in candidates[:SHOWN_CANDIDATES]]
    extra = " and more" if more or len(candidates) > SHOWN_CANDIDATES else ""
    message = f"{len(candidates)}{'+' if extra else ''} task ids start with {prefix}: {', '.join(shown)}{extra}"
    raise AmbiguousTaskId(
        f"ambiguous task id: {message}",
        errors=[{"path": "task_id", "message": f"ambiguous: {message}; give more digits"}],
        candidates=shown,
    )


async def resolve_task_id(client: Client, text: uuid.UUID | str) -> uuid.UUID:
    """The id of the one task `text` names: a whole id as it is, a prefix as the scheduler resolves it.

    Raises:
        InvalidRequest: `text` is no id nor prefix.
        NotFound: no task id starts with the prefix.
        AmbiguousTaskId: several task ids start with it.
    """
    ref = task_ref(text)
    if isinstance(ref, uuid.UUID):
        return ref
    page = await client.list_page(id_prefix=ref, limit=SHOWN_CANDIDATES)
    return one_task(ref, [task.task_id for task in page.tasks], more=page.next is not None)
