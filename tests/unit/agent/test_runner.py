from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC
from pathlib import Path

import pytest

from devsched.agent import runner as runner_module
from devsched.agent.actions import default_registry
from devsched.agent.runner import PlanRunner, PlanStep, RunResult, first_progress
from devsched.agent.steps import ActionResult, StepContext
from devsched.agent.stop import StopReason, StopSignal
from devsched.core.status import Outcome
from devsched.protocol.plans import Progress, StepStatus
from support.polling import eventually

pytestmark = pytest.mark.unit

MakeRunner = Callable[..., PlanRunner]
DONE, FAILED, TIMED_OUT = StepStatus.DONE, StepStatus.FAILED, StepStatus.TIMED_OUT
INTERRUPTED, SKIPPED = StepStatus.INTERRUPTED, StepStatus.SKIPPED


def touch(path: Path, name: str, **options: object) -> PlanStep:
    """A step that proves it ran by creating `path`."""
    return PlanStep(name, "shell", {"command": f"touch {path}"}, **options)  # type: ignore[arg-type]


def gated(started: Path, gate: Path, name: str = "gated", **options: object) -> PlanStep:
    """A step that announces itself, then waits until the test opens the gate (no guessed sleeps)."""
    command = f"touch {started}; while [ ! -e {gate} ]; do sleep 0.02; done"
    return PlanStep(name, "shell", {"command": command}, **options)  # type: ignore[arg-type]


def long_sleep(name: str = "wait", **options: object) -> PlanStep:
    return PlanStep(name, "sleep", {"seconds": 60}, **options)  # type: ignore[arg-type]


def statuses(result: RunResult) -> list[StepStatus]:
    return [step.status for step in result.steps]


async def start(runner: PlanRunner) -> asyncio.Task[RunResult]:
    task = asyncio.create_task(runner.run())
    await asyncio.sleep(0)
    return task


async def until_exists(path: Path) -> None:
    await eventually(path.exists, message=f"{path.name} exists")


async def test_a_plan_that_succeeds_is_done(make_runner: MakeRunner) -> None:
    seen: list[Progress] = []

    async def renew(progress: Progress) -> None:
        seen.append(progress)

    steps = [
        PlanStep("flash", "shell", {"command": "echo flashing"}),
        PlanStep("wait", "sleep", {"seconds": 0.01}),
        PlanStep("nothing", "noop"),
    ]
    result = await make_runner(steps, renew=renew).run()
    assert result.outcome is Outcome.DONE
    assert result.reason is None
    assert [s.name for s in result.steps] == ["flash", "wait", "nothing"]
    assert statuses(result) == [DONE, DONE, DONE]
    assert result.steps[0].output_tail == "flashing\n"
    assert result.steps[0].exit_code == 0
    for step in result.steps:
        assert step.started_at is not None
        assert step.finished_at is not None
        assert step.started_at.tzinfo is UTC
        assert step.started_at <= step.finished_at
    assert seen == [
        Progress(step="flash", index=0, of=3),
        Progress(step="wait", index=1, of=3),
        Progress(step="nothing", index=2, of=3),
    ]


async def test_a_failed_step_fails_the_run_and_skips_the_rest(make_runner: MakeRunner, tmp_path: Path) -> None:
    seen: list[Progress] = []

    async def renew(progress: Progress) -> None:
        seen.append(progress)

    steps = [PlanStep("flash", "shell", {"command": "exit 3"}), touch(tmp_path / "next", "next")]
    result = await make_runner(steps, renew=renew).run()
    assert result.outcome is Outcome.FAILED
    assert result.reason == "step 'flash' failed with exit code 3"
    assert statuses(result) == [FAILED, SKIPPED]
    assert result.steps[1].output_tail == "skipped: an earlier step failed"
    assert result.steps[1].started_at is None
    assert result.steps[1].exit_code is None
    assert not (tmp_path / "next").exists()
    assert [p.index for p in seen] == [0]


async def test_a_timed_out_step_fails_the_run(make_runner: MakeRunner) -> None:
    steps = [PlanStep("hang", "shell", {"command": "exec sleep 60"}, timeout_s=0.2), PlanStep("n", "noop")]
    result = await make_runner(steps).run()
    assert result.outcome is Outcome.FAILED
    assert result.reason == "step 'hang' timed out after 0.2 s"
    assert statuses(result) == [TIMED_OUT, SKIPPED]


