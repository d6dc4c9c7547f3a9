"""The container image's build file (deploy/docker/Dockerfile) and CI's build of it (.ci/image).

No container engine runs here: the file is parsed (line continuations joined, `ARG` defaults resolved) and
checked for a base pinned by version and digest and for the OCI labels; `.ci/image` is run for what it does
without an engine.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import tomllib

import pytest

from unit.deploy.manifests import DEPLOY

pytestmark = pytest.mark.unit

ROOT = DEPLOY.parent
DOCKERFILE = DEPLOY / "docker" / "Dockerfile"
CI_IMAGE = ROOT / ".ci" / "image"
#: The annotations of the OCI image spec the image carries (org.opencontainers.image.<key>).
OCI_LABELS = {
    "title", "description", "version", "revision", "created", "source", "licenses", "base.name", "base.digest"
}  # fmt: skip
#: The build arguments .ci/image fills in for the labels (the rest have fixed values).
BUILD_ARGS = {"VERSION", "REVISION", "CREATED", "SOURCE"}


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, comments dropped and continuation lines joined."""
    result: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        keyword, _, rest = line.partition(" ")
        result.append((keyword.upper(), rest.strip()))
    return result


def global_args(steps: list[tuple[str, str]]) -> dict[str, str]:
    """The `ARG name=default` before the first FROM: what a FROM line may use."""
    found: dict[str, str] = {}
    for keyword, rest in steps:
        if keyword == "FROM":
            break
        if keyword == "ARG" and "=" in rest:
            name, _, value = rest.partition("=")
            found[name] = value
    return found


def substitute(text: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], text)


def labels(steps: list[tuple[str, str]]) -> dict[str, str]:
    found: dict[str, str] = {}
    for keyword, rest in steps:
        if keyword == "LABEL":
            for pair in shlex.split(rest):
                key, _, value = pair.partition("=")
                found[key] = value
    return found


def test_the_parser_joins_continuations_and_drops_comments() -> None:
    steps = instructions('# c\nARG A=1\nLABEL a="x y" \\\n      # inside\n      b="${A}"\nFROM img@sha256:00 AS s\n')
    assert steps == [("ARG", "A=1"), ("LABEL", 'a="x y"  b="${A}"'), ("FROM", "img@sha256:00 AS s")]
    assert labels(steps) == {"a": "x y", "b": "${A}"}
    assert global_args(steps) == {"A": "1"}


def test_every_stage_starts_from_the_base_pinned_by_version_and_digest() -> None:
    steps = instructions(DOCKERFILE.read_text())
    args = global_args(steps)
    bases = [substitute(rest.split()[0], args) for keyword, rest in steps if keyword == "FROM"]
    assert len(bases) == 2, bases  # build and runtime: the runtime's python symlinks need the build's Python
    for base in bases:
        name, _, digest = base.partition("@")
        assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest), f"{base}: not pinned by digest"
        assert re.fullmatch(r"docker\.io/library/python:\d+\.\d+\.\d+-slim-[a-z]+", name), f"{base}: not a full version"
    assert len(set(bases)) == 1, "both stages on the same base"
    # The Python of the image satisfies the workspace's.
    requires = tomllib.loads((ROOT / "libs" / "core" / "pyproject.toml").read_text())["project"]["requires-python"]
    minor = re.search(r"python:(\d+\.\d+)\.", bases[0]).group(1)  # type: ignore[union-attr]
    assert requires.startswith(">=")
    assert tuple(map(int, minor.split("."))) >= tuple(map(int, requires.removeprefix(">=").split(".")[:2]))


def test_the_image_carries_the_oci_labels() -> None:
    steps = instructions(DOCKERFILE.read_text())
    found = labels(steps)
    prefix = "org.opencontainers.image."
    assert {key.removeprefix(prefix) for key in found if key.startswith(prefix)} >= OCI_LABELS
    project = tomllib.loads((ROOT / "services" / "scheduler" / "pyproject.toml").read_text())["project"]
    assert found[prefix + "licenses"] == project["license"]
    # the base's labels are its pin, the same two arguments the FROM lines use
    assert found[prefix + "base.name"] == "${PYTHON_BASE}"
    assert found[prefix + "base.digest"] == "${PYTHON_DIGEST}"
    # each label's argument is declared in the runtime stage (a global ARG is not seen after FROM otherwise)
    runtime = steps[max(i for i, (keyword, _) in enumerate(steps) if keyword == "FROM") :]
    declared = {rest.partition("=")[0] for keyword, rest in runtime if keyword == "ARG"}
    used = {name for value in found.values() for name in re.findall(r"\$\{(\w+)\}", value)}
    assert used <= declared, used - declared
    # built by hand, the version is the workspace's
    defaults = {name: value for name, _, value in (rest.partition("=") for k, rest in runtime if k == "ARG")}
    assert defaults["VERSION"] == project["version"]


def test_ci_builds_it_with_the_labels_filled_in() -> None:
    script = CI_IMAGE.read_text()
    assert os.access(CI_IMAGE, os.X_OK)
    assert "deploy/docker/Dockerfile" in script
    passed = set(re.findall(r'--build-arg "(\w+)=', script))
    assert passed == BUILD_ARGS
    steps = instructions(DOCKERFILE.read_text())
    runtime_args = {rest.partition("=")[0] for keyword, rest in steps if keyword == "ARG"}
    assert passed <= runtime_args
    # .ci/run stays free of any container engine
    assert not re.search(r"\b(docker|podman|buildah)\b", (ROOT / ".ci" / "run").read_text())


@pytest.mark.parametrize(("required", "code"), [("", 0), ("1", 1)])
def test_without_an_engine_ci_skips_or_fails_as_asked(required: str, code: int) -> None:
    env = {**os.environ, "BUILDER": "no-such-engine", "IMAGE_REQUIRED": required}
    result = subprocess.run([str(CI_IMAGE)], capture_output=True, text=True, env=env, timeout=60, check=False)
    assert result.returncode == code, result.stderr
    assert "no usable docker" in result.stdout + result.stderr
