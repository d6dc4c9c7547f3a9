from __future__ import annotations

from pathlib import Path

import pytest

from devsched.agent.main import main

pytestmark = pytest.mark.unit


def test_a_bad_config_exits_2_with_the_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "agent.toml"
    path.write_text('spool_dir = "/tmp/x"\nsurprise = 1\n')
    assert main(["--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"invalid agent config {path}" in err
    assert "host_id: required key is missing" in err
    assert "surprise: unknown key" in err


def test_the_config_flag_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main([])
    assert caught.value.code == 2
    assert "--config" in capsys.readouterr().err
