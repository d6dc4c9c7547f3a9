"""`adb-instrument`: install an app and its test APK on the device, run the instrumentation, judge it.

An example of a devsched plug-in action, and a useful one: a plug-in package imports only the plug-in API,
`devsched.agent.plugin`, and declares an `ActionPlugin` under the `devsched.actions` entry-point group (see
pyproject.toml); the agent loads it at start, advertises it (with the JSON Schema of `InstrumentArgs`, which
the scheduler checks at submit), and only hosts that have it get tasks that use it.

It runs through the agent's own `shell` action, so the commands get everything a shell step gets: the
device's `env` (`ANDROID_SERIAL`, which adb reads to pick the device), the step user, the process group
that a stop or a timeout kills, and live output in the logs stream. The adb binary is `$ADB` from the
device's `env` when set, else `adb` on the `PATH`.

`am instrument` exits 0 whether tests pass or not, so the step judges the raw output (`-r`): it passes when
the run ended with `INSTRUMENTATION_CODE: -1` (Android's RESULT_OK) and reported no failure (`FAILURES!!!`,
or a test's `INSTRUMENTATION_STATUS_CODE: -2`/`-4`: a failed or errored test).
"""

from __future__ import annotations

import shlex
from dataclasses import replace

from pydantic import Field

from devsched.agent.plugin import ActionPlugin, ActionResult, ArgsModel, StepContext, parse_args, shell

#: The action's name, as plans use it (the entry point's name in pyproject.toml).
NAME = "adb-instrument"


class InstrumentArgs(ArgsModel):
    """Arguments of `adb-instrument`."""

    runner: str = Field(min_length=1, description="The instrumentation: `<test package>/<runner class>`.")
    apk: str | None = Field(default=None, description="The app's APK, installed first (a path on the host).")
    test_apk: str | None = Field(default=None, description="The test APK, installed after the app.")
    instrument_args: dict[str, str] = Field(
        default_factory=dict, description="Instrumentation arguments, each passed as `-e NAME VALUE`."
    )
    grant_permissions: bool = Field(default=True, description="Install with `-g`: grant runtime permissions.")


def command(args: InstrumentArgs) -> str:
    """The shell command line that installs, instruments and judges (every value quoted)."""
    adb = '"${ADB:-adb}"'
    flags = "-r -t" + (" -g" if args.grant_permissions else "")
    lines = ["set -e"]
    for apk in (args.apk, args.test_apk):
        if apk is not None:
            lines.append(f"{adb} install {flags} {shlex.quote(apk)}")
    extras = "".join(f" -e {shlex.quote(k)} {shlex.quote(v)}" for k, v in sorted(args.instrument_args.items()))
    log = '"${TMPDIR:-/tmp}/adb-instrument.txt"'
    lines += [
        f"{adb} shell am instrument -w -r{extras} {shlex.quote(args.runner)} | tee {log}",
        f"if grep -q -e 'FAILURES!!!' -e '^INSTRUMENTATION_STATUS_CODE: -[24]' {log}; then",
        "  echo 'adb-instrument: tests failed' >&2; exit 1",
        "fi",
        f"if ! grep -q '^INSTRUMENTATION_CODE: -1' {log}; then",
        "  echo 'adb-instrument: the instrumentation did not finish (no INSTRUMENTATION_CODE: -1)' >&2; exit 1",
        "fi",
    ]
    return "\n".join(lines)


async def instrument(ctx: StepContext) -> ActionResult:
    """Run the step: `command(args)` as a `shell` step with the same context."""
    args = parse_args(InstrumentArgs, NAME, ctx.args)
    return await shell(replace(ctx, args={"command": command(args)}))


#: The entry point's object.
plugin = ActionPlugin(run=instrument, args=InstrumentArgs)
