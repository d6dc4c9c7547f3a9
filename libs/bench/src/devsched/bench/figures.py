"""A figure of the bench: a value, what it is measured beside in the same run, and the goal it is held to.

Every comparison is a ratio within one run (devsched / the floor or the peer), so that the figures mean
the same on a laptop and on a loaded CI machine; absolute numbers are printed for reference only.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

Op = Literal[">=", "<="]


@dataclass(frozen=True, slots=True)
class Goal:
    """`ratio >= 2` (devsched / what it is beside) or `value <= 150` (the figure itself)."""

    on: Literal["ratio", "value"]
    op: Op
    threshold: float

    def met(self, value: float | None, ratio: float | None) -> bool | None:
        """Whether the figure meets the goal; None when what it needs was not measured."""
        subject = ratio if self.on == "ratio" else value
        if subject is None:
            return None
        return subject >= self.threshold if self.op == ">=" else subject <= self.threshold

    def __str__(self) -> str:
        return f"{self.op} {self.threshold:g}{'x' if self.on == 'ratio' else ''}"


def at_least(times: float) -> Goal:
    """Devsched at least `times` what it is beside."""
    return Goal("ratio", ">=", times)


def at_most(times: float) -> Goal:
    """Devsched at most `times` what it is beside."""
    return Goal("ratio", "<=", times)


def value_at_most(limit: float) -> Goal:
    """The figure itself at most `limit`."""
    return Goal("value", "<=", limit)


@dataclass(frozen=True, slots=True)
class Figure:
    """One line of the report."""

    key: str
    """Stable name in the JSON output, `lifecycle.c16.tasks_per_s`."""
    label: str
    """For people: `tasks/s, c=16`."""
    unit: str
    value: float | None
    """devsched's figure (None: not measured, `note` says why)."""
    beside: float | None = None
    """The floor's or the peer's figure, measured in the same run."""
    beside_name: str | None = None
    """What `beside` is: `Procrastinate`, `floor: UPDATE ... RETURNING responder`."""
    goal: Goal | None = None
    note: str = ""
    """`not installed`, or what to keep in mind."""

    @property
    def ratio(self) -> float | None:
        """Value / beside, when both were measured."""
        if self.value is None or self.beside is None or self.beside == 0:
            return None
        return self.value / self.beside

    @property
    def met(self) -> bool | None:
        """Whether the goal is met (None: no goal, or not measurable)."""
        return None if self.goal is None else self.goal.met(self.value, self.ratio)

    def as_dict(self) -> dict[str, Any]:
        """For the JSON output."""
        ratio = self.ratio
        return {
            "key": self.key,
            "label": self.label,
            "unit": self.unit,
            "value": _round(self.value),
            "beside": _round(self.beside),
            "beside_name": self.beside_name,
            "ratio": None if ratio is None else round(ratio, 4),
            "goal": None if self.goal is None else str(self.goal),
            "met": self.met,
            "note": self.note,
        }


def _round(value: float | None) -> float | None:
    if value is None:
        return None
    return round(value, 6) if abs(value) < 1 else round(value, 3)


def median(values: Sequence[float]) -> float:
    """The median of a figure's rounds."""
    return float(statistics.median(values))


def _num(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def of_median_ratio(pairs: Sequence[tuple[float, float]], whose: str = "floor") -> tuple[float, float, str]:
    """(value, beside) of the round whose ratio value / beside is the median, and a note of every round's.

    The lower middle round of an even number; the note lists each round's pair and ratio ("" for one round).
    A round's two windows are adjacent in time, so its ratio cancels most of what a shared machine's slow
    minute does to both; the median of the rounds' ratios is that round's pair of values.
    """
    ratios = [value / beside if beside else 0.0 for value, beside in pairs]
    middle = sorted(range(len(pairs)), key=lambda i: ratios[i])[(len(pairs) - 1) // 2]
    note = rounds_note([v for v, _ in pairs], [b for _, b in pairs], whose, "the median ratio")
    if note:
        note += " (x " + " / ".join(f"{r:.2f}" for r in ratios) + ")"
    return pairs[middle][0], pairs[middle][1], note


def rounds_note(
    values: Sequence[float], beside: Sequence[float] = (), whose: str = "peer", lead: str = "medians"
) -> str:
    """The rounds' values behind a median (and those of what it is beside), for its note ("" for one round).

    `lead` names what was taken of them: `medians`, or `the median ratio` (one round's pair).
    """
    if len(values) < 2:
        return ""
    note = f"{lead} of {len(values)} rounds: " + " / ".join(map(_num, values))
    return note + (f", {whose} " + " / ".join(map(_num, beside)) if beside else "")
