"""What streaming step output costs a step that prints at full speed, with and without it.

    ./dev run python tests/bench/log_stream_probe.py                    # yes | head -c 100M, 3 runs each
    ./dev run python tests/bench/log_stream_probe.py --mib 20 --runs 5
    ./dev run python tests/bench/log_stream_probe.py --line "2026-01-02 10:00:00 INFO a log line of 60 bytes"

Starts its own nats-server (JetStream on disk in a temporary directory, the server's default sync), the
logs stream as the scheduler makes it, a stand-in scheduler in this process (`support.fake_scheduler`)
and one real `devsched-agent` process per configuration. Each run assigns one `shell` step
`yes | head -c <N>M` and reports, from the step's own start and finish times in the report, its wall time,
and the agent process's CPU (user + system, from /proc) from the assignment to the report; with streaming,
also what the end record says (bytes sent, dropped, cut at the cap). Configurations: streaming off;
streaming on with the default cap (64 MiB); streaming on with the cap above the output (everything sent).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import nats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for `support`

from devsched.client.logs import LogReader
from devsched.embedded import ChildProcess, free_port, nats_server_binary
from devsched.embedded.server import tcp_accepts
from devsched.protocol import messages as m
from devsched.protocol.logs import LogKind
from devsched.protocol.subjects import Subjects
from support.fake_scheduler import FakeScheduler
from support.log_stream import logs_stream, task_view
from support.polling import eventually

HOST = "probe-h1"
DEVICE = "probe-d1"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


async def run_config(
    name: str, options: dict[str, Any], *, nats_url: str, work: Path, mib: int, runs: int, line: str
) -> list[dict[str, Any]]:
    subjects = Subjects(f"probe{name}")
    nc = await nats.connect(nats_url)
    scheduler = FakeScheduler(nc, subjects)
    await scheduler.start()
    results = []
    try:
        async with logs_stream(nc, subjects, HOST):
            config = work / f"{name}.toml"
            lines = [
                f'host_id = "{HOST}"',
                f'spool_dir = "{work / (name + "-spool")}"',
                f'work_dir = "{work / (name + "-work")}"',
                f'nats_url = "{nats_url}"',
                f'subject_prefix = "{subjects.prefix}"',
                *(
                    f"{key} = {str(value).lower() if isinstance(value, bool) else value}"
                    for key, value in options.items()
                ),
                "[[devices]]",
                f'device_id = "{DEVICE}"',
            ]
            config.write_text("\n".join(lines) + "\n")
            env = {k: v for k, v in os.environ.items() if not k.startswith("DEVSCHED_")}
            agent = ChildProcess(
                "agent", [sys.executable, "-m", "devsched.agent.main", "--config", str(config)], env,
                work / f"{name}-agent.log", stop_timeout=20.0,
            ).start()  # fmt: skip
            try:
                # polled here, not with `wait_ready`, which would block the loop the stand-in scheduler answers on
                await eventually(lambda: agent.logged("bound to the assignments consumer"), timeout=60, message="agent")
                assert agent.pid is not None
                for _ in range(runs):
                    step = m.Step(
                        name="flood", action="shell", args={"command": f"yes {shlex.quote(line)} | head -c {mib}M"}
                    )
                    cpu0 = cpu_seconds(agent.pid)
                    row = await scheduler.assign(HOST, DEVICE, [step])
                    await eventually(lambda row=row: row.reports, timeout=600, message="the report")
                    cpu = cpu_seconds(agent.pid) - cpu0
                    report = row.reports[0]
                    result = report.result.steps[0]
                    assert result.started_at is not None
                    assert result.finished_at is not None
                    entry: dict[str, Any] = {
                        "status": result.status.value,
                        "step_s": (result.finished_at - result.started_at).total_seconds(),
                        "agent_cpu_s": cpu,
                    }
                    if options.get("log_streaming", True):
                        a = report

                        async def probe(a: m.ReportRequest = a) -> m.TaskView:
                            return task_view(a.task_id, HOST, (a.attempt, "done"), status="done")

                        end = None
                        async with LogReader(nc.jetstream(), subjects, report.task_id, probe, attempt=1) as reader:
                            async for record in reader:
                                if record.kind is LogKind.END:
                                    end = record
                        assert end is not None, "no end record"
                        entry.update(
                            sent_mib=(end.sent_bytes or 0) / 2**20,
                            dropped_mib=(end.dropped_bytes or 0) / 2**20,
                            output_mib=(end.output_bytes or 0) / 2**20,
                        )
                    results.append(entry)
            finally:
                agent.stop()
    finally:
        await scheduler.stop()
        await nc.close()
    return results


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=100, help="MiB the step prints (default 100)")
    parser.add_argument("--runs", type=int, default=3, help="runs per configuration (default 3)")
    parser.add_argument("--line", default="y", help="the line `yes` prints (default y)")
    args = parser.parse_args()
    configs: list[tuple[str, dict[str, Any]]] = [
        ("off", {"log_streaming": False}),
        ("on", {}),
        ("uncapped", {"log_max_bytes": 2 * args.mib * 2**20}),
    ]
    with tempfile.TemporaryDirectory(prefix="log-probe-") as tmp:
        work = Path(tmp)
        port = free_port()
        server = ChildProcess(
            "nats-server", [str(nats_server_binary()), "-js", "-sd", str(work / "js"), "-a", "127.0.0.1",
                            "-p", str(port)], None, work / "nats.log", stop_timeout=10.0,
        ).start()  # fmt: skip
        try:
            server.wait_ready(lambda: tcp_accepts("127.0.0.1", port), timeout=15)
            print(
                f"yes {shlex.quote(args.line)} | head -c {args.mib}M, {args.runs} runs per configuration;"
                " median (min-max)"
            )
            for name, options in configs:
                runs = await run_config(
                    name,
                    options,
                    nats_url=f"nats://127.0.0.1:{port}",
                    work=work,
                    mib=args.mib,
                    runs=args.runs,
                    line=args.line,
                )

                def summary(key: str, runs: list[dict[str, Any]] = runs) -> str:
                    values = [r[key] for r in runs]
                    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"

                line = f"{name:>9}: step {summary('step_s')} s, agent CPU {summary('agent_cpu_s')} s"
                if "sent_mib" in runs[0]:
                    line += (
                        f", sent {summary('sent_mib')} MiB, dropped {summary('dropped_mib')} MiB"
                        f" of {summary('output_mib')} MiB"
                    )
                print(line, flush=True)
        finally:
            server.stop()


if __name__ == "__main__":
    asyncio.run(main())
