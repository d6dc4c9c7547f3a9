"""`./dev up` installs what `devsched up` runs, and only that: its package list is the stack's."""

from __future__ import annotations

import re

import pytest

from devsched.devstack import stack
from support.workspace import ROOT, members

pytestmark = pytest.mark.unit


def _run_packages() -> set[str]:
    match = re.search(r"^RUN_PACKAGES=\(([^)]*)\)$", (ROOT / "dev").read_text(), re.MULTILINE)
    assert match, "./dev defines RUN_PACKAGES=(...) on one line"
    return set(match.group(1).split())


def _distribution_of(module: str) -> str:
    owners = [
        member.name
        for member in members()
        if module == (name := member.pyproject["tool"]["uv"]["build-backend"]["module-name"])
        or module.startswith(name + ".")
    ]
    assert len(owners) == 1, f"{module} belongs to {owners}"
    return owners[0]


def test_dev_up_installs_the_stack_and_every_service_it_starts() -> None:
    started = {_distribution_of(module) for module in (*stack.SERVICES, stack.WEB_MODULE)}
    assert started == set(stack.SERVICES.values()) | {"devsched-web"}
    assert _run_packages() == {"devsched-devstack", *started}


def test_dev_up_leaves_out_the_dev_and_bench_groups() -> None:
    text = (ROOT / "dev").read_text()
    body = text[text.index("sync_run() {") : text.index("\n}\n", text.index("sync_run() {"))]
    assert "--no-default-groups" in body
    assert "--inexact" in body  # a full environment keeps its tools
    assert "--group" not in body
    assert "--all-packages" not in body
