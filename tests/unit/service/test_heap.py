"""settle_heap: start-up's objects frozen, the collector's thresholds raised (in a process of its own)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from devsched.service.heap import THRESHOLDS

pytestmark = pytest.mark.unit

_PROBE = """
import gc, json
from devsched.service import settle_heap
before = gc.get_freeze_count()
settle_heap()
print(json.dumps({"before": before, "after": gc.get_freeze_count(), "thresholds": gc.get_threshold()}))
"""


def test_settle_heap_freezes_what_exists_and_raises_the_thresholds() -> None:
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True, timeout=60)
    seen = json.loads(out.stdout)
    assert seen["before"] == 0
    assert seen["after"] > 1000, "the imported modules' objects are frozen"
    assert tuple(seen["thresholds"]) == THRESHOLDS
