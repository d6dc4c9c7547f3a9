"""The operator's session: a signed cookie naming a session id, and the ids revoked by a logout.

The cookie is `<id>.<expiry>.<hmac>`, the HMAC keyed by a hash of the operator token (changing the token
ends every session). Logging out adds the id to the revoked set until the cookie's own expiry, so a copy of
the cookie replayed later is no session. Every replica shares the logouts through a NATS bucket that feeds
each one's set (`devsched.web.revocations`); a set that may be missing some (not loaded yet, NATS away) says
so (`RevokedIds.complete`), and then no session is live: sessions fail closed.

Whatever the browser sends is parsed strictly first (length, alphabet, shape): anything else, however
malformed, is simply no session.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass

#: Longest cookie value looked at; anything longer is no session.
MOST_CHARS = 160
#: Seconds between two sweeps of the revoked ids whose cookies have expired (they only take room).
SWEEP_S = 60.0

_SHAPE = re.compile(r"([A-Za-z0-9_-]{16,43})\.([0-9]{1,12})\.([0-9a-f]{64})")


def _key(token: str) -> bytes:
    return hashlib.sha256(b"devsched-web session v2\0" + token.encode()).digest()


def _mac(key: bytes, session_id: str, expires_at: int) -> str:
    return hmac.new(key, f"{session_id}.{expires_at}".encode(), hashlib.sha256).hexdigest()


class RevokedIds:
    """The revoked session ids this process knows, each until its cookie would have expired anyway.

    `complete` says whether the set may be trusted to hold every logout (always, for a set of one process;
    for the shared one, while its feed is caught up); a check against an incomplete set finds no session.
    """

    def __init__(self, complete: Callable[[], bool] = lambda: True) -> None:
        self._ids: dict[str, int] = {}
        self._complete = complete
        self._swept_at = -SWEEP_S

    @property
    def complete(self) -> bool:
        """Whether every logout made anywhere is known here (else sessions cannot be checked)."""
        return self._complete()

    def add(self, session_id: str, expires_at: int, now: float) -> None:
        """Remember `session_id` as revoked until `expires_at` (the later expiry if it is known already).

        Never one forgotten before its cookie expires (that would bring the session back): the set holds what
        the shared bucket holds, whose size is capped (`DEVSCHED_REVOKED_SESSIONS_MAX_BYTES`, where a logout
        past it is refused), plus what expired since the last sweep.
        """
        if now - self._swept_at >= SWEEP_S:  # a replay of many entries sweeps once, not once an entry
            self._swept_at = now
            for expired in [s for s, expiry in self._ids.items() if expiry <= now]:
                del self._ids[expired]
        if expires_at > now:
            self._ids[session_id] = max(expires_at, self._ids.get(session_id, 0))

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)


class Sessions:
    """Issues, checks and revokes the session cookies of one operator token."""

    def __init__(self, token: str, revoked: RevokedIds | None = None) -> None:
        self._key = _key(token)
        self._revoked = RevokedIds() if revoked is None else revoked

    def issue(self, expires_at: int) -> str:
        """A new session's cookie value."""
        session_id = secrets.token_urlsafe(18)
        return f"{session_id}.{expires_at}.{_mac(self._key, session_id, expires_at)}"

    def _verified(self, value: str | None, now: float) -> tuple[str, int] | None:
        """`(id, expiry)` of a well-formed, correctly signed, unexpired cookie value."""
        if not value or len(value) > MOST_CHARS:
            return None
        shape = _SHAPE.fullmatch(value)
        if shape is None:
            return None
        session_id, expiry_text, mac = shape.groups()
        expires_at = int(expiry_text)
        if expires_at <= now:
            return None
        if not hmac.compare_digest(_mac(self._key, session_id, expires_at).encode(), mac.encode()):
            return None
        return session_id, expires_at

    def check(self, value: str | None, now: float) -> bool:
        """Whether the cookie is a live session: signed with this token, unexpired and known not revoked."""
        verified = self._verified(value, now)
        return verified is not None and self._revoked.complete and verified[0] not in self._revoked

    def ending(self, value: str | None, now: float) -> Revoked | None:
        """The session a logout with this cookie ends (whether or not it is revoked already), if it is one."""
        verified = self._verified(value, now)
        return None if verified is None else Revoked(*verified)

    def revoke(self, value: str | None, now: float) -> Revoked | None:
        """End the cookie's session in this process (if it is one); the session ended."""
        ended = self.ending(value, now)
        if ended is not None:
            self._revoked.add(ended.session_id, ended.expires_at, now)
        return ended

    @property
    def revoked(self) -> int:
        """How many revoked sessions are remembered."""
        return len(self._revoked)


@dataclass(frozen=True, slots=True)
class Revoked:
    """A logged-out session: its id (never the cookie) and when its cookie expires."""

    session_id: str
    expires_at: int
