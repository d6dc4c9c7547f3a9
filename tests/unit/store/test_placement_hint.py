"""`placement.NothingFree`: the selectors whose last look found no free device, a bounded hint."""

from __future__ import annotations

import pytest

from devsched.core.records import Selector
from devsched.store.placement.submitted import NothingFree

pytestmark = pytest.mark.unit


def test_a_look_that_found_nothing_is_remembered_until_one_finds_a_device() -> None:
    hint = NothingFree()
    key = NothingFree.key(Selector({"platform": "android"}))
    assert key not in hint, "a selector never looked at is placed in the submit's transaction"
    hint.saw(key, 0)
    assert key in hint
    hint.saw(key, 2)
    assert key not in hint


def test_the_key_is_the_labels_whatever_their_order_and_the_device() -> None:
    a = NothingFree.key(Selector({"platform": "android", "model": "pixel"}))
    assert a == NothingFree.key(Selector({"model": "pixel", "platform": "android"}))
    assert a != NothingFree.key(Selector({"platform": "android", "model": "pixel"}, "d1"))
    assert a != NothingFree.key(Selector({"platform": "android"}))


def test_it_starts_over_when_full() -> None:
    hint = NothingFree(limit=3)
    keys = [NothingFree.key(Selector({"n": str(n)})) for n in range(4)]
    for key in keys[:3]:
        hint.saw(key, 0)
    assert all(k in hint for k in keys[:3])
    hint.saw(keys[3], 0)
    assert [k in hint for k in keys] == [False, False, False, True], "forgotten: each costs one placement"
