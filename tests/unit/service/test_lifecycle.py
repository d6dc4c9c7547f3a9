"""`run`: the services' event loop (uvloop unless told otherwise) and their signals on it."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading

import pytest
import uvloop

from devsched.service import EVENT_LOOP_ENV, EventLoopError, event_loop, run, run_loop

pytestmark = pytest.mark.unit

BOTH = pytest.mark.parametrize("choice", ["uvloop", "asyncio"])


def loop_type(choice: str) -> type[asyncio.AbstractEventLoop]:
    return uvloop.Loop if choice == "uvloop" else asyncio.SelectorEventLoop


@pytest.mark.parametrize(("environ", "name"), [({}, "asyncio"), ({EVENT_LOOP_ENV: ""}, "asyncio")])
def test_asyncio_is_the_default(environ: dict[str, str], name: str) -> None:
    assert event_loop(environ)[0] == name


@pytest.mark.parametrize("value", ["auto", "uvloop", " UVLoop "])
def test_the_setting_turns_uvloop_on_where_it_imports(value: str) -> None:
    assert event_loop({EVENT_LOOP_ENV: value})[0] == "uvloop"


@pytest.mark.parametrize("value", ["asyncio", " AsyncIO "])
def test_the_setting_turns_uvloop_off(value: str) -> None:
    assert event_loop({EVENT_LOOP_ENV: value}) == ("asyncio", None)


def test_without_uvloop_auto_falls_back_to_asyncio_and_uvloop_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # `import uvloop` raises ImportError
    assert event_loop({}) == ("asyncio", None)
    assert event_loop({EVENT_LOOP_ENV: "auto"}) == ("asyncio", None)
    with pytest.raises(EventLoopError, match="uvloop does not import"):
        event_loop({EVENT_LOOP_ENV: "uvloop"})


def test_an_unknown_loop_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(EventLoopError, match="expected one of auto, uvloop, asyncio"):
        event_loop({EVENT_LOOP_ENV: "trio"})
    monkeypatch.setenv(EVENT_LOOP_ENV, "trio")
    assert run(lambda stop: asyncio.sleep(0, 0)) == 2


@BOTH
def test_run_runs_main_on_the_chosen_loop_and_sigterm_sets_stop(choice: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(EVENT_LOOP_ENV, choice)
    seen: list[object] = []

    async def main(stop: asyncio.Event) -> int:
        seen.append(type(asyncio.get_running_loop()))
        # What the services do besides: threads (spool writes, migrations) and signals to themselves.
        seen.append(await asyncio.to_thread(threading.current_thread) is not threading.current_thread())
        seen.append(await asyncio.get_running_loop().run_in_executor(None, sum, [1, 2]))
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(stop.wait(), 10)
        return 7

    assert run(main) == 7
    assert seen == [loop_type(choice), True, 3]
    # The handlers are gone with the loop: the default disposition is back.
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


@BOTH
def test_a_second_signal_cancels_main(choice: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(EVENT_LOOP_ENV, choice)

    async def main(stop: asyncio.Event) -> int:
        os.kill(os.getpid(), signal.SIGINT)
        await asyncio.wait_for(stop.wait(), 10)
        os.kill(os.getpid(), signal.SIGINT)
        await asyncio.sleep(10)
        return 0

    assert run(main) == 130


@BOTH
def test_run_loop_runs_a_coroutine_on_the_chosen_loop(choice: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(EVENT_LOOP_ENV, choice)

    async def which() -> type[asyncio.AbstractEventLoop]:
        return type(asyncio.get_running_loop())

    assert run_loop(which()) is loop_type(choice)
