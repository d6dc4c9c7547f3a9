r"""Text the store can keep: what Postgres refuses in `text` and `jsonb`, and how to make any text keepable.

Postgres stores no NUL (U+0000) in text or JSONB (`22P05 untranslatable_character`), and its UTF-8
cannot hold a lone UTF-16 surrogate (U+D800..U+DFFF), which a JSON `\ud800` escape gives Python. The
protocol refuses such text at the edge (`codec.decode`); the agent makes what it reports from a step's
bytes keepable (`storable`) so that an honest host is never refused for its step's output.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

#: A character Postgres cannot keep in text: NUL, or a lone surrogate.
UNSTORABLE = re.compile("[\x00\ud800-\udfff]")

#: What `storable` puts in place of such a character.
REPLACEMENT = "\ufffd"

#: The rule's words, for error messages (the value itself is never quoted).
RULE = "holds a NUL character or a lone UTF-16 surrogate, which cannot be stored"


def is_storable(text: str) -> bool:
    """Whether Postgres can keep `text`."""
    return UNSTORABLE.search(text) is None


def storable(text: str) -> str:
    """`text` with every NUL and lone surrogate replaced by U+FFFD (itself when there is none)."""
    return text if UNSTORABLE.search(text) is None else UNSTORABLE.sub(REPLACEMENT, text)


def unstorable_paths(value: object, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Where parsed JSON holds text Postgres cannot keep: the path of each such string, in document order.

    A bad object key yields the path of its object with `"<key>"` appended (the key itself is not
    repeated: it is the submitted value).
    """
    if isinstance(value, str):
        if UNSTORABLE.search(value) is not None:
            yield path
    elif isinstance(value, dict):
        for key, item in value.items():
            if UNSTORABLE.search(key) is not None:
                yield (*path, "<key>")
                continue
            yield from unstorable_paths(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from unstorable_paths(item, (*path, str(index)))


def fit(text: str, limit: int, *, tail: bool = False) -> str:
    """`storable(text)` in at most `limit` characters: its start, or with `tail` its end, an ellipsis marking a cut."""
    text = storable(text)
    if len(text) <= limit:
        return text
    return "…" + text[len(text) - limit + 1 :] if tail else text[: limit - 1] + "…"
