"""The agent's configuration: a TOML file, with the NATS settings overridable by environment.

```toml
host_id = "bench-07"
spool_dir = "/var/lib/devsched-agent"
[[devices]]
device_id = "pixel-7-a"
labels = { platform = "android" }
env = { ANDROID_SERIAL = "33ab12" }
```

Every NATS setting (`nats_url`, `nats_creds`, ..., `devsched.protocol.tls.NatsSettings`), `subject_prefix`,
`jetstream_api_prefix`, `metrics_port` and `metrics_host` from the file is overridden by its environment
variable `DEVSCHED_<NAME>` (`DEVSCHED_NATS_URL`, `DEVSCHED_NATS_TLS_CA`, ...: the names the services read).

The agent's credentials are files only: every step the agent runs inherits its environment, so a
`nats_url` with a user, password or token in it (from the file or the environment) is refused at start.

Step output streaming (`log_streaming`, `log_max_bytes`, `log_buffer_bytes`, `log_record_bytes`,
`log_linger_s`, `log_flush_s`) is described in `logstream.py` and `logbatch.py`.

Artifacts (`artifact_uploads`, `artifact_max_file_bytes`, `artifact_max_attempt_bytes`): `uploads.py`.

Optional confinement of steps: `work_dir` (default `devsched-agent` under the system temp dir) and
`step_user` (an unprivileged user steps run as; checked at the agent's start, `workspace.py`).
"""

from __future__ import annotations

import os
import tempfile
import tomllib
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from devsched.agent.logbatch import LogLimits, MiB
from devsched.agent.reporter import PARK_AFTER_S_DEFAULT
from devsched.core.ids import TOKEN_PATTERN
from devsched.core.text import RULE, is_storable
from devsched.protocol.artifacts import DEFAULT_MAX_ATTEMPT_BYTES, DEFAULT_MAX_FILE_BYTES
from devsched.protocol.base import Labels
from devsched.protocol.tls import NatsSettings, url_has_credentials

#: What a `nats_url` with credentials in it is refused with (one line).
URL_CREDENTIALS_REFUSED = (
    "nats_url carries credentials, which every step would inherit: remove them from the URL and set "
    "nats_user + nats_password_file (DEVSCHED_NATS_USER / DEVSCHED_NATS_PASSWORD_FILE), "
    "or nats_creds / nats_nkey_seed"
)

#: A single NATS subject token: the prefix, host ids and device ids.
Token = Annotated[str, Field(pattern=TOKEN_PATTERN)]
#: A duration in seconds: finite and > 0.
Seconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]
#: A user name as useradd accepts it (no uid numbers: a name is what an operator reads in the config).
UserName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$")]


def default_work_dir() -> Path:
    """`devsched-agent` under the system's temporary directory: where attempts' directories go by default."""
    return Path(tempfile.gettempdir()) / "devsched-agent"


class ConfigError(Exception):
    """The agent's configuration file is missing, unreadable or invalid."""


