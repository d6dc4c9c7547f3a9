"""A host flooding its own log subject, as a process of its own: `python -m support.log_flood ARGS`.

Apart from the test's process, so that its publish loop takes no time from the other host's renewals the test
measures (as on a real lab, where each host is a machine of its own). It publishes well-formed output records
of the attempt it was given on the host's log subject, `in_flight` at a time, for `seconds`, and prints one JSON
line: the wall-clock time of its first publish, and of each stored and each refused one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from datetime import UTC, datetime

import nats
from nats.js.errors import APIError

from devsched.protocol.codec import encode
from devsched.protocol.logs import DataEncoding, LogKind, LogRecord, OutputStream
from devsched.protocol.subjects import MSG_ID_HEADER, Subjects, log_msg_id

#: JetStream's error code for a publish refused at a stream's limits.
REFUSED = 10077


def output_record(task_id: uuid.UUID, seq: int, data: str) -> bytes:
    """An output record of attempt 1 of `task_id`."""
    return encode(
        LogRecord(
            task_id=task_id,
            attempt=1,
            seq=seq,
            kind=LogKind.OUTPUT,
            at=datetime.now(UTC),
            offset=(seq - 1) * len(data),
            step="run",
            index=0,
            stream=OutputStream.STDOUT,
            encoding=DataEncoding.UTF8,
            data=data,
        )
    )


async def flood(args: argparse.Namespace) -> dict[str, object]:
    nc = await nats.connect(args.nats_url)
    js = nc.jetstream()
    task_id = uuid.UUID(args.task_id)
    subject = Subjects(args.prefix).host_log(args.host_id, task_id, 1)
    data = "a" * args.record_bytes
    stored: list[float] = []
    refused: list[float] = []
    others: list[str] = []
    counter = iter(range(1, 1 << 62))
    started, end = time.time(), time.monotonic() + args.seconds

    async def worker() -> None:
        while time.monotonic() < end:
            seq = next(counter)
            headers = {MSG_ID_HEADER: log_msg_id(args.lease_id, seq)}
            try:
                await js.publish(subject, output_record(task_id, seq, data), headers=headers)
            except APIError as exc:
                if exc.err_code == REFUSED and "maximum messages exceeded" in str(exc):
                    refused.append(time.time())
                else:
                    others.append(repr(exc))
                continue
            stored.append(time.time())

    await asyncio.gather(*(worker() for _ in range(args.in_flight)))
    await nc.close()
    return {"started": started, "stored": stored, "refused": refused, "other_errors": others[:5]}


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("nats_url", "prefix", "host_id", "task_id", "lease_id"):
        parser.add_argument(f"--{name.replace('_', '-')}", required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument("--record-bytes", type=int, default=512)
    print(json.dumps(asyncio.run(flood(parser.parse_args()))))


if __name__ == "__main__":
    main()
