"""What the Hypothesis comparisons of the store's placements (submit, hand-over) with the loop share."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

#: The clock of the generated cases.
NOW = datetime(2030, 1, 1, tzinfo=UTC)
#: Label values a generated task or device draws from.
VALUES: Mapping[str, tuple[str, ...]] = {"platform": ("android", "ios"), "model": ("p7", "p8")}


@dataclass(frozen=True)
class Queued:
    """A generated queued task: how it ranks, and what it asks for."""

    priority: int
    age_s: int
    labels: Mapping[str, str]
    device_id: str | None
