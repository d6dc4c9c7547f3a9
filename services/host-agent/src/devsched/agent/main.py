"""`devsched-agent --config agent.toml`: the host agent's command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from devsched.agent.agent import Agent, agent_version
from devsched.agent.config import ConfigError, load_config
from devsched.service import configure_logging, run, setup_tracing, shutdown_tracing


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line: the config file and the log level."""
    parser = argparse.ArgumentParser(
        prog="devsched-agent",
        description=(
            "Run assigned task plans on this host's devices. The keys of agent.toml are described in "
            "README.md, section Configuration, at 'The agent reads a TOML file'."
        ),
    )
    parser.add_argument("--config", type=Path, required=True, help="the agent's TOML file")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    parser.add_argument("--version", action="version", version=f"%(prog)s {agent_version()}")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `devsched-agent`; returns the exit code (2 for a bad configuration)."""
    options = parse_args(argv)
    try:
        config = load_config(options.config)
    except ConfigError as exc:
        print(f"devsched-agent: {exc}", file=sys.stderr)
        return 2
    configure_logging(options.log_level, service="devsched-agent")
    setup_tracing("devsched-agent")
    try:
        return run(Agent(config).serve)
    finally:
        shutdown_tracing()  # export the last spans


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
