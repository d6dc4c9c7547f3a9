"""The bench's output: a table per phase (each figure beside its floor or peer), and the same as JSON."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devsched.bench.figures import Figure

#: Section titles, in the order of the phases.
SECTIONS = {
    "lifecycle": "lifecycle: no-op tasks submitted one by one, then run by one agent with c devices",
    "latency": "single task on an idle system",
    "renewals": "lease renewals",
    "sweep": "lease sweep",
    "memory": "scheduler memory and API latency by queue depth",
}
#: Version of the JSON document's layout.
SCHEMA = 1


@dataclass
class Results:
    """One run: its conditions, figures and details."""

    started_at: str
    options: dict[str, Any]
    conditions: dict[str, Any] = field(default_factory=dict)
    figures: list[Figure] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    duration_s: float = 0.0
    samples: dict[str, list[float]] = field(default_factory=dict)
    """Latency samples for the plot (the JSON has their distributions)."""

    def as_dict(self) -> dict[str, Any]:
        """The JSON document."""
        return {
            "schema": SCHEMA,
            "started_at": self.started_at,
            "duration_s": round(self.duration_s, 1),
            "options": self.options,
            "conditions": self.conditions,
            "figures": [f.as_dict() for f in self.figures],
            "goals": goal_summary(self.figures),
            "details": self.details,
            "errors": self.errors,
        }

    def write_json(self, path: Path) -> None:
        """Write the JSON document to `path`."""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.as_dict(), indent=2) + "\n")


def goal_summary(figures: list[Figure]) -> dict[str, int]:
    """How many goals are met, missed, and could not be judged."""
    judged = [f.met for f in figures if f.goal is not None]
    return {
        "met": sum(1 for m in judged if m is True),
        "missed": sum(1 for m in judged if m is False),
        "unjudged": sum(1 for m in judged if m is None),
    }


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}" if abs(value) >= 0.1 else f"{value:.3f}"


def _verdict(figure: Figure) -> str:
    if figure.goal is None:
        return ""
    met = figure.met
    return f"{figure.goal} {'ok' if met else 'MISSED' if met is False else '?'}"


def render_figures(figures: list[Figure]) -> str:
    """The figures as tables, one per phase."""
    lines: list[str] = []
    for section, title in SECTIONS.items():
        mine = [f for f in figures if f.key.split(".", 1)[0] == section]
        if not mine:
            continue
        lines += ["", title]
        for f in mine:
            ratio = f.ratio
            beside = f"{_number(f.beside)}  {f.beside_name}" if f.beside is not None else (f.note or "")
            line = (
                f"  {f.label:<52} {_number(f.value):>9} {f.unit:<10}"
                f" {'x' + format(ratio, '.2f') if ratio is not None else '':>7}  {_verdict(f):<14} {beside}"
            )
            lines.append(line.rstrip())
            if f.beside is not None and f.note:
                lines.append(f"  {'':<52} {'':>9} {'':<10} {'':>7}  {'':<14} ({f.note})")
    return "\n".join(lines)


def render_conditions(conditions: dict[str, Any], options: dict[str, Any]) -> str:
    """The header: what ran where, and how durable it was."""
    if not conditions:
        return "conditions: not collected"
    m, pg, nats, svc = conditions["machine"], conditions["postgres"], conditions["nats"], conditions["services"]
    s = pg["settings"]
    return "\n".join(
        [
            f"machine: {m['cpus']} CPUs ({m['cpu_model']}), {m['memory_gib']} GiB, Linux {m['kernel']},"
            f" Python {m['python']}; load average at start {m['load_average_at_start'][0]}"
            " (a shared machine: compare the ratios, which are measured in the same run)",
            f"postgres: {pg['version']}, fsync={s['fsync']}, synchronous_commit={s['synchronous_commit']},"
            f" full_page_writes={s['full_page_writes']}, wal_sync_method={s['wal_sync_method']},"
            f" data on {pg['filesystem']} ({pg['data_dir']}), 8 kB write+fdatasync {pg['fdatasync_8k_per_s']}/s,"
            f" {s['shared_preload_libraries']} loaded",
            f"nats: {nats['version']}, JetStream on {nats['filesystem']}, sync_interval {nats['sync_interval']}",
            f"services: real scheduler, sweeper and agent processes, log level {svc['log_level']},"
            f" the scheduler at its defaults{_settings(svc['scheduler_settings'], ' but ')} for the lifecycle and the"
            f" latency, restarted with its fair share lifted{_settings(svc['saturation_settings'], ' ')} for the"
            f" renewals and after; {svc['note']}",
            "packages: " + ", ".join(f"{k} {v}" for k, v in conditions["packages"].items() if v),
            f"run: {options.get('mode')}; {options.get('sizes')}",
        ]
    )


def render(results: Results) -> str:
    """The whole text report."""
    goals = goal_summary(results.figures)
    parts = [
        f"devsched bench, {results.started_at}, {results.duration_s:.0f} s",
        render_conditions(results.conditions, results.options),
        render_figures(results.figures),
        "",
        f"goals: {goals['met']} met, {goals['missed']} missed, {goals['unjudged']} not judged",
    ]
    if results.errors:
        parts += ["errors:", *(f"  {e}" for e in results.errors)]
    return "\n".join(parts)


def _settings(settings: Mapping[str, str], lead: str) -> str:
    """` (K=V, ...)` after `lead`, or nothing when there are none."""
    return f"{lead}({', '.join(f'{k}={v}' for k, v in settings.items())})" if settings else ""
