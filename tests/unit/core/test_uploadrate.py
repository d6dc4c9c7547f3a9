"""The uploads rate share: charges over a sliding window, a refusal for one window past the share."""

from __future__ import annotations

import math

import pytest

from devsched.core.uploadrate import UploadCharges, UploadShare

SHARE = UploadShare(bytes_per_s=100.0, window_s=10.0)  # 1,000 bytes a window


def test_within_the_share_no_host_is_refused() -> None:
    charges = UploadCharges(SHARE)
    for t in range(20):  # 100 bytes a second, exactly the rate, forever
        assert charges.charge("a", 100, float(t)) is None
        assert charges.refused_for("a", float(t)) is None


def test_past_the_share_the_host_waits_one_window_and_only_that_host() -> None:
    charges = UploadCharges(SHARE)
    assert charges.charge("a", 600, 0.0) is None
    assert charges.charge("b", 900, 0.5) is None
    assert charges.charge("a", 500, 1.0) == 1100
    assert charges.refused_for("a", 1.0) == pytest.approx(10.0)
    assert charges.refused_for("a", 7.0) == pytest.approx(4.0)
    assert charges.refused_for("b", 7.0) is None
    assert charges.refused_for("a", 11.0) is None
    # What it purged before is paid for: a fresh window.
    assert charges.charge("a", 1000, 11.0) is None


def test_charges_older_than_the_window_no_longer_count() -> None:
    charges = UploadCharges(SHARE)
    assert charges.charge("a", 900, 0.0) is None
    assert charges.charge("a", 900, 10.5) is None  # the first left the window
    assert charges.charge("a", 200, 11.0) == 1100


def test_a_burst_as_large_as_the_window_holds_is_fine() -> None:
    charges = UploadCharges(SHARE)
    assert charges.charge("a", 1000, 0.0) is None
    assert charges.charge("a", 1, 0.0) == 1001


def test_nothing_purged_charges_nothing() -> None:
    charges = UploadCharges(SHARE)
    assert charges.charge("a", 1000, 0.0) is None
    assert charges.charge("a", 0, 1.0) is None
    assert charges.refused_for("a", 1.0) is None


@pytest.mark.parametrize(
    ("bytes_per_s", "window_s"), [(0.0, 1.0), (1.0, 0.0), (-1.0, 1.0), (math.inf, 1.0), (1.0, math.nan)]
)
def test_a_share_must_be_positive_and_finite(bytes_per_s: float, window_s: float) -> None:
    with pytest.raises(ValueError, match="finite number above 0"):
        UploadShare(bytes_per_s=bytes_per_s, window_s=window_s)
