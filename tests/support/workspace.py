"""The workspace's members as their pyproject.toml files say: what the packaging tests read."""

from __future__ import annotations

import os
import shutil
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Member:
    """One workspace member: its directory and its parsed pyproject.toml."""

    path: Path
    pyproject: dict[str, Any]

    @property
    def project(self) -> dict[str, Any]:
        """The `[project]` table."""
        return self.pyproject["project"]  # type: ignore[no-any-return]

    @property
    def name(self) -> str:
        """The distribution name, such as `devsched-core`."""
        return str(self.project["name"])


def members() -> list[Member]:
    """Every member matched by the root's `[tool.uv.workspace] members` globs, sorted by name."""
    root = tomllib.loads((ROOT / "pyproject.toml").read_text())
    found = [
        Member(pyproject.parent, tomllib.loads(pyproject.read_text()))
        for pattern in root["tool"]["uv"]["workspace"]["members"]
        for pyproject in ROOT.glob(f"{pattern}/pyproject.toml")
    ]
    return sorted(found, key=lambda member: member.name)


def uv_binary() -> str:
    """The uv running these tests: `uv run` (which `./dev test` is) names its own binary in UV; PATH is the fallback."""
    uv = os.environ.get("UV") or shutil.which("uv")
    assert uv, "uv not found: run the tests through ./dev test"
    return uv
