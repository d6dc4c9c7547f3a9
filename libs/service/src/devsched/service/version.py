"""The installed version of a devsched program: what its `--version` prints and the agent registers with."""

from __future__ import annotations

from importlib import metadata


def installed_version(distribution: str) -> str:
    """The version of the installed `distribution` (`unknown` when run from sources never installed).

    Every member of the workspace carries the same version, so any of them names the release.
    """
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "unknown"
