"""Fixtures of the CLI's tests: the real services as processes, and `devsched` run as a subprocess."""

from __future__ import annotations

import subprocess

import pytest

from support.devsched_stack import Devsched, Stack, run_devsched


@pytest.fixture
def devsched(stack: Stack) -> Devsched:
    """Run `devsched ARGS...` aimed at the stack (through DEVSCHED_NATS_URL and DEVSCHED_SUBJECT_PREFIX)."""

    def run(*args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
        return run_devsched(*args, env=stack.cli_env(**env), timeout=timeout)

    return run
