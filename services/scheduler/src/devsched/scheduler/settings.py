"""The scheduler's settings: the shared ones plus JetStream, relay and assignment tuning."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import NoDecode

from devsched.core.limits import MAX_RELEASES_DEFAULT
from devsched.core.outputrate import OutputShare
from devsched.core.uploadrate import UploadShare
from devsched.protocol.artifacts import CHUNK_BYTES, DEFAULT_MAX_ATTEMPT_BYTES, DEFAULT_MAX_FILE_BYTES, chunk_count
from devsched.protocol.base import MAX_LABEL_CHARS
from devsched.protocol.connection import INBOX_PREFIX, host_inbox_prefix
from devsched.scheduler.admission import HOST_ID_PLACEHOLDER
from devsched.service.settings import Seconds, ServiceSettings
from devsched.store.stats import Grouping

MiB = 1024 * 1024
GiB = 1024 * MiB
#: Room a stored chunk takes beyond its bytes (its subject, headers and the store's record), rounded up.
CHUNK_OVERHEAD_BYTES = 512
#: Largest message a host's uploads stream takes (a chunk and its headers): what each message a commit purges
#: is charged against its host's uploads rate share, an upper bound of what writing it cost.
UPLOAD_MAX_MSG_BYTES = CHUNK_BYTES + 4096

#: A list of subject prefixes: comma-separated in the environment and on the command line.
Prefixes = Annotated[tuple[str, ...], NoDecode]


class SchedulerSettings(ServiceSettings):
    """Everything `devsched-scheduler` reads (`DEVSCHED_<NAME>` or `--<name>`)."""

    max_payload_bytes: int = Field(default=524288, ge=1024)
    """Largest request body accepted (413 above it); keep it below the NATS server's max_payload."""

    create_streams: bool = True
    """Create or update the JetStream streams at start; off when an operator manages them."""
    stream_replicas: int = Field(default=1, ge=1, le=5)
    """Replicas of each stream (3 on a NATS cluster)."""
    stream_storage: Literal["file", "memory"] = "file"
    """Storage of the streams."""
    duplicate_window_s: Seconds = 300.0
    """JetStream de-duplication window by `Nats-Msg-Id`; covers a relay crash between publish and mark."""
    assignments_max_age_s: Seconds = 86400.0
    """Oldest assignment kept in the (work-queue) assignments stream; leases are far shorter."""
    events_max_age_s: Seconds = 7 * 86400.0
    """Oldest event kept in the events stream."""
    events_max_bytes: int = Field(default=512 * MiB, ge=-1)
    """Size cap of the events stream in bytes (oldest dropped first); -1 for none (the store check then
    refuses to start wherever the store's size is known)."""
    logs_max_age_s: Seconds = 7 * 86400.0
    """Oldest step output kept in each host's logs stream (`<PU>_LOGS_<host_id>`)."""
    logs_max_bytes: int = Field(default=4 * GiB, ge=-1)
    """The logs budget in bytes: every host's logs stream together. Each host's stream holds
    `logs_max_bytes // max_hosts` (its share), its own oldest output dropped first; -1 for no cap (only the
    max age). Each attempt's output is also capped by its agent (`log_max_bytes`, 64 MiB by default)."""
    max_hosts: int = Field(default=64, ge=1, le=100_000)
    """Hosts that may have their own logs and uploads streams: the logs and uploads budgets are divided by it,
    and the registration of one host more is refused 507 `storage_full`."""
    host_log_records_per_s: float = Field(default=200.0, gt=0, allow_inf_nan=False)
    """Records a second one host may write into its logs stream, averaged over `host_log_rate_window_s`; past
    it (or past `host_log_bytes_per_s`), its logs stream refuses the host's new records for
    `host_log_cooldown_s` (`warden.py`)."""
    host_log_bytes_per_s: float = Field(default=16 * MiB, gt=0, allow_inf_nan=False)
    """Bytes a second one host may write into its logs stream, averaged over `host_log_rate_window_s`."""
    host_log_rate_window_s: Seconds = 30.0
    """The window a host's log write rate is averaged over: a burst within it is fine."""
    host_log_cooldown_s: Seconds = 30.0
    """How long a host over its log rate share has its logs stream closed to new records (at least the window)."""
    host_log_rate_interval_s: float = Field(default=1.0, ge=0, allow_inf_nan=False)
    """How often each replica reads the hosts' logs streams' state (one JetStream request for every host);
    0 turns the rate bound off on this replica (a closed stream is still reopened when its host registers)."""
    host_upload_bytes_per_s: float = Field(default=32 * MiB, gt=0, allow_inf_nan=False)
    """Bytes a second one host's artifact commits may purge from its uploads stream (every commit purges its
    chunks, whatever its outcome), averaged over `host_upload_rate_window_s`; past it, the host's next
    commits are refused 429 for the window, purging nothing (`uploadrate.py`). With several replicas, each
    keeps its own account: a host may reach this rate on each."""
    host_upload_rate_window_s: Seconds = 60.0
    """The window a host's upload rate is averaged over, and how long its commits are refused past it; the
    window's bytes (`host_upload_bytes_per_s * host_upload_rate_window_s`) must hold one attempt's artifacts
    in full chunks (`artifact_max_attempt_bytes`, each message charged 132 KiB, as if full). The defaults hold
    that and some 6,700 files' part-filled last chunks besides: one honest attempt uploading at any speed is
    not refused."""
    artifact_max_file_bytes: int = Field(default=DEFAULT_MAX_FILE_BYTES, ge=0)
    """Largest artifact file a host may store (issue 12); a larger one is refused `artifact_too_large`."""
    artifact_max_attempt_bytes: int = Field(default=DEFAULT_MAX_ATTEMPT_BYTES, ge=0)
    """Most bytes of artifacts one attempt may store; past it, `artifact_quota_exceeded`."""
    artifact_commit_slots: int = Field(default=8, ge=1, le=1000)
    """Artifact commits handled at once by this process, apart from the request slots (`max_concurrency`):
    a commit waits on its host's chunks, and must not hold a slot that renewals need. More are answered 429."""
    artifact_commits_per_host: int = Field(default=2, ge=1, le=100)
    """Artifact commits of one host handled at once; more are answered 429 `too_many_requests`."""
    artifact_commit_timeout_s: Seconds = 120.0
    """Deadline of one artifact commit, from its start: past it the commit fails `upload_timeout` (408) and
    the chunks read so far are purged (a host trickling its chunks holds a commit slot this long at most)."""
    artifacts_max_age_s: Seconds = 7 * 86400.0
    """Oldest artifact kept in the bucket `<PU>_ARTIFACTS` (like the logs); its row goes with its task."""
    artifacts_max_bytes: int = Field(default=2 * GiB, ge=-1)
    """Size cap of the artifacts bucket in bytes (new objects refused when full); -1 for none."""
    uploads_max_age_s: Seconds = 3600.0
    """Oldest chunk kept in a host's `<PU>_UPLOADS_<host_id>` (a commit purges its upload at once; this drops
    abandoned ones)."""
    uploads_max_bytes: int = Field(default=64 * 288 * MiB, ge=-1)
    """The uploads budget in bytes: every host's uploads stream together. Each host's stream holds
    `uploads_max_bytes // max_hosts` (its share; its new chunks refused when full), which must hold the
    largest artifact file; -1 for no cap."""
    revoked_sessions_max_bytes: int = Field(default=8 * MiB, ge=64 * 1024)
    """Size cap of the bucket `<PU>_WEB_REVOKED` in bytes: the dashboard's logged-out sessions, about 110 bytes
    each while its cookie could still be valid (8 MiB: some 70,000); when full, a logout is refused (503),
    never an older one forgotten."""
    jetstream_store_bytes: int = Field(default=0, ge=0)
    """Size of the JetStream store (the server's `max_file_store`, or its volume) for the check at start
    when the account has no storage limit of its own; 0: only the account's limit is checked."""
    jetstream_reserve_bytes: int = Field(default=256 * MiB, ge=0)
    """Room of the JetStream store kept out of the budgets, for the assignments stream and the consumers."""
    consumer_ack_wait_s: Seconds = 30.0
    """How long an agent has to ack an assignment before JetStream redelivers it."""
    consumer_max_deliver: int = Field(default=10, ge=1)
    """Deliveries of one assignment before JetStream gives up (the resync publishes it again while the lease
    runs)."""
    assign_batch: int = Field(default=200, ge=1, le=5000)
    """Tasks assigned per transaction."""
    assign_tick_s: Seconds = 1.0
    """Safety-net period of the assignment loop (it is woken by submits, reports, registrations, releases)."""
    relay_enabled: bool = True
    """Run the outbox relay in this process."""
    relay_batch: int = Field(default=200, ge=1, le=5000)
    """Outbox rows published per transaction."""
    relay_tick_s: Seconds = 1.0
    """Period of the relay's pass over the table, for messages no process published at once (the sweeper's
    wake it sooner)."""
    relay_mark_delay_s: Seconds = 1.0
    """How long messages published at once wait to be marked sent, so that one transaction marks many; a
    crash meanwhile publishes them again, and the duplicate window drops the copies."""
    relay_grace_s: Seconds = 3.0
    """Age below which the relay's routine pass leaves an unsent message to the replica that wrote it (which
    publishes it at once and marks it within `relay_mark_delay_s`)."""
    resync_interval_s: float = Field(default=10.0, ge=0, allow_inf_nan=False)
    """Period of the resync pass: the assignments of attempts on online hosts still unclaimed `resync_after_s`
    after they were made are published again, and streams found missing are created again; 0 turns the pass
    off (a host's registration still has its own assignments published again)."""
    resync_after_s: float = Field(default=10.0, ge=0, allow_inf_nan=False)
    """How long an assignment stays unclaimed before the resync pass publishes it again."""
    assign_inline: bool = True
    """A submit assigns its task to a free device, and a report the device it frees to the next queued task,
    in their own transactions; the assignment loop's pass runs only when one may find more."""
    health_pass_interval_s: float = Field(default=5.0, ge=0, allow_inf_nan=False)
    """Period of the health pass (issue 13): health tasks submitted for the devices due a health check and
    placed on their idle devices, quarantined ones included; 0 turns it off (no health check runs)."""
    health_pass_batch: int = Field(default=100, ge=1, le=10_000)
    """Most devices one health pass submits health tasks for (and health tasks it places)."""
    metrics_interval_s: Seconds = 5.0
    """With `metrics_port` set: how often the gauges read from the database (queue, tasks, hosts, devices,
    outbox) are read again; a scrape serves the last reading."""
    metrics_group_by: str | None = Field(default=None, min_length=1, max_length=MAX_LABEL_CHARS)
    """A label key (`platform`, `pool`) that splits the queue and device gauges: each gets a `group` label, the
    value of that label in a queued task's selector or on a device (`""` where there is none); unset: off."""
    metrics_group_limit: int = Field(default=10, ge=1, le=100)
    """Most values of `metrics_group_by` shown as groups (those of the most devices, then of the most queued
    tasks); the others are counted together as `other`, so the series stay few whatever the labels."""
    publish_timeout_s: Seconds = 5.0
    """Bound on one JetStream publish acknowledgement."""
    max_concurrency: int = Field(default=64, ge=1, le=10000)
    """Requests handled at once by this process; more wait in NATS's per-subscription queue."""
    shutdown_grace_s: Seconds = 10.0
    """On SIGTERM, how long requests in flight may take to finish."""
    host_inbox_prefixes: Prefixes = (f"{host_inbox_prefix(HOST_ID_PLACEHOLDER)}.",)
    """Reply subjects a host endpoint answers, `{host_id}` standing for the requesting host; `_R_.` where
    hosts are NATS accounts of their own (the server rewrites their replies). Others are dropped unanswered."""
    operator_inbox_prefixes: Prefixes = (f"{INBOX_PREFIX}.",)
    """Reply subjects an operator endpoint (`P.api.*`) answers; others are dropped unanswered."""
    host_max_in_flight: int = Field(default=16, ge=1, le=10000)
    """Requests of one host handled at once; more are answered 429 `too_many_requests`."""
    host_rate_per_s: float = Field(default=200.0, gt=0, allow_inf_nan=False)
    """Sustained requests per second of one host; more are answered 429 with `retry_after_s`."""
    host_burst: int = Field(default=400, ge=1, le=100000)
    """Requests one host may send at once after a quiet spell (the token bucket's size)."""
    host_max_in_flight_per_device: int = Field(default=2, ge=0, le=1000)
    """Added to `host_max_in_flight` for each device the host registered with this scheduler."""
    host_rate_per_device_per_s: float = Field(default=20.0, ge=0, allow_inf_nan=False)
    """Added to `host_rate_per_s` for each device the host registered with this scheduler."""
    host_burst_per_device: int = Field(default=40, ge=0, le=100000)
    """Added to `host_burst` for each device the host registered with this scheduler."""
    max_releases: int = Field(default=MAX_RELEASES_DEFAULT, ge=0, le=10000)
    """How many times a task may be released by its hosts (agent shutdown, drain, restart) and queued again
    without spending an attempt; the release after that fails it with reason `released_too_often`."""

    @field_validator("host_inbox_prefixes", "operator_inbox_prefixes", mode="before")
    @classmethod
    def _split_prefixes(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("host_inbox_prefixes", "operator_inbox_prefixes")
    @classmethod
    def _concrete_prefixes(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError("at least one prefix is needed")
        for prefix in value:
            bare = prefix.replace("{host_id}", "h")
            if not bare.endswith(".") or len(bare) < 2 or any(c in bare for c in "*> \t{}"):
                raise ValueError(f"{prefix!r}: a prefix is subject tokens ending with a dot, no wildcards")
        return value

    @model_validator(mode="after")
    def _window_within_ages(self) -> SchedulerSettings:
        shortest = min(self.assignments_max_age_s, self.events_max_age_s, self.logs_max_age_s)
        if self.duplicate_window_s > shortest:
            raise ValueError(f"duplicate_window_s must not exceed the streams' max age ({shortest} s)")
        return self

    @model_validator(mode="after")
    def _log_rate_window(self) -> SchedulerSettings:
        if self.host_log_cooldown_s < self.host_log_rate_window_s:
            raise ValueError("host_log_cooldown_s must be at least host_log_rate_window_s")
        if self.host_log_rate_interval_s * 2 > self.host_log_rate_window_s:
            raise ValueError("host_log_rate_interval_s must be at most half of host_log_rate_window_s")
        return self

    @model_validator(mode="after")
    def _upload_rate_holds_an_attempt(self) -> SchedulerSettings:
        window_bytes = self.host_upload_bytes_per_s * self.host_upload_rate_window_s
        need = chunk_count(self.artifact_max_attempt_bytes) * UPLOAD_MAX_MSG_BYTES
        if window_bytes < need:
            raise ValueError(
                f"host_upload_bytes_per_s * host_upload_rate_window_s ({window_bytes:.0f} bytes) must hold one "
                f"attempt's artifacts (artifact_max_attempt_bytes in chunks of {UPLOAD_MAX_MSG_BYTES} bytes, "
                f"{need} bytes)"
            )
        return self

    @model_validator(mode="after")
    def _upload_share_holds_a_file(self) -> SchedulerSettings:
        share = self.uploads_host_max_bytes
        need = self.artifact_max_file_bytes + chunk_count(self.artifact_max_file_bytes) * CHUNK_OVERHEAD_BYTES
        if share >= 0 and share < need:
            raise ValueError(
                f"uploads_max_bytes / max_hosts ({share} bytes a host) must hold the largest artifact file "
                f"(artifact_max_file_bytes, {need} bytes with its chunks' headers)"
            )
        return self

    @property
    def logs_host_max_bytes(self) -> int:
        """Each host's share of the logs budget (`max_bytes` of its logs stream); -1 for no cap."""
        return -1 if self.logs_max_bytes < 0 else self.logs_max_bytes // self.max_hosts

    @property
    def metrics_grouping(self) -> Grouping | None:
        """The label the queue and device gauges are also counted by, and its bound; None when off."""
        return Grouping(self.metrics_group_by, self.metrics_group_limit) if self.metrics_group_by else None

    @property
    def output_share(self) -> OutputShare:
        """Each host's share of the logs' write rate."""
        return OutputShare(
            records_per_s=self.host_log_records_per_s,
            bytes_per_s=self.host_log_bytes_per_s,
            window_s=self.host_log_rate_window_s,
            cooldown_s=self.host_log_cooldown_s,
        )

    @property
    def upload_share(self) -> UploadShare:
        """Each host's share of the uploads' write rate."""
        return UploadShare(bytes_per_s=self.host_upload_bytes_per_s, window_s=self.host_upload_rate_window_s)

    @property
    def uploads_host_max_bytes(self) -> int:
        """Each host's share of the uploads budget (`max_bytes` of its uploads stream); -1 for no cap."""
        return -1 if self.uploads_max_bytes < 0 else self.uploads_max_bytes // self.max_hosts
