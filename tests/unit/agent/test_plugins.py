"""Plug-in actions of the agent: loaded from the `devsched.actions` entry points, advertised at registration."""

from __future__ import annotations

import logging
import shlex

import pytest
from devsched.plugins.adb import NAME, InstrumentArgs, command
from pydantic import BaseModel, Field

from devsched.agent.actions import advertised_schema, agent_registry, default_registry, load_plugins


def test_the_installed_example_plugin_is_loaded_and_advertised_with_its_schema() -> None:
    registry = agent_registry()
    assert NAME in registry
    offers = {o.name: o for o in registry.offers()}
    assert set(offers) == {"shell", "sleep", "noop", NAME}
    assert offers[NAME].version == "0.1.0"  # the package's version
    assert offers[NAME].args_schema == InstrumentArgs.model_json_schema()
    assert offers["shell"].args_schema is None  # built-ins are checked by the protocol's own models


def test_a_plugin_cannot_take_a_name_twice() -> None:
    registry = default_registry()
    assert load_plugins(registry) == [NAME]
    assert load_plugins(registry) == []  # logged and left out: the name is taken
    assert load_plugins(registry, group="devsched.no-such-group") == []


def test_the_adb_command_quotes_every_value() -> None:
    args = InstrumentArgs(runner="com.x.test/Runner", apk="/tmp/a b.apk", instrument_args={"class": "X; rm -rf /"})
    line = command(args)
    assert "install -r -t -g '/tmp/a b.apk'" in line
    assert f"-e class {shlex.quote('X; rm -rf /')}" in line
    assert "am instrument -w -r" in line
    assert shlex.quote("com.x.test/Runner") in line


def test_the_adb_args_are_strict() -> None:
    with pytest.raises(ValueError, match="runner"):
        InstrumentArgs.model_validate({})
    with pytest.raises(ValueError, match="extra"):
        InstrumentArgs.model_validate({"runner": "a/b", "sped": 1})


def test_a_schema_the_scheduler_would_refuse_is_not_advertised(caplog: pytest.LogCaptureFixture) -> None:
    """Pydantic writes `pattern` for a constrained string: advertised, it would get the registration refused."""

    class Grep(BaseModel):
        expression: str = Field(pattern=r"^\w+$")

    assert advertised_schema("grep", InstrumentArgs.model_json_schema()) == InstrumentArgs.model_json_schema()
    assert advertised_schema("grep", None) is None
    with caplog.at_level(logging.WARNING, logger="devsched.agent.actions"):
        assert advertised_schema("grep", Grep.model_json_schema()) is None
    [record] = caplog.records
    assert record.getMessage() == "plug-in args schema not advertised"
    assert record.__dict__["action"] == "grep"
    assert "pattern" in record.__dict__["error"]
