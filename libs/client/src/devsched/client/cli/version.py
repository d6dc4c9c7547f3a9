"""The installed devsched-client's version: what `devsched --version` prints (importing nothing of the client)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version


def client_version() -> str:
    """The installed devsched-client's version (`unknown` when run from sources that were never installed)."""
    try:
        return version("devsched-client")
    except PackageNotFoundError:
        return "unknown"


def version_line() -> str:
    """`devsched <version>`, the one line of `devsched --version`."""
    return f"devsched {client_version()}"
