"""The child-process supervisor (devsched.embedded.supervisor) with real processes: stop, kill, pause, and
above all that no child outlives its parent, however the parent ends.

The parent-death tests start a real parent (a small Python script that starts a child with the supervisor),
end it, and poll until the child is gone.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from devsched.embedded import ChildProcess, EmbeddedServerError, stop_all, wait_until
from support.polling import eventually

pytestmark = pytest.mark.integration

TESTS_DIR = Path(__file__).resolve().parents[1]

#: A child that logs JSON lines, says how it was stopped, and otherwise sleeps (or ignores SIGTERM).
CHILD = textwrap.dedent(
    """
    import json, signal, sys, time
    def bye(signum, frame):
        print(json.dumps({"msg": "stopped", "signal": signum}), flush=True)
        sys.exit(0)
    signal.signal(signal.SIGTERM, signal.SIG_IGN if "--stubborn" in sys.argv else bye)
    print(json.dumps({"msg": "up"}), flush=True)
    time.sleep(600)
    """
)

#: A parent: starts CHILD with the supervisor (from a thread that then ends, with `thread`), writes its pid.
PARENT = textwrap.dedent(
    """
    import signal, sys, threading, time
    from pathlib import Path
    from devsched.embedded import ChildProcess, exit_on_sigterm

    child_script, out, *flags = sys.argv[1:]
    out = Path(out)
    death = None if "no-death-signal" in flags else signal.SIGKILL
    def start():
        argv = [sys.executable, child_script, out.name]
        return ChildProcess("child", argv, None, out / "child.log", death_signal=death).start()
    if "thread" in flags:
        started = []
        worker = threading.Thread(target=lambda: started.append(start()))
        worker.start()
        worker.join()  # the thread that asked for the child has ended
        child = started[0]
    else:
        child = start()
    if "exit-on-sigterm" in flags:
        exit_on_sigterm()
    child.wait_ready(lambda: child.logged("up"), timeout=30)
    if "pause" in flags:
        child.pause()
    (out / "child.pid").write_text(str(child.pid))
    if "exit" in flags:
        sys.exit(0)  # without stopping the child
    time.sleep(600)
    """
)


def alive(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie is dead: it holds nothing)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]


@pytest.fixture
def scripts(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """The child and parent scripts, and a directory of their own; a child left alive is SIGKILLed after the test."""
    out = tmp_path / f"family-{uuid.uuid4().hex[:8]}"
    out.mkdir()
    child = tmp_path / "child.py"
    child.write_text(CHILD)
    parent = tmp_path / "parent.py"
    parent.write_text(PARENT)
    yield child, parent
    for pid_file in out.parent.glob("*/child.pid"):
        pid = int(pid_file.read_text())
        cmdline = Path(f"/proc/{pid}/cmdline")
        if alive(pid) and cmdline.exists() and str(child).encode() in cmdline.read_bytes():
            os.kill(pid, signal.SIGKILL)


def start_parent(tmp_path: Path, child: Path, parent: Path, *flags: str) -> tuple[ChildProcess, int, Path]:
    """Start the parent script; return it, its child's pid once the child is up, and the family's directory."""
    (out,) = tmp_path.glob("family-*")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, str(parent), str(child), str(out), *flags]
    process = ChildProcess("parent", argv, env, out / "parent.log")
    process.start().wait_ready(lambda: (out / "child.pid").exists(), timeout=30)
    return process, int((out / "child.pid").read_text()), out


@pytest.mark.parametrize("parent_signal", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
@pytest.mark.parametrize("from_thread", [False, True], ids=["main-thread", "worker-thread"])
async def test_a_child_dies_with_its_parent(
    tmp_path: Path, scripts: tuple[Path, Path], parent_signal: signal.Signals, from_thread: bool
) -> None:
    flags = ["thread"] if from_thread else []
    parent, child_pid, _ = start_parent(tmp_path, *scripts, *flags)
    try:
        # With `thread`, the thread that asked for the child has ended: the kernel's signal is not tied to it.
        await asyncio.sleep(0.2)
        assert alive(child_pid), "the child died with the thread that started it"

        parent.signal(parent_signal)  # no handler: Python dies on the spot, atexit hooks do not run

        assert parent.wait(10)
        await eventually(lambda: not alive(child_pid), timeout=10, message=f"child {child_pid} gone")
    finally:
        parent.kill()


async def test_a_paused_child_dies_with_its_parent(tmp_path: Path, scripts: tuple[Path, Path]) -> None:
    parent, child_pid, _ = start_parent(tmp_path, *scripts, "pause")
    try:
        await eventually(lambda: state(child_pid) == "T", timeout=5, message="child stopped")

        parent.kill()

        await eventually(lambda: not alive(child_pid), timeout=10, message=f"paused child {child_pid} gone")
    finally:
        parent.kill()


async def test_a_sigterm_turned_into_an_exit_stops_the_children_cleanly(
    tmp_path: Path, scripts: tuple[Path, Path]
) -> None:
    # Without the kernel's signal, only the atexit hook can stop the child: SIGTERM must let it run.
    parent, child_pid, out = start_parent(tmp_path, *scripts, "no-death-signal", "exit-on-sigterm")
    try:
        parent.signal(signal.SIGTERM)

        assert parent.wait(15)
        await eventually(lambda: not alive(child_pid), timeout=10, message=f"child {child_pid} gone")
        assert '"msg": "stopped", "signal": 15' in (out / "child.log").read_text()
    finally:
        parent.kill()


async def test_a_parent_that_exits_stops_its_children_first(tmp_path: Path, scripts: tuple[Path, Path]) -> None:
    parent, child_pid, out = start_parent(tmp_path, *scripts, "no-death-signal", "exit")

    assert parent.wait(15)
    assert parent.exit_code == 0, parent.tail()
    assert not alive(child_pid)
    assert '"msg": "stopped", "signal": 15' in (out / "child.log").read_text()


INNER_TEST = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import pytest
    from devsched.embedded import ChildProcess

    OUT = Path(__file__).parent

    @pytest.fixture(scope="session")
    def child():
        argv = [sys.executable, str(OUT / "child.py")]
        # no kernel signal: only the fixture's teardown (or the atexit hook) can stop it
        process = ChildProcess("child", argv, None, OUT / "child.log", death_signal=None).start()
        yield process
        process.stop()
        (OUT / "torn-down").write_text("yes")

    def test_runs_long(child):
        child.wait_ready(lambda: child.logged("up"), timeout=30)
        (OUT / "child.pid").write_text(str(child.pid))
        time.sleep(600)
    """
)


