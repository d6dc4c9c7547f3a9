"""What environment a step's processes get: a clean one, never the agent's own.

The agent's environment holds what makes it the host (`DEVSCHED_NATS_URL` with a password, credential
paths, whatever its supervisor set), so handing it to a step would let any task submitter act as the host.
A step gets only:

| variable | from |
| --- | --- |
| `PATH` | the agent's, else `DEFAULT_PATH` |
| `HOME` | the step user's home when steps run as one, else the agent's, else the per-attempt directory |
| `LANG`, `LC_*` | the agent's (so tools print in the host's locale) |
| `TMPDIR` | the per-attempt directory (mode 0700, removed after the attempt) |
| the device's `env` | agent.toml |
| the step's `args.env` | the plan |
| `DEVSCHED_TASK_ID`, `DEVSCHED_ATTEMPT`, `DEVSCHED_LEASE_ID`, `DEVSCHED_DEVICE_ID` | the attempt |
| `DEVSCHED_ARTIFACTS_DIR` | the attempt's artifacts directory (in the per-attempt directory), when it has one |

Later rows win: the identity (and the artifacts directory) over the step's env over the device's env over
what is passed through, so a plan can neither forge its lease id nor be forged by a device's configuration.
`/bin/sh` itself adds `PWD` (and bash `SHLVL` and `_`); those are the shell's, not the agent's.
"""

from __future__ import annotations

from collections.abc import Mapping

#: `PATH` of a step when the agent has none (the POSIX `getconf PATH` plus /usr/local/bin).
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
#: Variables of the agent's environment that a step sees, besides every `LC_*`.
PASSED_THROUGH = frozenset({"PATH", "HOME", "LANG"})
#: Prefix of the locale variables passed through.
LOCALE_PREFIX = "LC_"
#: Where a step leaves files for the agent (its test results): the attempt's artifacts directory.
ARTIFACTS_DIR_VAR = "DEVSCHED_ARTIFACTS_DIR"


class StepEnvError(ValueError):
    """A variable of a device's or a step's `env` cannot be put in an environment."""


def passed_through(name: str) -> bool:
    """Whether the agent's variable `name` reaches a step."""
    return name in PASSED_THROUGH or name.startswith(LOCALE_PREFIX)


def _check(source: str, env: Mapping[str, str]) -> None:
    # execve() cannot carry these: without the check the step would fail later with a ValueError that names
    # no variable, or (for "=") the kernel would split the name where the caller did not mean it.
    for name, value in env.items():
        if not name or "=" in name or "\0" in name:
            raise StepEnvError(f"{source}: invalid variable name {name!r}")
        if "\0" in value:
            raise StepEnvError(f"{source}: variable {name!r} contains a NUL byte")


def step_environment(
    base: Mapping[str, str],
    *,
    tmpdir: str,
    device_env: Mapping[str, str] | None = None,
    step_env: Mapping[str, str] | None = None,
    identity_env: Mapping[str, str] | None = None,
    home: str | None = None,
    artifacts_dir: str | None = None,
) -> dict[str, str]:
    """The whole environment of a step; see the module docstring for what it holds and what wins.

    Args:
        base: the agent's environment (`os.environ`); only `PATH`, `HOME`, `LANG` and `LC_*` are read.
        tmpdir: the attempt's own temporary directory, given as `TMPDIR`.
        device_env: the device's configured `env`.
        step_env: the step's own `args.env`.
        identity_env: the `DEVSCHED_*` variables of the attempt (`RunIdentity.env()`).
        home: `HOME` of the step user; None keeps the agent's (or `tmpdir` when the agent has none).
        artifacts_dir: the attempt's artifacts directory, given as `DEVSCHED_ARTIFACTS_DIR` (None: not set).

    Raises:
        StepEnvError: a name or value of `device_env` or `step_env` cannot be in an environment.
    """
    device_env = device_env or {}
    step_env = step_env or {}
    _check("device env", device_env)
    _check("step env", step_env)
    env = {name: value for name, value in base.items() if passed_through(name)}
    env.setdefault("PATH", DEFAULT_PATH)
    if home is not None:
        env["HOME"] = home
    elif not env.get("HOME"):
        env["HOME"] = tmpdir
    if not env["PATH"]:
        env["PATH"] = DEFAULT_PATH
    env["TMPDIR"] = tmpdir
    env.update(device_env)
    env.update(step_env)
    env.update(identity_env or {})
    if artifacts_dir is not None:
        env[ARTIFACTS_DIR_VAR] = artifacts_dir
    return env
