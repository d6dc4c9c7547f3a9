"""Every member is publishable as it stands: one version, siblings pinned to it, the same metadata.

The wheels themselves are built and checked by tests/release/test_wheels.py; this reads the pyprojects only.
"""

from __future__ import annotations

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from trove_classifiers import classifiers as known_classifiers

from support.workspace import ROOT, Member, members

pytestmark = pytest.mark.unit

MEMBERS = members()
NAMES = {member.name for member in MEMBERS}
IDS = [member.name for member in MEMBERS]


def _version() -> str:
    versions = {member.project["version"] for member in MEMBERS}
    assert len(versions) == 1, f"members disagree on the version: {sorted(versions)}"
    return versions.pop()


def test_the_workspace_has_its_members() -> None:
    assert len(MEMBERS) >= 13
    assert {"devsched-core", "devsched-client", "devsched-agent", "devsched-action-adb"} <= NAMES


def test_every_member_has_the_one_workspace_version() -> None:
    _version()


@pytest.mark.parametrize("member", MEMBERS, ids=IDS)
def test_siblings_are_pinned_to_the_workspace_version(member: Member) -> None:
    pin = SpecifierSet(f"=={_version()}")
    requirements = [Requirement(line) for line in member.project.get("dependencies", [])]
    siblings = [requirement for requirement in requirements if requirement.name in NAMES]
    unpinned = [str(requirement) for requirement in siblings if requirement.specifier != pin]
    assert not unpinned, f"{member.name}: pin these to =={_version()}: {unpinned}"


@pytest.mark.parametrize("member", MEMBERS, ids=IDS)
def test_readme_and_license_ship_in_the_distributions(member: Member) -> None:
    project = member.project
    assert project["readme"] == "README.md"
    readme = (member.path / "README.md").read_text()
    assert readme.startswith(f"# {member.name}\n"), "the README opens with the distribution's name"
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE"]
    # A link to the root's LICENSE (uv_build refuses `..` in license-files): the text is defined once.
    assert (member.path / "LICENSE").read_bytes() == (ROOT / "LICENSE").read_bytes()


@pytest.mark.parametrize("member", MEMBERS, ids=IDS)
def test_classifiers_are_pypis_and_the_licence_is_an_expression(member: Member) -> None:
    classifiers = member.project["classifiers"]
    assert classifiers, f"{member.name} has no classifiers"
    unknown = [classifier for classifier in classifiers if classifier not in known_classifiers]
    assert not unknown, f"{member.name}: not PyPI classifiers: {unknown}"
    # PEP 639: with a `license` expression a `License ::` classifier is an error at upload.
    assert not [classifier for classifier in classifiers if classifier.startswith("License ::")]


def test_members_share_python_classifiers_and_urls() -> None:
    first = MEMBERS[0].project
    for member in MEMBERS[1:]:
        for key in ("requires-python", "classifiers", "urls"):
            assert member.project.get(key) == first.get(key), f"{member.name} differs from {MEMBERS[0].name} in {key}"
    assert first["requires-python"] == ">=3.11"
    assert {"Homepage", "Documentation", "Repository", "Changelog"} <= set(first["urls"])


def test_the_bad_pin_is_caught() -> None:
    """The pin check itself: a range or a bare name is not the pin."""
    pin = SpecifierSet("==0.1.0")
    assert Requirement("devsched-core==0.1.0").specifier == pin
    assert Requirement("devsched-core").specifier != pin
    assert Requirement("devsched-core>=0.1.0").specifier != pin