async def test_a_test_run_stopped_by_sigterm_tears_its_fixtures_down(tmp_path: Path) -> None:
    """`./dev test` killed with SIGTERM: uv passes it on to pytest, whose fixtures must stop what they started."""
    (tmp_path / "child.py").write_text(CHILD)
    inner = tmp_path / "inner_run.py"
    inner.write_text(INNER_TEST)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS_DIR), os.environ.get("PYTHONPATH", "")])}
    argv = [sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "-q", str(inner)]
    run = ChildProcess("pytest", argv, env, tmp_path / "pytest.log", cwd=tmp_path)
    run.start()
    child_pid = None
    try:
        run.wait_ready(lambda: (tmp_path / "child.pid").exists(), timeout=60)
        child_pid = int((tmp_path / "child.pid").read_text())

        run.signal(signal.SIGTERM)

        assert run.wait(30), run.tail()
        await eventually(lambda: not alive(child_pid), timeout=10, message=f"child {child_pid} gone")
        assert (tmp_path / "torn-down").exists(), run.tail()
        assert '"msg": "stopped", "signal": 15' in (tmp_path / "child.log").read_text()
    finally:
        run.kill()
        if child_pid is not None and alive(child_pid):  # the test failed: leave nothing behind
            os.kill(child_pid, signal.SIGKILL)


# -- one child's life ---------------------------------------------------------------------------------------


@pytest.fixture
def child_script(tmp_path: Path) -> Path:
    path = tmp_path / "child.py"
    path.write_text(CHILD)
    return path


def sleeper(tmp_path: Path, child_script: Path, *args: str, **options: object) -> ChildProcess:
    return ChildProcess("sleeper", [sys.executable, str(child_script), *args], None, tmp_path / "child.log", **options)


def test_stop_asks_first_and_reports_the_exit_code(tmp_path: Path, child_script: Path) -> None:
    child = sleeper(tmp_path, child_script).start()
    child.wait_ready(lambda: child.logged("up"), timeout=30)
    pid = child.pid
    assert pid is not None

    assert child.stop() == 0
    assert child.stop() == 0  # idempotent
    assert child.pid is None
    assert not alive(pid)
    assert [line["msg"] for line in child.log_lines()] == ["up", "stopped"]


