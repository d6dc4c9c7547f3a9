"""libfaketime for clock-skew tests: a process's wall clock moved by a fixed offset, nothing else changed.

Debian's `faketime` package (installed by `.ci/run` when missing) ships `libfaketime.so.1`; preloaded with
`FAKETIME="+1h"`, every clock the process reads is an hour ahead, its monotonic clock by the same constant (so
durations are unchanged). A test that needs it skips, naming the package, only where the library is absent.
"""

from __future__ import annotations

import glob
from pathlib import Path

import pytest

#: Where Debian installs it (the multiarch directory differs between architectures).
LIBRARY_GLOB = "/usr/lib/*/faketime/libfaketime.so.1"


def libfaketime() -> Path:
    """The library's path; skips the test when it is not installed."""
    found = sorted(glob.glob(LIBRARY_GLOB))
    if not found:
        pytest.skip(f"libfaketime is not installed (no {LIBRARY_GLOB}): apt-get install faketime (.ci/run does)")
    return Path(found[0])


def skewed(offset: str) -> dict[str, str]:
    """Environment variables that move a process's clocks by `offset` (libfaketime syntax: `+1h`, `-10m`)."""
    return {"LD_PRELOAD": str(libfaketime()), "FAKETIME": offset, "FAKETIME_DONT_RESET": "1"}