class DeviceConfig(BaseModel):
    """One device attached to this host."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: Unique across all hosts; a subject token.
    device_id: Token
    #: What selectors match on (`platform = "android"`): as the protocol bounds them (at most 100, keys and
    #: values at most 256 characters, no NUL), so a registration is never refused for them.
    labels: Labels = Field(default_factory=dict)

    @field_validator("labels")
    @classmethod
    def _storable_labels(cls, labels: dict[str, str]) -> dict[str, str]:
        if not all(is_storable(k) and is_storable(v) for k, v in labels.items()):
            raise ValueError(f"a label {RULE}")
        return labels

    #: Given to every step that runs on this device.
    env: dict[str, str] = Field(default_factory=dict)


class AgentConfig(NatsSettings):
    """Everything the agent needs to know about its host, its devices and the control plane.

    NATS access (`nats_url`, `nats_creds`, ..., `NatsSettings`) as every service reads it.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: This host's id; a subject token, used in every host subject.
    host_id: Token
    #: Where reports wait until the scheduler has answered them; survives restarts.
    spool_dir: Path
    #: The devices this host runs work on (may be empty).
    devices: tuple[DeviceConfig, ...] = ()
    #: Subject prefix of the deployment.
    subject_prefix: Token = "devsched"
    #: How long a process group gets between SIGTERM and SIGKILL when a step is stopped or timed out.
    stop_grace_s: Seconds = 5.0
    #: On SIGTERM, how long running attempts may go on before they stop as for a lease loss.
    shutdown_grace_s: Seconds = 10.0
    #: Timeout of one request to the scheduler (claim, renew, report, register, heartbeat).
    request_timeout_s: Seconds = 5.0
    #: Renew the host's leases together, about one `renewals` request per renewal interval, when the
    #: scheduler serves it (`renewals.py`); off: one `renew` request per lease, as an older scheduler needs.
    batch_renewals: bool = True
    #: Send reports ready together in one `reports` request when the scheduler serves it (`reports.py`), each
    #: still answered on its own; off: one `report` request per report, as an older scheduler needs.
    batch_reports: bool = True
    #: How long a report is retried while the scheduler answers it with server errors (500 `internal`, not
    #: an outage's 503 or silence, which are waited out): then it is parked, kept in the spool and sent
    #: again at the next start.
    report_park_after_s: Seconds = PARK_AFTER_S_DEFAULT
    #: Bound on draining the NATS connection at shutdown (nats-py's default of 30 s is too long).
    drain_timeout_s: Seconds = 2.0
    #: Where this host sends its JetStream API requests (consumer info, pull). `$JS.API` in the account of
    #: the streams; `<prefix>.js.API` where the host is a NATS account of its own that imports them there
    #: (deploy/nats/host_user.py), since a JetStream-less account answers `$JS.API` itself with 503.
    jetstream_api_prefix: str = Field(default="$JS.API", pattern=r"^[A-Za-z0-9_$-]+(\.[A-Za-z0-9_$-]+)*$")

    #: Where each attempt gets its own directory, the steps' TMPDIR (`workspace.py`); never inside
    #: `spool_dir`, whose reports a step must not see, nor around it (the agent clears it at start).
    work_dir: Path = Field(default_factory=default_work_dir)
    #: Run steps as this unprivileged user (and its primary group); None: as the agent's own user.
    step_user: UserName | None = None
    #: Port of the HTTP health endpoints (`/healthz`, `/readyz`, `health.py`); None: no listener.
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    #: Address they listen on; `0.0.0.0` in a pod, for the kubelet's probes.
    metrics_host: str = Field(default="127.0.0.1", min_length=1)

    #: Stream each step's output live to the `<PU>_LOGS` stream (`devsched logs`); off: only the report's tail.
    log_streaming: bool = True
    #: Output bytes sent per attempt; past it a `truncated` record, and the rest is only counted.
    log_max_bytes: int = Field(default=64 * MiB, ge=0)
    #: Output bytes one attempt may hold in memory while NATS is slow or away; past it output is dropped,
    #: and a `dropped` record says how much. A step never waits for NATS.
    log_buffer_bytes: int = Field(default=8 * MiB, ge=64 * 1024)
    #: Output bytes per record (one JetStream message); lowered to fit the server's max_payload.
    log_record_bytes: int = Field(default=64 * 1024, ge=1024, le=512 * 1024)
    #: How long output that does not fill a record waits for more before it is sent (`logs -f` latency).
    log_linger_s: Seconds = 0.1
    #: At an attempt's end, how long the agent may wait for its output to be stored before it reports
    #: (only while publishing makes progress; the lease is renewed meanwhile).
    log_flush_s: Seconds = 10.0

    #: Store the files steps leave in `DEVSCHED_ARTIFACTS_DIR` after each step (issue 12, `uploads.py`).
    artifact_uploads: bool = True
    #: Largest artifact file sent (the scheduler has its own cap, `DEVSCHED_ARTIFACT_MAX_FILE_BYTES`).
    artifact_max_file_bytes: int = Field(default=DEFAULT_MAX_FILE_BYTES, ge=0)
    #: Most artifact bytes sent per attempt (the scheduler's: `DEVSCHED_ARTIFACT_MAX_ATTEMPT_BYTES`).
    artifact_max_attempt_bytes: int = Field(default=DEFAULT_MAX_ATTEMPT_BYTES, ge=0)

    @field_validator("nats_url")
    @classmethod
    def _no_credentials_in_url(cls, url: str) -> str:
        if url_has_credentials(url):
            raise ValueError(URL_CREDENTIALS_REFUSED)
        return url

    @field_validator("devices")
    @classmethod
    def _unique_device_ids(cls, devices: tuple[DeviceConfig, ...]) -> tuple[DeviceConfig, ...]:
        seen: set[str] = set()
        for device in devices:
            if device.device_id in seen:
                raise ValueError(f"duplicate device_id {device.device_id!r}")
            seen.add(device.device_id)
        return devices

    @model_validator(mode="after")
    def _work_dir_apart_from_spool(self) -> AgentConfig:
        # The agent clears its work directory at start: one inside the other would lose reports or expose them.
        work, spool = Path(os.path.abspath(self.work_dir)), Path(os.path.abspath(self.spool_dir))
        if work == spool or spool in work.parents or work in spool.parents:
            raise ValueError(f"work_dir {self.work_dir} and spool_dir {self.spool_dir} must not contain each other")
        return self

    def log_limits(self, max_payload: int) -> LogLimits:
        """How attempts' output is batched and bounded, for a server that takes messages of `max_payload`."""
        return LogLimits(
            max_bytes=self.log_max_bytes,
            buffer_bytes=self.log_buffer_bytes,
            record_bytes=self.log_record_bytes,
            max_payload=max_payload,
            linger_s=self.log_linger_s,
        )

    def device(self, device_id: str) -> DeviceConfig | None:
        """The configured device with this id, if any."""
        return next((d for d in self.devices if d.device_id == device_id), None)