async def test_always_steps_run_after_a_failure(make_runner: MakeRunner, tmp_path: Path) -> None:
    steps = [
        PlanStep("flash", "shell", {"command": "exit 1"}),
        touch(tmp_path / "planned", "test"),
        touch(tmp_path / "teardown", "collect-logs", always=True),
    ]
    result = await make_runner(steps).run()
    assert result.outcome is Outcome.FAILED
    assert statuses(result) == [FAILED, SKIPPED, DONE]
    assert not (tmp_path / "planned").exists()
    assert (tmp_path / "teardown").exists()


async def test_cancellation_interrupts_skips_and_still_runs_teardown(make_runner: MakeRunner, tmp_path: Path) -> None:
    stop = StopSignal()
    steps = [
        long_sleep(interruptible=True),
        touch(tmp_path / "planned", "test"),
        touch(tmp_path / "teardown", "collect-logs", always=True),
    ]
    task = await start(make_runner(steps, stop=stop))
    started = time.monotonic()
    stop.request(StopReason.CANCELLED, "cancellation requested")
    result = await asyncio.wait_for(task, 30)
    assert time.monotonic() - started < 20  # far below the 60 s sleep
    assert result.outcome is Outcome.CANCELLED
    assert result.reason == "cancelled: cancellation requested"
    assert statuses(result) == [INTERRUPTED, SKIPPED, DONE]
    assert result.steps[1].output_tail == "skipped: cancelled"
    assert not (tmp_path / "planned").exists()
    assert (tmp_path / "teardown").exists()


@pytest.mark.parametrize("reason", [StopReason.LEASE_LOST])
async def test_lease_loss_runs_no_teardown_and_fails(
    make_runner: MakeRunner, tmp_path: Path, reason: StopReason
) -> None:
    stop = StopSignal()
    steps = [
        long_sleep(interruptible=True),
        touch(tmp_path / "planned", "test"),
        touch(tmp_path / "teardown", "collect-logs", always=True),
    ]
    task = await start(make_runner(steps, stop=stop))
    stop.request(reason, "renewal rejected: lease_expired")
    result = await asyncio.wait_for(task, 30)
    assert result.outcome is Outcome.FAILED
    assert result.reason == f"{reason.value}: renewal rejected: lease_expired"
    assert statuses(result) == [INTERRUPTED, SKIPPED, SKIPPED]
    assert not (tmp_path / "planned").exists()
    assert not (tmp_path / "teardown").exists()
    assert result.released is False


async def test_shutdown_stops_at_a_boundary_runs_teardown_and_releases(make_runner: MakeRunner, tmp_path: Path) -> None:
    # The lease is still held: teardown runs, and the attempt is given back rather than failed.
    stop = StopSignal()
    steps = [
        long_sleep(interruptible=True),
        touch(tmp_path / "planned", "test"),
        touch(tmp_path / "teardown", "collect-logs", always=True),
    ]
    task = await start(make_runner(steps, stop=stop))
    stop.request(StopReason.SHUTDOWN, "agent shutting down")
    result = await asyncio.wait_for(task, 30)
    assert result.released is True
    assert statuses(result) == [INTERRUPTED, SKIPPED, DONE]
    assert result.reason == "shutdown: agent shutting down"
    assert result.steps[1].output_tail == "skipped: shutdown"
    assert not (tmp_path / "planned").exists()
    assert (tmp_path / "teardown").exists()


async def test_shutdown_lets_a_non_interruptible_step_finish_then_releases(
    make_runner: MakeRunner, tmp_path: Path
) -> None:
    stop = StopSignal()
    command = f"touch {tmp_path / 'started'}; sleep 0.5; touch {tmp_path / 'finished'}"
    steps = [PlanStep("flash", "shell", {"command": command}), touch(tmp_path / "planned", "test")]
    task = await start(make_runner(steps, stop=stop))
    await until_exists(tmp_path / "started")
    stop.request(StopReason.SHUTDOWN, "agent shutting down")
    result = await asyncio.wait_for(task, 30)
    assert statuses(result) == [DONE, SKIPPED]
    assert (tmp_path / "finished").exists()
    assert result.released is True


