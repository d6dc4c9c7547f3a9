"""The Procrastinate worker of the peer figures, as a process of its own (like the devsched agent).

    python -m devsched.bench.peer_worker DSN CONCURRENCY POOL_SIZE

Opens the app (its connection pool) and prints `ready`; on a line on stdin runs one worker at
CONCURRENCY until the queue is empty, prints `done`, and exits at the end of stdin. Waiting for the go
keeps Python's start-up and the pool's connections out of the measured time and CPU.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence

from devsched.bench.peer import QUEUE, make_app


async def _work(dsn: str, concurrency: int, pool_size: int) -> None:
    app = make_app(dsn, min_size=min(4, pool_size), max_size=pool_size)
    async with app.open_async():
        print("ready", flush=True)
        if not await asyncio.to_thread(sys.stdin.readline):
            return
        await app.run_worker_async(queues=[QUEUE], concurrency=concurrency, wait=False, install_signal_handlers=False)
        print("done", flush=True)
        await asyncio.to_thread(sys.stdin.read)


def main(argv: Sequence[str] | None = None) -> None:
    """Run the worker (see the module's docstring)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 3:
        sys.exit(f"usage: {__doc__}")
    asyncio.run(_work(args[0], int(args[1]), int(args[2])))


if __name__ == "__main__":  # pragma: no cover
    main()
