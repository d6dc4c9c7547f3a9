"""Which schema a release may serve on (`schema_problem`): behind is not ready, at or ahead of it is."""

from __future__ import annotations

from devsched.store.health import expected_revision, known_revisions, schema_problem

KNOWN = frozenset({"0001", "0002", "0003"})


def test_the_releases_own_head_is_ready() -> None:
    assert schema_problem("0003", "0003", KNOWN) is None


def test_a_database_never_migrated_is_not_ready() -> None:
    assert schema_problem(None, "0003", KNOWN) == (
        "the database is not migrated (this release expects 0003): run the migrations"
    )


def test_a_database_behind_the_release_is_not_ready() -> None:
    assert schema_problem("0002", "0003", KNOWN) == (
        "the database is at migration 0002, this release expects 0003: run the migrations"
    )


def test_a_database_ahead_of_the_release_is_ready_during_a_rollout() -> None:
    """The next release migrated first: the old replicas keep serving until they are replaced."""
    assert schema_problem("0004", "0003", KNOWN) is None


def test_the_shipped_migrations_include_their_head() -> None:
    known = known_revisions()
    assert expected_revision() in known
    assert "0001" in known
    assert len(known) >= 6
