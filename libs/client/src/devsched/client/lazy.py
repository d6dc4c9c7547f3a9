"""Module attributes imported on first use (PEP 562), so that `import devsched.client` stays cheap."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any


def lazy_attributes(namespace: dict[str, Any], sources: Mapping[str, str]) -> Callable[[str], object]:
    """A module `__getattr__` that imports `name` from `sources[name]` the first time it is asked for.

    The value is then kept in the module's `namespace`, so later lookups never come back here.
    """

    def getattr_(name: str) -> object:
        source = sources.get(name)
        if source is None:
            raise AttributeError(f"module {namespace['__name__']!r} has no attribute {name!r}")
        value = getattr(import_module(source), name)
        namespace[name] = value
        return value

    return getattr_
