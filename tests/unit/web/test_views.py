"""The dashboard's pure view-model functions: states and colours, ages, label filters, redaction, the
timeline of an attempt (never a lease id), the queue order, the chart series, the security helpers."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from devsched.protocol.messages import ActionView, AttemptView, DeviceView, HostView, TaskEvent, TaskSummary, TaskView
from devsched.web import charts, security, views

pytestmark = pytest.mark.unit

NOW = datetime(2026, 1, 2, 12, 0, tzinfo=UTC)


def device(device_id: str, state: str = "available", **fields: Any) -> DeviceView:
    return DeviceView(device_id=device_id, labels=fields.pop("labels", {}), state=state, **fields)


def host(host_id: str, devices: list[DeviceView], online: bool = True) -> HostView:
    return HostView(host_id=host_id, online=online, last_seen_at=NOW - timedelta(seconds=3), devices=devices)


def summary(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "task_id": uuid.uuid4(),
        "status": "queued",
        "priority": 0,
        "max_attempts": 3,
        "attempt_count": 0,
        "cancel_requested": False,
        "selector": {},
        "plan": {"steps": [{"name": "s", "action": "noop"}]},
        "created_at": NOW - timedelta(minutes=5),
        "updated_at": NOW,
    }
    base.update(fields)
    return base


@pytest.mark.parametrize(
    ("state", "online", "fields", "shown"),
    [
        ("available", True, {}, "available"),
        ("reserved", True, {}, "reserved"),
        ("available", False, {}, "offline"),
        ("reserved", False, {}, "offline"),
        ("drained", True, {"drained": True}, "drained"),
        ("available", False, {"drained": True}, "drained"),  # an operator's drain outlives the host's absence
        ("quarantined", True, {"quarantined": True}, "quarantined"),
        ("quarantined", False, {"quarantined": True}, "quarantined"),  # so does the scheduler's quarantine
        ("drained", True, {"drained": True, "quarantined": True}, "drained"),  # the operator's act first
    ],
)
def test_device_state(state: str, online: bool, fields: dict[str, Any], shown: str) -> None:
    assert views.device_state(device("d", state, **fields), online) == shown


def test_state_classes_cover_every_state_and_unknown_ones_are_neutral() -> None:
    for state in (*views.DEVICE_STATES, "queued", "dispatched", "done", "failed", "cancelled"):
        assert views.state_class(state) == f"state-{state}"
    assert views.state_class("<script>") == "state-unknown"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(-5, "0s"), (0, "0s"), (59, "59s"), (60, "1m"), (3599, "59m"), (3600 + 5 * 60, "1h05m"), (50 * 3600, "2d2h")],
)
def test_age(seconds: int, text: str) -> None:
    assert views.age(NOW - timedelta(seconds=seconds), NOW) == text


def test_label_filters_parse_and_match() -> None:
    filters = views.parse_label_filters(["platform=android", "", "junk", "=x", " model = pixel7 "])
    assert filters == {"platform": "android", "model": "pixel7"}
    assert views.matches({"platform": "android", "model": "pixel7", "x": "y"}, filters)
    assert not views.matches({"platform": "android"}, filters)
    assert views.matches({}, {})


def test_lab_counts_every_device_but_shows_only_the_filtered_ones() -> None:
    hosts = [
        host("h2", [device("b1", labels={"platform": "ios"})], online=False),
        host(
            "h1",
            [device("a1", "reserved", labels={"platform": "android"}), device("a2", labels={"platform": "ios"})],
        ),
    ]
    running = {"a1": views.Running("t1", "nightly", 1)}
    lab = views.lab(hosts, running, {"platform": "ios"}, NOW)
    assert lab.counts["reserved"] == 1
    assert lab.counts["available"] == 1
    assert lab.counts["offline"] == 1
    assert (lab.devices_shown, lab.devices_total) == (2, 3)
    assert [h.host_id for h in lab.hosts] == ["h1", "h2"]
    assert [c.device_id for h in lab.hosts for c in h.devices] == ["a2", "b1"]
    assert lab.label_choices == {"platform": ["android", "ios"]}
    everything = views.lab(hosts, running, {}, NOW)
    cell = everything.hosts[0].devices[0]
    assert cell.running is not None
    assert cell.running.name == "nightly"
    assert cell.css == "state-reserved"
    assert views.lab(hosts, running, {"platform": "none"}, NOW).hosts == []


def test_redact_hides_secret_looking_keys_at_any_depth() -> None:
    value = {"team": "qa", "API_TOKEN": "x", "nested": [{"password": "p", "ok": 1}], "lease_id": "l"}
    assert views.redact(value) == {
        "team": "qa",
        "API_TOKEN": views.HIDDEN,
        "nested": [{"password": views.HIDDEN, "ok": 1}],
        "lease_id": views.HIDDEN,
    }


def test_step_rows_hide_every_environment_value() -> None:
    task = TaskSummary.model_validate(
        summary(plan={"steps": [{"name": "s", "action": "shell", "args": {"command": "c", "env": {"K": "secret"}}}]})
    )
    (row,) = views.step_rows(task)
    assert row["args"] == {"command": "c", "env": {"K": views.HIDDEN}}


def test_hide_lease_ids_in_text() -> None:
    lease = str(uuid.uuid4())
    assert lease not in views.hide_lease_ids(f"lease={lease}\n", [lease, ""])


def test_an_attempt_row_is_a_timeline_without_the_lease_id() -> None:
    task_id, lease = uuid.uuid4(), uuid.uuid4()
    attempt = AttemptView(
        attempt=1, lease_id=lease, host_id="h", device_id="d", status="done", assigned_at=NOW,
        dispatched_at=NOW + timedelta(seconds=1), expires_at=NOW + timedelta(seconds=30),
        ended_at=NOW + timedelta(seconds=9), end_reason="done",
    )  # fmt: skip
    events = [
        TaskEvent(event="progress", task_id=task_id, seq=4, attempt=1, status="dispatched",
                  at=NOW + timedelta(seconds=2), progress={"step": "build", "index": 0, "of": 2}),
        TaskEvent(event="progress", task_id=task_id, seq=5, attempt=2, status="dispatched",
                  at=NOW + timedelta(seconds=3), progress={"step": "other attempt", "index": 0, "of": 2}),
    ]  # fmt: skip
    row = views.attempt_row(attempt, events)
    assert [(m.what, m.detail) for m in row.timeline] == [
        ("assigned", "h / d"), ("dispatched", ""), ("step", "step 1/2: build"), ("ended", "done"),
    ]  # fmt: skip
    assert str(lease) not in repr(row)
    assert not hasattr(row, "lease_id")


def test_queue_order_is_priority_then_age() -> None:
    old = TaskSummary.model_validate(summary(name="old", created_at=NOW - timedelta(hours=1)))
    new = TaskSummary.model_validate(summary(name="new"))
    urgent = TaskSummary.model_validate(summary(name="urgent", priority=10))
    assert [t.name for t in views.queue_order([new, urgent, old])] == ["urgent", "old", "new"]
    row = views.task_row(urgent, NOW)
    assert (row.age, row.css, row.attempt) == ("5m", "state-queued", "")


def test_artifacts_newest_attempt_first_with_their_download_paths() -> None:
    assert views.artifacts(TaskView.model_validate(summary())) == []
    task_id = uuid.uuid4()

    def artifact(attempt: int, name: str) -> dict[str, Any]:
        return {
            "attempt": attempt, "name": name, "step": "build", "size": 2048, "sha256": "ab" * 32,
            "host_id": "h", "stored_at": NOW, "object": f"{task_id}/{attempt}/u{attempt}",
        }  # fmt: skip

    view = TaskView.model_validate(
        summary(task_id=task_id, artifacts=[artifact(1, "z.txt"), artifact(2, "logs/a b#.txt"), artifact(2, "b")])
    )
    rows = views.artifacts(view)
    assert [(r.attempt, r.name) for r in rows] == [(2, "b"), (2, "logs/a b#.txt"), (1, "z.txt")]
    assert rows[1].href == f"/tasks/{task_id}/artifacts/2/logs/a%20b%23.txt"
    assert (rows[0].size, rows[0].sha256, rows[0].step) == (2048, "ab" * 32, "build")


def test_sizes_and_durations_read_short() -> None:
    assert [views.size_text(n) for n in (0, 1023, 1024, 5 * 2**20 + 2**19, 3 * 2**40)] == [
        "0 B", "1023 B", "1.0 KiB", "5.5 MiB", "3072.0 GiB",
    ]  # fmt: skip
    assert [views.seconds_text(s) for s in (1.5, 45, 90, 600, 7500)] == ["1.5 s", "45 s", "1m30s", "10m", "2h05m"]


def test_policy_rows_show_the_retry_policy_and_time_limits() -> None:
    assert views.policy_rows(TaskView.model_validate(summary())) == []
    view = TaskView.model_validate(
        summary(
            retry={"on": ["infra", "step_failed"], "backoff": {"initial_s": 5, "max_s": 300, "multiplier": 2}},
            queue_timeout_s=600,
            attempt_timeout_s=90,
        )
    )
    assert views.policy_rows(view) == [
        ("Retried on", "infra, step_failed"),
        ("Backoff", "5 s ×2 per retry, at most 5m"),
        ("Queue timeout", "10m"),
        ("Attempt timeout", "1m30s"),
    ]


@pytest.mark.parametrize(
    ("reason", "parts"),
    [
        (None, ("", "")),
        ("retry_backoff: attempt 1 ended, waiting", ("retry_backoff", "attempt 1 ended, waiting")),
        ("no_host_with_action: none offers adb", ("no_host_with_action", "none offers adb")),
        ("waiting: for what", ("waiting", "for what")),
        ("no code here", ("", "no code here")),
        ("a b: c", ("", "a b: c")),
    ],
)  # fmt: skip
def test_pending_reasons_split_into_code_and_words(reason: str | None, parts: tuple[str, str]) -> None:
    assert views.pending_parts(reason) == parts


def test_the_lab_names_each_hosts_plugin_actions_without_the_builtins() -> None:
    h = host("h1", [device("d1")]).model_copy(
        update={
            "actions": [
                ActionView(name="shell"),
                ActionView(name="adb-instrument", version="1.2"),
                ActionView(name="noop"),
            ]
        }
    )
    assert views.lab([h], {}, {}, NOW).hosts[0].plugin_actions == ["adb-instrument"]
    assert views.lab([host("h2", [])], {}, {}, NOW).hosts[0].plugin_actions == []


def test_cancellable_and_in_flight() -> None:
    assert views.cancellable("queued")
    assert views.cancellable("dispatched")
    assert not views.cancellable("done")
    assert views.in_flight("assigned")
    assert not views.in_flight("queued")


def test_series_counts_per_minute_and_forgets_the_old_minutes() -> None:
    series = charts.Series(window_min=10)
    series.finished("done", NOW)
    series.finished("done", NOW + timedelta(seconds=30))
    series.finished("failed", NOW)
    series.depth(5, NOW)
    series.depth(3, NOW + timedelta(seconds=10))  # a minute keeps its largest sample
    last = series.finished_per_minute(NOW, 3)
    assert len(last) == 3
    assert last[-1][1] == {"done": 2, "failed": 1, "cancelled": 0}
    assert series.depth_per_minute(NOW, 2)[-1][1] == 5
    assert series.depth_per_minute(NOW, 2)[0][1] is None
    series.finished("cancelled", NOW + timedelta(minutes=30))
    assert series.finished_per_minute(NOW, 1)[0][1]["done"] == 0  # trimmed away
    bars, top = charts.stacked_bars([(1, {"done": 2, "failed": 1}), (2, {})], 100, 50)
    assert top == 3
    assert [b.css for b in bars] == ["bar-done", "bar-failed"]
    assert sum(b.height for b in bars) == pytest.approx(50)


def test_csrf_and_origin_checks() -> None:
    token = security.new_csrf_token()
    assert security.csrf_ok(token, token)
    assert not security.csrf_ok(token, token + "x")
    assert not security.csrf_ok(None, token)
    assert not security.csrf_ok(token, None)
    assert not security.csrf_ok("", "")
    assert security.same_origin(None, "127.0.0.1:8080")
    assert security.same_origin("http://127.0.0.1:8080", "127.0.0.1:8080")
    assert not security.same_origin("https://evil.example", "127.0.0.1:8080")
    assert not security.same_origin("null", "127.0.0.1:8080")
    assert not security.same_origin("http://[::1", "127.0.0.1:8080")  # not a URL: refused, not an error


def test_a_window_is_one_page_of_a_long_table_clamped_to_the_pages_there_are() -> None:
    first = views.window(10_000, 1, 200)
    assert (first.start, first.stop, first.pages, first.more, first.previous, first.next) == (0, 200, 50, 9800, None, 2)
    last = views.window(10_000, 99, 200)
    assert (last.page, last.start, last.stop, last.more, last.next) == (50, 9800, 10_000, 0, None)
    odd = views.window(450, 3, 200)
    assert (odd.start, odd.stop, odd.more, odd.previous) == (400, 450, 0, 2)
    empty = views.window(0, 5, 200)
    assert (empty.page, empty.pages, empty.start, empty.stop) == (1, 1, 0, 0)
    assert [views.page_number(raw) for raw in (None, "", "2", "0", "-3", "x", "9" * 30)] == [1, 1, 2, 1, 1, 1, 1]


def test_device_history_rows_label_kind_status_and_the_more_link() -> None:
    user = TaskSummary.model_validate(summary(name="flash", status="done", reason=None))
    check = TaskSummary.model_validate(
        summary(name="health:adb", status="failed", reason="adb not answering", kind="health", health_device_id="d1")
    )
    anonymous = TaskSummary.model_validate(summary(status="cancelled"))
    rows = views.device_history([user, check, anonymous])
    assert [(r.label, r.health, r.status, r.reason) for r in rows] == [
        ("flash", False, "done", None),
        ("health:adb", True, "failed", "adb not answering"),
        (str(anonymous.task_id)[:8], False, "cancelled", None),
    ]
    assert rows[0].at == user.updated_at
    assert rows[0].task_id == str(user.task_id)
    assert views.more_path("d 1", None) is None
    assert views.more_path("d 1", "abc=") == "/devices/d%201?after=abc%3D"
