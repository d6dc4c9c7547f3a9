"""Artifact names and chunking (issue 12): pure rules shared by the agent and the scheduler."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from devsched.protocol.artifacts import CHUNK_BYTES, ArtifactCommit, chunk_count, normalise_name

pytestmark = pytest.mark.unit

LEASE = {
    "task_id": "00000000-0000-4000-8000-000000000001",
    "attempt": 1,
    "lease_id": "00000000-0000-4000-8000-000000000002",
}


@pytest.mark.parametrize(
    ("raw", "normal"),
    [("a.bin", "a.bin"), ("./a//b/./c.txt", "a/b/c.txt"), ("dir/", "dir"), ("é/ü.log", "é/ü.log"), ("..a", "..a")],
)
def test_names_are_normalised(raw: str, normal: str) -> None:
    assert normalise_name(raw) == normal


@pytest.mark.parametrize(
    "raw", ["", "/etc/passwd", "a/../../b", "..", ".", "./", "a\nb", "a\x00b", "x" * 256, "/".join(["abc"] * 300)]
)
def test_names_that_are_not_relative_paths_inside_are_refused(raw: str) -> None:
    with pytest.raises(ValueError, match="artifact name"):
        normalise_name(raw)


def test_chunks_cover_the_size_exactly() -> None:
    assert [chunk_count(n) for n in (0, 1, CHUNK_BYTES, CHUNK_BYTES + 1, 3 * CHUNK_BYTES)] == [0, 1, 1, 2, 3]


def commit(**changes: object) -> ArtifactCommit:
    body = {**LEASE, "name": "a.bin", "step": "s", "size": 1, "sha256": "0" * 64, "chunks": 1, "upload_id": "u1"}
    return ArtifactCommit.model_validate_json(json.dumps({**body, **changes}))


@pytest.mark.parametrize(
    "changes",
    [
        {"name": "./a.bin"},
        {"name": "../a.bin"},
        {"sha256": "A" * 64},
        {"sha256": "0" * 63},
        {"upload_id": "a.b"},
        {"size": -1},
    ],
)
def test_a_commit_takes_only_normal_names_hex_digests_and_token_ids(changes: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        commit(**changes)
    assert commit().name == "a.bin"
