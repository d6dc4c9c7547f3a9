"""Artifacts (issue 12) with the real agent, scheduler and CLI: a file a step leaves in
`$DEVSCHED_ARTIFACTS_DIR` is stored, listed with its sha256, and read back byte for byte."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import AsyncIterator

import pytest

from devsched.client import Client
from support.agent_e2e import AgentLab, shell

from .test_agent_logs_e2e import run_cli

pytestmark = pytest.mark.e2e

MiB = 1024 * 1024


@pytest.fixture
async def client(lab: AgentLab) -> AsyncIterator[Client]:
    async with Client.connect(lab.plane.nats_url, prefix=lab.prefix) as c:
        yield c


async def test_an_artifact_round_trips_with_its_sha256(lab: AgentLab, client: Client) -> None:
    await lab.agent("d1").ready()
    kept = lab.path("kept.bin")
    task_id = await lab.submit(
        [
            shell(
                "make",
                f'mkdir -p "$DEVSCHED_ARTIFACTS_DIR/out" && head -c {3 * MiB + 12345} /dev/urandom'
                f' | tee "$DEVSCHED_ARTIFACTS_DIR/out/data.bin" > "{kept}"'
                ' && ln -s /etc/passwd "$DEVSCHED_ARTIFACTS_DIR/passwd"',
            ),
            shell("more", 'echo hello > "$DEVSCHED_ARTIFACTS_DIR/hello.txt"'),
        ],
        lease_ttl_s=5,
    )
    await lab.wait_status(task_id, "done", within=90)
    view = await lab.task(task_id)
    expected = kept.read_bytes()
    sha = hashlib.sha256(expected).hexdigest()

    # the step results say what was stored, and what was not and why
    make, more = view["result"]["steps"]
    assert make["artifacts"]["stored"] == 1, make["artifacts"]
    assert make["artifacts"]["stored_bytes"] == len(expected)
    assert make["artifacts"]["failed"] == 1
    assert make["artifacts"]["failures"][0]["name"] == "passwd"
    assert "symbolic link" in make["artifacts"]["failures"][0]["error"]
    assert more["artifacts"] == {"stored": 1, "stored_bytes": 6, "failed": 0, "failures": []}, "only what is new"

    # the task view lists them
    listed = {(a["name"], a["size"], a["sha256"], a["step"]) for a in view["artifacts"]}
    assert listed == {
        ("out/data.bin", len(expected), sha, "make"),
        ("hello.txt", 6, hashlib.sha256(b"hello\n").hexdigest(), "more"),
    }

    cli = await run_cli(lab, "artifacts", "artifacts", task_id, "--json")
    rows = json.loads(cli.stdout)["artifacts"]
    assert [(r["attempt"], r["name"], r["sha256"]) for r in rows] == [
        (1, "hello.txt", hashlib.sha256(b"hello\n").hexdigest()),
        (1, "out/data.bin", sha),
    ]
    table = await run_cli(lab, "artifacts-table", "artifacts", task_id)
    assert sha.encode() in table.stdout

    target = lab.path("got.bin")
    await run_cli(lab, "get", "artifacts", "get", task_id, "out/data.bin", "-o", str(target))
    assert target.read_bytes() == expected, "byte for byte"
    again = await run_cli(lab, "get-stdout", "artifacts", "get", task_id, "hello.txt", "-o", "-")
    assert again.stdout == b"hello\n"
    assert await client.artifact_bytes(task_id, "out/data.bin") == expected, "and the Python client reads it too"


#: A small uploads rate share: 3 MiB a window of 4 s; an attempt may store 2 MiB (16 chunks, charged 2,112 KiB).
UPLOAD_RATE = {
    "artifact_max_attempt_bytes": 2 * MiB,
    "host_upload_bytes_per_s": 0.75 * MiB,
    "host_upload_rate_window_s": 4.0,
}
FILES = 4
FILE_BYTES = MiB // 2


@pytest.mark.parametrize("plane_settings", [UPLOAD_RATE])
async def test_a_commit_refused_for_the_upload_rate_is_retried_after_the_pause_and_stored(own_lab: AgentLab) -> None:
    # Two attempts back to back on one host: the first's four files (2,112 KiB charged) and the second's
    # first two (3,168 KiB in all) take the host past its 3 MiB; the second's third commit is refused 429
    # for the window, its chunks wait in the stream, and the agent commits again after the pause.
    await own_lab.agent("d1").ready()
    make = shell(
        "make",
        f'for i in $(seq {FILES}); do head -c {FILE_BYTES} /dev/urandom > "$DEVSCHED_ARTIFACTS_DIR/f$i.bin"; done',
    )
    first = await own_lab.submit([make], lease_ttl_s=5)
    await own_lab.wait_status(first, "done", within=60)
    started = time.monotonic()
    second = await own_lab.submit([make], lease_ttl_s=5)
    await own_lab.wait_status(second, "done", within=60)
    elapsed = time.monotonic() - started
    for task_id in (first, second):
        (step,) = (await own_lab.task(task_id))["result"]["steps"]
        assert step["artifacts"] == {"stored": FILES, "stored_bytes": FILES * FILE_BYTES, "failed": 0, "failures": []}
    print(f"\nthe second attempt took {elapsed:.1f} s")
    assert elapsed >= 3.0, f"the second attempt's uploads waited for the window ({elapsed:.1f} s)"
    log = (own_lab.plane.logs / "scheduler-0.log").read_text()
    assert "host's uploads over its rate share" in log


#: An honest attempt's large artifacts, uploaded at full speed at the default uploads rate share (the test
#: plane's uploads share, 40 MiB a host, and file cap, 32 MiB, are smaller than the defaults).
LARGE_FILES = 3
LARGE_FILE_BYTES = 32 * MiB


async def test_large_artifacts_at_full_speed_are_not_refused_at_the_default_settings(lab: AgentLab) -> None:
    # The default uploads rate share (32 MiB a second over 60 s: 1,920 MiB a window) holds an attempt's
    # whole quota in full chunks; this uploads 96 MiB as fast as this machine takes it, and nothing waits.
    agent = await lab.agent("d1").ready()
    task_id = await lab.submit(
        [
            shell(
                "make",
                f"for i in $(seq {LARGE_FILES}); do head -c {LARGE_FILE_BYTES} /dev/zero"
                ' > "$DEVSCHED_ARTIFACTS_DIR/big$i.bin"; done',
            )
        ],
        lease_ttl_s=10,
    )
    await lab.wait_status(task_id, "done", within=120)
    (step,) = (await lab.task(task_id))["result"]["steps"]
    assert step["artifacts"] == {
        "stored": LARGE_FILES,
        "stored_bytes": LARGE_FILES * LARGE_FILE_BYTES,
        "failed": 0,
        "failures": [],
    }
    stored = [await agent.wait_line("artifact stored", artifact=f"big{i}.bin") for i in range(1, LARGE_FILES + 1)]
    seconds = sum(line["ms"] for line in stored) / 1000
    print(
        f"\n{LARGE_FILES * LARGE_FILE_BYTES / MiB:.0f} MiB uploaded in {seconds:.2f} s: "
        f"{LARGE_FILES * LARGE_FILE_BYTES / MiB / seconds:.1f} MiB/s"
    )
    assert "host's uploads over its rate share" not in (lab.plane.logs / "scheduler-0.log").read_text()
