"""Every member builds to a wheel and an sdist that an index accepts: `twine check --strict`, LICENSE inside.

One `uv build --all-packages` (a few seconds: uv_build is the backend) into a temporary directory.
"""

from __future__ import annotations

import email.parser
import subprocess
import sys
import tarfile
import zipfile
from email.message import Message
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from support.workspace import ROOT, members, uv_binary

pytestmark = pytest.mark.release

MEMBERS = members()
NAMES = {member.name for member in MEMBERS}
VERSION = MEMBERS[0].project["version"]


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every member's wheel and sdist, built from this checkout."""
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [uv_binary(), "build", "--all-packages", "--quiet", "--out-dir", str(out)],
        cwd=ROOT,
        check=True,
        timeout=240,
    )
    return out


def _metadata(wheel: Path) -> Message:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [name for name in archive.namelist() if name.endswith(".dist-info/METADATA")]
        return email.parser.Parser().parsestr(archive.read(name).decode())


def _wheel(dist: Path, name: str) -> Path:
    return dist / f"{name.replace('-', '_')}-{VERSION}-py3-none-any.whl"


def test_every_member_builds_a_wheel_and_an_sdist(dist: Path) -> None:
    wheels = {path.name for path in dist.glob("*.whl")}
    sdists = {path.name for path in dist.glob("*.tar.gz")}
    assert wheels == {_wheel(dist, name).name for name in NAMES}
    assert sdists == {f"{name.replace('-', '_')}-{VERSION}.tar.gz" for name in NAMES}


def test_twine_check_passes_strict(dist: Path) -> None:
    files = sorted(str(path) for pattern in ("*.whl", "*.tar.gz") for path in dist.glob(pattern))
    result = subprocess.run(
        [sys.executable, "-m", "twine", "--no-color", "check", "--strict", *files],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("PASSED") == len(files)


@pytest.mark.parametrize("name", sorted(NAMES))
def test_the_wheel_carries_license_readme_and_pins(dist: Path, name: str) -> None:
    wheel = _wheel(dist, name)
    with zipfile.ZipFile(wheel) as archive:
        licenses = [entry for entry in archive.namelist() if entry.endswith(".dist-info/licenses/LICENSE")]
        assert len(licenses) == 1, f"{wheel.name} has no LICENSE"
        assert archive.read(licenses[0]) == (ROOT / "LICENSE").read_bytes()
    metadata = _metadata(wheel)
    assert metadata["License-Expression"] == "Apache-2.0"
    assert metadata["Description-Content-Type"] == "text/markdown"
    assert str(metadata.get_payload()).startswith(f"# {name}\n")
    assert metadata.get_all("Project-URL")
    siblings = [Requirement(line) for line in metadata.get_all("Requires-Dist") or []]
    unpinned = [str(req) for req in siblings if req.name in NAMES and str(req.specifier) != f"=={VERSION}"]
    assert not unpinned


@pytest.mark.parametrize("name", sorted(NAMES))
def test_the_sdist_carries_license_and_readme(dist: Path, name: str) -> None:
    stem = f"{name.replace('-', '_')}-{VERSION}"
    with tarfile.open(dist / f"{stem}.tar.gz") as archive:
        license_file = archive.extractfile(f"{stem}/LICENSE")
        assert license_file is not None, "LICENSE is a link in the sdist, not the file"
        assert license_file.read() == (ROOT / "LICENSE").read_bytes()
        assert archive.getmember(f"{stem}/README.md").isfile()
