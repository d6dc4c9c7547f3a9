"""`devsched-agent --config agent.toml`: the host agent's command line.

    devsched-agent --config /etc/devsched/agent.toml                  # run until SIGTERM (SIGUSR1 drains)
    devsched-agent --config /etc/devsched/agent.toml --check-config   # check it all and exit, start nothing

Its settings are the keys of agent.toml (some overridden by `DEVSCHED_*` variables, `config.py`), not flags.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from devsched.agent.agent import Agent
from devsched.agent.config import ConfigError, load_config
from devsched.agent.preflight import agent_checks
from devsched.service import configure_logging, run, setup_tracing, shutdown_tracing
from devsched.service.flags import add_program_flags
from devsched.service.preflight import run_checks

PROG = "devsched-agent"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line: the config file, the log level, `--check-config` and `--version`."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=(
            "Run assigned task plans on this host's devices. The keys of agent.toml are described in "
            "README.md, section Configuration, at 'The agent reads a TOML file'."
        ),
        allow_abbrev=False,
    )
    add_program_flags(parser, "devsched-agent")
    parser.add_argument("--config", type=Path, required=True, help="the agent's TOML file")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `devsched-agent`; returns the exit code (2 for a bad configuration)."""
    options = parse_args(argv)
    try:
        config = load_config(options.config)
    except ConfigError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    if options.check_config:
        return run_checks(PROG, agent_checks(config))
    configure_logging(options.log_level, service=PROG)
    setup_tracing(PROG)
    try:
        return run(Agent(config).serve)
    finally:
        shutdown_tracing()  # export the last spans


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