async def test_a_shutdown_that_changed_nothing_or_came_after_a_failure_is_no_release(make_runner: MakeRunner) -> None:
    stop = StopSignal()

    async def renew(progress: Progress) -> None:
        return None

    finished = await make_runner([PlanStep("only", "noop")], stop=stop, renew=renew).run()
    stop.request(StopReason.SHUTDOWN, "too late to matter")
    assert (finished.outcome, finished.released) == (Outcome.DONE, False)

    late = StopSignal()

    async def stop_after_first(progress: Progress) -> None:
        if progress.index == 1:
            late.request(StopReason.SHUTDOWN, "agent shutting down")

    steps = [PlanStep("bad", "shell", {"command": "exit 3"}), PlanStep("teardown", "noop", always=True)]
    failed = await make_runner(steps, stop=late, renew=stop_after_first).run()
    assert late.reason is StopReason.SHUTDOWN
    assert (failed.outcome, failed.released) == (Outcome.FAILED, False)  # the run had failed on its own


async def test_a_stop_seen_at_the_boundary_prevents_the_next_step(make_runner: MakeRunner, tmp_path: Path) -> None:
    stop = StopSignal()

    async def renew(progress: Progress) -> None:
        if progress.index == 1:  # the renewal before the second step says: cancellation pending
            stop.request(StopReason.CANCELLED, "cancellation requested")

    steps = [PlanStep("first", "noop"), touch(tmp_path / "marker", "second"), PlanStep("third", "noop")]
    result = await make_runner(steps, stop=stop, renew=renew).run()
    assert result.outcome is Outcome.CANCELLED
    assert statuses(result) == [DONE, SKIPPED, SKIPPED]
    assert not (tmp_path / "marker").exists()


async def test_a_non_interruptible_step_finishes_before_the_stop_takes_effect(
    make_runner: MakeRunner, tmp_path: Path
) -> None:
    stop = StopSignal()
    started, gate = tmp_path / "started", tmp_path / "gate"
    steps = [gated(started, gate, "flash"), touch(tmp_path / "marker", "next")]
    task = await start(make_runner(steps, stop=stop))
    await until_exists(started)
    stop.request(StopReason.CANCELLED, "cancellation requested")
    await asyncio.sleep(0.1)  # give a wrong implementation the chance to interrupt the step
    assert not task.done()
    gate.touch()
    result = await asyncio.wait_for(task, 30)
    assert statuses(result) == [DONE, SKIPPED]
    assert result.outcome is Outcome.CANCELLED
    assert not (tmp_path / "marker").exists()


async def test_a_cancellation_that_changed_nothing_leaves_the_run_done(make_runner: MakeRunner, tmp_path: Path) -> None:
    stop = StopSignal()
    started, gate = tmp_path / "started", tmp_path / "gate"
    task = await start(make_runner([gated(started, gate, "last")], stop=stop))
    await until_exists(started)
    stop.request(StopReason.CANCELLED)
    gate.touch()
    result = await asyncio.wait_for(task, 30)
    assert result.outcome is Outcome.DONE
    assert statuses(result) == [DONE]


async def test_a_failing_teardown_keeps_a_cancelled_run_cancelled(make_runner: MakeRunner) -> None:
    stop = StopSignal()
    steps = [long_sleep(interruptible=True), PlanStep("teardown", "shell", {"command": "exit 4"}, always=True)]
    task = await start(make_runner(steps, stop=stop))
    stop.request(StopReason.CANCELLED, "cancellation requested")
    result = await asyncio.wait_for(task, 30)
    assert result.outcome is Outcome.CANCELLED
    assert result.reason == "cancelled: cancellation requested; step 'teardown' failed with exit code 4"
    assert statuses(result) == [INTERRUPTED, FAILED]


async def test_a_failing_teardown_fails_an_otherwise_done_run(make_runner: MakeRunner) -> None:
    steps = [PlanStep("work", "noop"), PlanStep("teardown", "shell", {"command": "exit 5"}, always=True)]
    result = await make_runner(steps).run()
    assert result.outcome is Outcome.FAILED
    assert result.reason == "step 'teardown' failed with exit code 5"


