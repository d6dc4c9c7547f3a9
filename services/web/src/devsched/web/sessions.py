"""The operator's session: a signed cookie naming a session id, and the ids revoked by a logout.

The cookie is `<id>.<expiry>.<hmac>`, the HMAC keyed by a hash of the operator token (changing the token
ends every session). Logging out adds the id to an in-memory revocation set until the cookie's own expiry,
so a copy of the cookie replayed later is no session. The set lives in this process: another replica
behind the same Service does not learn of the logout (docs/security.md, "The web dashboard").

Whatever the browser sends is parsed strictly first (length, alphabet, shape): anything else, however
malformed, is simply no session.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets

#: Longest cookie value looked at; anything longer is no session.
MOST_CHARS = 160
#: Most revoked ids remembered (each until its cookie would have expired anyway).
MOST_REVOKED = 100_000

_SHAPE = re.compile(r"([A-Za-z0-9_-]{16,43})\.([0-9]{1,12})\.([0-9a-f]{64})")


def _key(token: str) -> bytes:
    return hashlib.sha256(b"devsched-web session v2\0" + token.encode()).digest()


def _mac(key: bytes, session_id: str, expires_at: int) -> str:
    return hmac.new(key, f"{session_id}.{expires_at}".encode(), hashlib.sha256).hexdigest()


class Sessions:
    """Issues, checks and revokes the session cookies of one operator token."""

    def __init__(self, token: str) -> None:
        self._key = _key(token)
        self._revoked: dict[str, int] = {}

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
        """Whether the cookie is a live session: signed with this token, unexpired and not revoked."""
        verified = self._verified(value, now)
        return verified is not None and verified[0] not in self._revoked

    def revoke(self, value: str | None, now: float) -> bool:
        """End the cookie's session for good (if it is one); whether it was."""
        verified = self._verified(value, now)
        if verified is None:
            return False
        self._forget_expired(now)
        if len(self._revoked) >= MOST_REVOKED:  # only live sessions' logouts get here: drop the soonest to expire
            del self._revoked[min(self._revoked, key=self._revoked.__getitem__)]
        session_id, expires_at = verified
        self._revoked[session_id] = expires_at
        return True

    def _forget_expired(self, now: float) -> None:
        for session_id in [s for s, expiry in self._revoked.items() if expiry <= now]:
            del self._revoked[session_id]

    @property
    def revoked(self) -> int:
        """How many revoked sessions are remembered."""
        return len(self._revoked)