def test_stop_kills_what_does_not_stop_in_time(tmp_path: Path, child_script: Path) -> None:
    child = sleeper(tmp_path, child_script, "--stubborn").start()
    child.wait_ready(lambda: child.logged("up"), timeout=30)

    started = time.monotonic()
    assert child.stop(timeout=0.5) == -signal.SIGKILL
    assert time.monotonic() - started < 10


def test_a_paused_child_can_still_be_stopped_cleanly(tmp_path: Path, child_script: Path) -> None:
    child = sleeper(tmp_path, child_script).start()
    child.wait_ready(lambda: child.logged("up"), timeout=30)
    assert child.pid is not None
    pid = child.pid

    child.pause()
    child.wait_ready(lambda: state(pid) == "T", timeout=5)
    assert child.stop(timeout=10) == 0  # SIGTERM waits in the frozen process; SIGCONT lets it act


def test_paused_resumes_even_when_the_block_fails(tmp_path: Path, child_script: Path) -> None:
    child = sleeper(tmp_path, child_script).start()
    try:
        child.wait_ready(lambda: child.logged("up"), timeout=30)
        assert child.pid is not None
        pid = child.pid
        seen = []

        def fail_while_paused() -> None:
            with child.paused():
                # SIGSTOP takes effect asynchronously: the state turns T shortly after the signal
                wait_until(lambda: state(pid) == "T", timeout=5, what="the child stops")
                seen.append(state(pid))
                raise RuntimeError

        with pytest.raises(RuntimeError):
            fail_while_paused()
        assert seen == ["T"]
        child.wait_ready(lambda: state(pid) != "T", timeout=5)
    finally:
        child.kill()


#: A child whose own child lives in a session of its own, as Postgres backends do.
TREE = textwrap.dedent(
    """
    import os, subprocess, sys
    grandchild = subprocess.Popen(["sleep", "600"], start_new_session=True)
    with open(sys.argv[1] + ".tmp", "w") as f:
        f.write(str(grandchild.pid))
    os.rename(sys.argv[1] + ".tmp", sys.argv[1])
    os.execvp("sleep", ["sleep", "600"])
    """
)


def test_kill_of_a_whole_tree_takes_the_grandchildren(tmp_path: Path) -> None:
    marker = tmp_path / "grandchild"
    child = ChildProcess(
        "tree", [sys.executable, "-c", TREE, str(marker)], None, tmp_path / "tree.log", whole_tree=True
    ).start()
    try:
        child.wait_ready(marker.exists, timeout=30)
        grandchild = int(marker.read_text())
        assert alive(grandchild)

        assert child.kill() == -signal.SIGKILL

        assert not alive(grandchild)
    finally:
        child.kill()


def test_restart_is_a_new_run_with_its_own_log_part(tmp_path: Path, child_script: Path) -> None:
    child = sleeper(tmp_path, child_script).start()
    try:
        child.wait_ready(lambda: child.logged("up"), timeout=30)
        first = child.pid

        child.restart()

        assert child.pid not in (None, first)
        assert child.starts == 2
        child.wait_ready(lambda: child.logged("up"), timeout=30)
        assert not child.logged("stopped")  # the first run's last line is not this run's
        assert "stopped" in child.tail()
    finally:
        child.kill()


def test_wait_ready_gives_up_when_the_child_exits(tmp_path: Path) -> None:
    child = ChildProcess("quitter", [sys.executable, "-c", "print('bad config'); raise SystemExit(3)"], None,
                         tmp_path / "quitter.log").start()  # fmt: skip

    with pytest.raises(EmbeddedServerError, match=r"(?s)quitter ready: exited with code 3.*bad config"):
        child.wait_ready(lambda: False, timeout=30)


def test_stop_all_asks_everyone_at_once_and_kills_the_stubborn(tmp_path: Path, child_script: Path) -> None:
    polite = sleeper(tmp_path, child_script).start()
    stubborn = ChildProcess(
        "stubborn", [sys.executable, str(child_script), "--stubborn"], None, tmp_path / "stubborn.log"
    ).start()
    for child in (polite, stubborn):
        child.wait_ready(lambda c=child: c.logged("up"), timeout=30)

    assert stop_all([polite, stubborn], timeout=1.0) == ["stubborn"]
    assert (polite.exit_code, stubborn.exit_code) == (0, -signal.SIGKILL)