async def test_a_cancellation_before_the_first_step_still_runs_teardown(
    make_runner: MakeRunner, tmp_path: Path
) -> None:
    stop = StopSignal()
    stop.request(StopReason.CANCELLED, "cancellation requested")  # e.g. seen in the claim reply
    steps = [touch(tmp_path / "planned", "work"), touch(tmp_path / "teardown", "teardown", always=True)]
    result = await make_runner(steps, stop=stop).run()
    assert result.outcome is Outcome.CANCELLED
    assert statuses(result) == [SKIPPED, DONE]
    assert not (tmp_path / "planned").exists()
    assert (tmp_path / "teardown").exists()


async def test_no_step_starts_after_the_lease_deadline(make_runner: MakeRunner, tmp_path: Path) -> None:
    seen: list[Progress] = []

    async def renew(progress: Progress) -> None:
        seen.append(progress)

    steps = [PlanStep("first", "noop"), touch(tmp_path / "marker", "second"), touch(tmp_path / "td", "td", always=True)]
    runner = make_runner(steps, renew=renew, lease_live=lambda: len(seen) < 2)
    result = await runner.run()
    assert result.outcome is Outcome.FAILED
    assert result.reason == "lease_lost: no successful renewal within the lease ttl"
    assert statuses(result) == [DONE, SKIPPED, SKIPPED]
    assert not (tmp_path / "marker").exists()
    assert not (tmp_path / "td").exists()


async def test_a_teardown_that_allows_it_is_interrupted_by_lease_loss_not_by_cancellation(
    make_runner: MakeRunner, tmp_path: Path
) -> None:
    stop = StopSignal()
    started, gate = tmp_path / "started", tmp_path / "gate"
    steps = [
        long_sleep(interruptible=True),
        gated(started, gate, "teardown", always=True, interruptible=True),
        touch(tmp_path / "td2", "teardown-2", always=True),
    ]
    task = await start(make_runner(steps, stop=stop))
    stop.request(StopReason.CANCELLED, "cancellation requested")
    await until_exists(started)
    await asyncio.sleep(0.1)  # the cancellation must not interrupt the teardown
    assert not task.done()
    stop.request(StopReason.LEASE_LOST, "renewal rejected: lease_expired")
    result = await asyncio.wait_for(task, 30)
    assert statuses(result) == [INTERRUPTED, INTERRUPTED, SKIPPED]
    assert result.outcome is Outcome.CANCELLED
    assert result.reason == "cancelled: cancellation requested; then lease_lost: renewal rejected: lease_expired"
    assert not (tmp_path / "td2").exists()


async def test_kill_interrupts_even_a_non_interruptible_step(make_runner: MakeRunner, tmp_path: Path) -> None:
    stop = StopSignal()
    command = f"touch {tmp_path / 'started'}; exec sleep 60"
    task = await start(make_runner([PlanStep("flash", "shell", {"command": command})], stop=stop))
    await until_exists(tmp_path / "started")
    stop.request(StopReason.SHUTDOWN, "agent shutting down")
    stop.kill()
    result = await asyncio.wait_for(task, 30)
    assert statuses(result) == [INTERRUPTED]
    assert result.outcome is Outcome.FAILED
    assert result.reason == "shutdown: agent shutting down"
    assert result.released is True  # killed at the end of the grace: nothing runs on the device any more


async def test_unknown_actions_and_bad_arguments_fail_their_step(make_runner: MakeRunner) -> None:
    result = await make_runner([PlanStep("flash", "flash-firmware", {"image": "x"})]).run()
    assert statuses(result) == [FAILED]
    assert result.steps[0].output_tail.startswith("unknown action 'flash-firmware'")
    assert result.reason is not None
    assert result.reason.startswith("step 'flash' failed: unknown action")
    result = await make_runner([PlanStep("nap", "sleep", {"secs": 1})]).run()
    assert "invalid args for action 'sleep'" in result.steps[0].output_tail
    assert result.outcome is Outcome.FAILED


async def test_an_action_that_raises_fails_its_step(make_runner: MakeRunner) -> None:
    async def broken(ctx: StepContext) -> ActionResult:
        raise RuntimeError("device went away")

    registry = default_registry()
    registry.register("broken", broken)
    result = await make_runner([PlanStep("b", "broken")], registry=registry).run()
    assert statuses(result) == [FAILED]
    assert "device went away" in result.steps[0].output_tail


