"""Identifiers: subject tokens and scheduler-made UUIDs."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devsched.core.ids import TOKEN_PATTERN, is_token, new_lease_id, new_task_id

pytestmark = pytest.mark.unit

ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-"


@pytest.mark.parametrize("value", ["a", "bench-07", "pixel_7_a", "A" * 64, "devsched", "-", "_", "0"])
def test_valid_tokens(value: str) -> None:
    assert is_token(value)


@pytest.mark.parametrize(
    "value",
    [
        "",
        "A" * 65,
        "a.b",
        "a*",
        "a>",
        "a b",
        " a",
        "a\n",
        "\na",
        "a\t",
        "dev/1",
        "é",
        "٣",  # a unicode digit
        "a\x00",
    ],
)
def test_invalid_tokens(value: str) -> None:
    assert not is_token(value)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=ALPHABET, min_size=1, max_size=64))
def test_any_string_over_the_alphabet_is_a_token(value: str) -> None:
    assert is_token(value)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=80))
def test_tokens_are_exactly_1_to_64_of_the_alphabet(value: str) -> None:
    assert is_token(value) == (1 <= len(value) <= 64 and set(value) <= set(ALPHABET))


def test_token_pattern_is_anchored_for_other_users() -> None:
    # The pattern is exported (schemas reuse it): it must reject a trailing newline with re.fullmatch
    # and match whole valid tokens.
    assert re.fullmatch(TOKEN_PATTERN, "abc")
    assert not re.fullmatch(TOKEN_PATTERN, "abc\n")
    assert TOKEN_PATTERN.startswith("^")
    assert TOKEN_PATTERN.endswith("$")


@pytest.mark.parametrize("make", [new_task_id, new_lease_id])
def test_new_ids_are_fresh_random_uuids(make: Callable[[], uuid.UUID]) -> None:
    ids = {make() for _ in range(100)}
    assert len(ids) == 100
    for value in ids:
        assert isinstance(value, uuid.UUID)
        assert value.version == 4
