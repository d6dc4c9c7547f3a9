"""Fixtures of the CLI's tests: the real services as processes, and `devsched` run as a subprocess."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

# Shared with the client's integration tests.
from support.devsched_stack import Devsched, Stack, run_devsched, stack_for_tests
from support.servers import NatsHandle, PostgresHandle


@pytest.fixture(scope="module")
def stack(
    nats_server: NatsHandle,
    postgres_server: PostgresHandle,
    database_template: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Stack]:
    """Scheduler, sweeper and an agent with two `platform=sim` devices, on a database and prefix of their own."""
    with stack_for_tests(nats_server, postgres_server, database_template, tmp_path_factory.mktemp("stack")) as s:
        yield s


@pytest.fixture
def devsched(stack: Stack) -> Devsched:
    """Run `devsched ARGS...` aimed at the stack (through DEVSCHED_NATS_URL and DEVSCHED_SUBJECT_PREFIX)."""

    def run(*args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
        return run_devsched(*args, env=stack.cli_env(**env), timeout=timeout)

    return run
