"""Plan files, request building, error lines, exit codes and `up`'s generated files (pure: no servers)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from devsched.agent.config import parse_config
from devsched.client import InvalidRequest, NotFound, PlanFileError, Selector, build_request, describe, load_request
from devsched.client.cli.common import ExitCode, exit_code_of, exit_code_of_status
from devsched.client.errors import NatsUnreachable, field_errors
from devsched.client.plans import load_document, parse_labels
from devsched.core.errors import LeaseExpired, TooLarge, Unavailable
from devsched.devstack.demo import demo_tasks
from devsched.devstack.layout import Layout, sim_hosts
from devsched.protocol.transport import NoReply

pytestmark = pytest.mark.unit

PLAN = {"steps": [{"name": "a", "action": "noop"}]}


def test_a_bare_yaml_plan_and_a_whole_json_request(tmp_path: Path) -> None:
    bare = tmp_path / "p.yml"
    bare.write_text("steps:\n  - name: a\n    action: sleep\n    args: {seconds: 1.5}\n")
    whole = tmp_path / "r.json"
    whole.write_text(json.dumps({"plan": PLAN, "priority": 9, "selector": {"labels": {"a": "1"}}}))

    assert load_request(bare).plan.steps[0].args == {"seconds": 1.5}
    request = load_request(whole)
    assert (request.priority, request.selector.labels) == (9, {"a": "1"})


def test_overrides_win_and_labels_merge() -> None:
    request = build_request(
        {"plan": PLAN, "selector": {"labels": {"platform": "android", "model": "pixel7"}}, "metadata": {"a": 1}},
        selector={"platform": "sim"},
        device_id="d1",
        priority=-5,
        name="n",
        metadata={"b": 2},
    )
    assert request.selector.labels == {"platform": "sim", "model": "pixel7"}
    assert request.selector.device_id == "d1"
    assert (request.priority, request.name, request.metadata) == (-5, "n", {"a": 1, "b": 2})
    replaced = build_request({"plan": PLAN, "selector": {"labels": {"x": "y"}}}, selector=Selector(labels={"z": "w"}))
    assert replaced.selector.labels == {"z": "w"}


def test_schema_errors_have_the_servers_paths() -> None:
    with pytest.raises(InvalidRequest) as caught:
        build_request({"steps": [{"name": "a", "action": "shell", "args": {}}, {"name": "a", "action": "noop"}]})
    assert [p for p, _ in field_errors(caught.value)] == ["plan.steps.0.args.command"]
    with pytest.raises(InvalidRequest) as caught:
        build_request({"plan": PLAN, "retries": 3})
    assert field_errors(caught.value) == [("retries", "Extra inputs are not permitted")]
    with pytest.raises(InvalidRequest) as caught:
        build_request({"name": "no plan"})
    assert field_errors(caught.value)[0][0] == ""


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("steps: [\n", "not valid YAML"),
        ("steps: []\nsteps: []\n", "duplicate key 'steps'"),
        ("- a\n- b\n", "must hold a mapping"),
    ],
)
def test_files_that_do_not_parse(tmp_path: Path, text: str, fragment: str) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(text)
    with pytest.raises(PlanFileError) as caught:
        load_document(path)
    assert fragment in caught.value.message
    assert caught.value.code == "invalid_request"


def test_json_files_are_parsed_as_json(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_text('{"steps": [}')
    with pytest.raises(PlanFileError, match="not valid JSON"):
        load_document(path)


def test_yaml_values_that_are_not_json_are_named(tmp_path: Path) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text("steps:\n  - name: a\n    action: x\n    args: {when: 2025-01-02}\n")
    with pytest.raises(InvalidRequest) as caught:
        load_request(path)
    assert field_errors(caught.value)[0][0] == "steps.0.args.when"


def test_labels_from_the_command_line() -> None:
    assert parse_labels(["platform=sim", "empty=", "k=v=w"]) == {"platform": "sim", "empty": "", "k": "v=w"}
    with pytest.raises(InvalidRequest) as caught:
        parse_labels(["novalue"])
    assert field_errors(caught.value)[0][0] == "selector.labels"


def test_describe_is_one_line_with_every_path() -> None:
    err = InvalidRequest("x", errors=[{"path": "a.b", "message": "bad\nthing"}, {"path": "", "message": "body"}],
                         error_count=150)  # fmt: skip
    assert describe(err) == "invalid_request: a.b: bad thing; body (and 148 more)"
    assert describe(NotFound("no such task")) == "not_found: no such task"


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (InvalidRequest(), ExitCode.USAGE),
        (TooLarge(), ExitCode.USAGE),
        (NotFound(), ExitCode.NOT_FOUND),
        (LeaseExpired(), ExitCode.CONFLICT),
        (Unavailable(), ExitCode.UNAVAILABLE),
        (NoReply(), ExitCode.UNAVAILABLE),
        (NatsUnreachable(), ExitCode.UNAVAILABLE),
    ],
)
def test_exit_codes_by_error_family(error: Exception, code: ExitCode) -> None:
    assert exit_code_of(error) is code  # type: ignore[arg-type]


def test_exit_codes_by_final_status() -> None:
    assert [exit_code_of_status(s) for s in ("done", "failed", "cancelled")] == [0, 1, 3]


def test_up_writes_agent_configs_the_agent_accepts(tmp_path: Path) -> None:
    layout = Layout(tmp_path / ".devsched")
    layout.create()
    hosts = sim_hosts(3, 2)
    assert [h.pool for h in hosts] == ["main", "main", "flaky"]
    path = layout.write_agent_config(hosts[0], nats_url="nats://127.0.0.1:1", prefix="dev", creds=None)
    config = parse_config(tomllib.loads(path.read_text()), source=str(path))
    assert config.host_id == "sim-1"
    assert [d.device_id for d in config.devices] == ["sim-1-d1", "sim-1-d2"]
    assert config.devices[0].labels == {"platform": "sim", "pool": "main", "host": "sim-1", "slot": "1"}
    assert config.spool_dir.is_dir()
    assert load_request(layout.example_plan).plan.steps[0].name == "hello"


def test_every_demo_task_is_a_valid_request() -> None:
    tasks = demo_tasks(sim_hosts(2, 1), "run1")
    assert {t.key for t in tasks} >= {"hello", "flaky-test", "soak-test", "needs-hardware", "survives-host-crash"}
    for task in tasks:
        assert build_request(task.body).name == f"demo-{task.key}"
    assert "survives-host-crash" not in {t.key for t in demo_tasks(sim_hosts(1, 2), "run1")}