async def test_an_action_that_ignores_its_timeout_is_cut_off(
    make_runner: MakeRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def stubborn(ctx: StepContext) -> ActionResult:
        await asyncio.sleep(60)
        return ActionResult(StepStatus.DONE)

    monkeypatch.setattr(runner_module, "BACKSTOP_S", 0.05)
    registry = default_registry()
    registry.register("stubborn", stubborn)
    runner = make_runner([PlanStep("s", "stubborn", timeout_s=0.05)], registry=registry, stop_grace_s=0.01)
    result = await asyncio.wait_for(runner.run(), 30)
    assert statuses(result) == [TIMED_OUT]
    assert "ignored its timeout" in result.steps[0].output_tail


async def test_a_broken_renew_hook_does_not_end_the_run(make_runner: MakeRunner) -> None:
    async def renew(progress: Progress) -> None:
        raise RuntimeError("boom")

    result = await make_runner([PlanStep("a", "noop"), PlanStep("b", "noop")], renew=renew).run()
    assert result.outcome is Outcome.DONE


# -- the claim carries the first step's progress ---------------------------------------------------------


async def test_a_claim_that_carried_the_first_step_replaces_only_that_boundary(make_runner: MakeRunner) -> None:
    seen: list[Progress] = []

    async def renew(progress: Progress) -> None:
        seen.append(progress)

    steps = [PlanStep("flash", "noop"), PlanStep("wait", "noop"), PlanStep("nothing", "noop")]
    claimed = first_progress(steps, StopSignal())
    assert claimed == Progress(step="flash", index=0, of=3)
    result = await make_runner(steps, renew=renew, claimed=claimed).run()
    assert result.outcome is Outcome.DONE
    assert seen == [Progress(step="wait", index=1, of=3), Progress(step="nothing", index=2, of=3)]


async def test_a_claim_without_progress_leaves_every_boundary_renewing(make_runner: MakeRunner) -> None:
    seen: list[Progress] = []

    async def renew(progress: Progress) -> None:
        seen.append(progress)

    steps = [PlanStep("flash", "noop")]
    await make_runner(steps, renew=renew, claimed=None).run()
    assert seen == [Progress(step="flash", index=0, of=1)]


async def test_the_lease_is_still_checked_at_a_boundary_the_claim_replaced(
    make_runner: MakeRunner, tmp_path: Path
) -> None:
    steps = [touch(tmp_path / "ran", "flash")]
    result = await make_runner(steps, claimed=first_progress(steps, StopSignal()), lease_live=lambda: False).run()
    assert result.outcome is Outcome.FAILED
    assert result.reason == "lease_lost: no successful renewal within the lease ttl"
    assert not (tmp_path / "ran").exists()


async def test_a_cancellation_in_the_claim_reply_stops_before_the_first_step(
    make_runner: MakeRunner, tmp_path: Path
) -> None:
    seen: list[Progress] = []

    async def renew(progress: Progress) -> None:
        seen.append(progress)

    steps = [touch(tmp_path / "planned", "work"), touch(tmp_path / "teardown", "teardown", always=True)]
    stop = StopSignal()
    claimed = first_progress(steps, stop)  # sent with the claim
    stop.request(StopReason.CANCELLED, "cancellation requested")  # what its reply said
    result = await make_runner(steps, stop=stop, renew=renew, claimed=claimed).run()
    assert result.outcome is Outcome.CANCELLED
    assert statuses(result) == [SKIPPED, DONE]
    assert not (tmp_path / "planned").exists()
    assert seen == [Progress(step="teardown", index=1, of=2)]


def test_the_first_step_is_claimed_with_only_when_it_may_start() -> None:
    steps = [PlanStep("work", "noop"), PlanStep("teardown", "noop", always=True)]
    assert first_progress([], StopSignal()) is None
    stopped = StopSignal()
    stopped.request(StopReason.SHUTDOWN, "agent shutting down")
    assert first_progress(steps, stopped) is None
    assert first_progress(steps[1:], stopped) == Progress(step="teardown", index=0, of=1)  # teardown runs
    stopped.kill("grace over")
    assert first_progress(steps[1:], stopped) is None
