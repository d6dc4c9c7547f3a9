"""The version a devsched program reports: `--version`, `devsched_build_info`, traces, agent registration."""

from __future__ import annotations

import platform
from importlib.metadata import PackageNotFoundError, version

#: The runtime every service runs on: its version stands in for a service whose own is not installed.
RUNTIME = "devsched-service"
#: What is reported when neither is installed (running from a source tree that was never installed).
UNKNOWN = "unknown"


def service_version(distribution: str = RUNTIME) -> str:
    """The installed version of `distribution` (`devsched-scheduler`, ...), else of the runtime, else `unknown`.

    The workspace's packages are released together at one version (each pins its siblings to it), so the
    runtime's version is the service's whenever the service's own metadata is missing.
    """
    for name in (distribution, RUNTIME):
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return UNKNOWN


def python_version() -> str:
    """The interpreter's version (`3.11.9`)."""
    return platform.python_version()