#: The settings that the environment may override: `DEVSCHED_<NAME>`, as the services read them.
ENV_OVERRIDABLE = (*NatsSettings.model_fields, "subject_prefix", "jetstream_api_prefix", "metrics_port", "metrics_host")


class _Environment(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="DEVSCHED_", env_ignore_empty=True, extra="ignore")


_OVERRIDES: dict[str, Any] = {name: (str | None, None) for name in ENV_OVERRIDABLE}
#: The overridable settings the environment gives (empty variables count as unset).
EnvOverrides = create_model("EnvOverrides", __base__=_Environment, **_OVERRIDES)


def _describe(error: ValidationError) -> list[str]:
    lines = []
    for item in error.errors():
        where = ".".join(str(part) for part in item["loc"]) or "(top level)"
        if item["type"] == "missing":
            lines.append(f"{where}: required key is missing")
        elif item["type"] == "extra_forbidden":
            lines.append(f"{where}: unknown key")
        elif item["type"] == "value_error":
            lines.append(f"{where}: {item['ctx']['error']}")
        else:
            lines.append(f"{where}: {item['msg']}")
    return lines


def parse_config(data: dict[str, Any], *, source: str = "<config>") -> AgentConfig:
    """Validate an already parsed configuration mapping.

    A `nats_url` with credentials is refused with one line of its own (`URL_CREDENTIALS_REFUSED`).

    Raises:
        ConfigError: naming `source` and every offending key.
    """
    url = data.get("nats_url")
    if isinstance(url, str) and url_has_credentials(url):
        raise ConfigError(f"agent config {source}: {URL_CREDENTIALS_REFUSED}")
    try:
        return AgentConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"invalid agent config {source}:\n  " + "\n  ".join(_describe(exc))) from None


def load_config(path: Path, *, environ: bool = True) -> AgentConfig:
    """Read, override from the environment (when `environ`) and validate the TOML file at `path`.

    Raises:
        ConfigError: the file is missing, not TOML, or invalid; the message names the file and the keys.
    """
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read agent config {path}: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"agent config {path} is not valid TOML: {exc}") from None
    if environ:
        overrides = EnvOverrides().model_dump(exclude_none=True)
        data.update(overrides)
    return parse_config(data, source=str(path))
