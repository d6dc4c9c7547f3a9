from __future__ import annotations

from pathlib import Path

import pytest

from devsched.agent.config import AgentConfig, ConfigError, load_config

pytestmark = pytest.mark.unit

VALID = """
host_id = "bench-07"
spool_dir = "/var/lib/devsched-agent"
[[devices]]
device_id = "pixel-7-a"
labels = { platform = "android", model = "pixel7" }
env = { ANDROID_SERIAL = "33ab12" }
[[devices]]
device_id = "board-1"
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "agent.toml"
    path.write_text(text)
    return path


def test_valid_config_loads_with_defaults(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, VALID))
    assert config.host_id == "bench-07"
    assert config.spool_dir == Path("/var/lib/devsched-agent")
    assert [d.device_id for d in config.devices] == ["pixel-7-a", "board-1"]
    assert config.devices[0].labels == {"platform": "android", "model": "pixel7"}
    assert config.devices[0].env == {"ANDROID_SERIAL": "33ab12"}
    assert config.devices[1].labels == {}
    assert config.devices[1].env == {}
    assert config.subject_prefix == "devsched"
    assert config.nats_creds is None
    assert config.device("board-1") is config.devices[1]
    assert config.device("nope") is None


def test_missing_host_id_names_the_field_and_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, 'spool_dir = "/tmp/x"\n')
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    message = str(caught.value)
    assert str(path) in message
    assert "host_id: required key is missing" in message


def test_unknown_keys_are_rejected_at_every_level(tmp_path: Path) -> None:
    text = VALID.replace('host_id = "bench-07"', 'host_id = "bench-07"\nhots = 1').replace(
        'device_id = "board-1"', 'device_id = "board-1"\nlabel = { a = "b" }'
    )
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, text))
    message = str(caught.value)
    assert "hots: unknown key" in message
    assert "devices.1.label: unknown key" in message


def test_duplicate_device_ids_are_rejected(tmp_path: Path) -> None:
    text = VALID.replace('device_id = "board-1"', 'device_id = "pixel-7-a"')
    with pytest.raises(ConfigError, match="devices: duplicate device_id 'pixel-7-a'"):
        load_config(write(tmp_path, text))


@pytest.mark.parametrize("bad", ["has space", "", "dots.are.tokens", "x" * 65])
def test_ids_must_be_subject_tokens(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ConfigError, match="host_id: String should match pattern"):
        load_config(write(tmp_path, VALID.replace("bench-07", bad)))


def test_wrong_types_are_named(tmp_path: Path) -> None:
    text = VALID.replace('env = { ANDROID_SERIAL = "33ab12" }', "env = { ANDROID_SERIAL = 33 }")
    with pytest.raises(ConfigError, match=r"devices\.0\.env\.ANDROID_SERIAL: Input should be a valid string"):
        load_config(write(tmp_path, text))


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot read agent config .*nope\.toml"):
        load_config(tmp_path / "nope.toml")


def test_invalid_toml_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"agent\.toml is not valid TOML"):
        load_config(write(tmp_path, "host_id = \n"))


def test_environment_overrides_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = 'nats_url = "nats://file:4222"\nsubject_prefix = "fromfile"\n' + VALID
    monkeypatch.setenv("DEVSCHED_NATS_URL", "nats://env:4222")
    monkeypatch.setenv("DEVSCHED_SUBJECT_PREFIX", "fromenv")
    monkeypatch.setenv("DEVSCHED_NATS_CREDS", "/etc/nats/host.creds")
    config = load_config(write(tmp_path, text))
    assert config.nats_url == "nats://env:4222"
    assert config.subject_prefix == "fromenv"
    assert config.nats_creds == Path("/etc/nats/host.creds")
    assert load_config(write(tmp_path, text), environ=False).nats_url == "nats://file:4222"


def test_empty_environment_variables_do_not_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEVSCHED_SUBJECT_PREFIX", "")
    assert load_config(write(tmp_path, 'subject_prefix = "fromfile"\n' + VALID)).subject_prefix == "fromfile"


def test_environment_values_are_validated_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEVSCHED_SUBJECT_PREFIX", "not a token")
    with pytest.raises(ConfigError, match="subject_prefix"):
        load_config(write(tmp_path, VALID))


def test_other_environment_variables_are_ignored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEVSCHED_HOST_ID", "from-env")
    monkeypatch.setenv("DEVSCHED_DATABASE_URL", "postgresql://x")
    assert load_config(write(tmp_path, VALID)).host_id == "bench-07"


def test_durations_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="stop_grace_s: Input should be greater than 0"):
        load_config(write(tmp_path, "stop_grace_s = 0\n" + VALID))


def test_config_is_immutable(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, VALID))
    assert isinstance(config, AgentConfig)
    with pytest.raises(ValueError, match="frozen"):
        config.host_id = "other"  # type: ignore[misc]
