#!/usr/bin/env python3
"""Print the NATS account block that confines one device host to its own subjects.

    python deploy/nats/host_user.py bench-07 --password-hash '$2a$11$...'
    python deploy/nats/host_user.py bench-07 --prefix devsched-lab2 --account DEVSCHED_LAB2

Paste the output into the `accounts` map of `deploy/nats/accounts.conf` (between the `# BEGIN host-...` /
`# END host-...` markers it prints), apply the ConfigMap again, and the chart's config reloader makes NATS
pick it up without a restart (see deploy/README.md).

Each host is an account of its own, not a user of the devsched account: a NATS request names its own
reply subject, and JetStream delivers a pull request's messages to whatever reply the puller names, so a
host inside the devsched account could have its assignments delivered into the streams' subjects (another
host's `P.assign.<id>`, a task's events). In an account of its own, every reply subject a host names is a
subject of that account, where no stream and no other host live. The account imports, from the devsched
account (which exports them in accounts.conf), exactly what `devsched-agent` uses (PROTOCOL.md):

- services: `P.host.<id>.*`, every request verb of this host (register, heartbeat, claim, renew, report,
  release, artifact, and any host endpoint a later release adds: the block names no verb, so it never needs
  generating again for one; the devsched account exports `P.host.*.*`); the two JetStream API
  calls it makes on its own durable consumer `host-<id>` of the stream `<PU>_ASSIGNMENTS` (consumer info and
  pull "next"), mapped to `P.js.API.CONSUMER...` in the host's account (the agent's `jetstream_api_prefix`); and the
  acks of the messages that consumer delivers (`$JS.ACK.<PU>_ASSIGNMENTS.host-<id>.>`, which also covers
  nak and in-progress). The server rewrites the reply of an imported request to a `_R_.` subject
  of the devsched account, so the scheduler answers hosts under `_R_.` (`DEVSCHED_HOST_INBOX_PREFIXES`).
- service: its step output `P.host.<id>.log.>` (the agent's JetStream publishes into the stream `<PU>_LOGS`,
  which lives in the devsched account; the stream's acknowledgement comes back as the reply).
- service: its artifact chunks `P.host.<id>.upload.>` (into the stream `<PU>_UPLOADS`, acknowledged the same
  way); the scheduler moves them into the artifacts bucket on the host's `artifact` commit. The host never
  reaches the bucket (`$O.>`), the uploads stream's API, nor another host's uploads.
- stream: its nudges `P.host.<id>.nudge` (which also carry the scheduler's drain notice for this host).

Its one user may publish to exactly those subjects, less its own nudge (denied: `P.host.<id>.*` covers it,
and only the scheduler nudges), and subscribe to its nudges and its own inbox
`_INBOX.<id>.>` (the agent connects with that inbox prefix). The account's limits bound what one host can
hold of the server: connections (one agent, plus one more during a restart), subscriptions, payload size.

Everything else does not exist for the host: other hosts' subjects (their logs included), other consumers,
creating or deleting consumers and streams, the operator API, the event stream, and reading the logs stream
(its own output included: only operators read it), the uploads stream and the artifacts bucket.

The subject names come from the protocol library (`devsched.protocol.subjects`), so it runs where devsched-protocol is
installed: `uv run python deploy/nats/host_user.py ...` in a checkout, or after `pip install devsched-protocol`.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence

try:
    from devsched.protocol.connection import host_inbox_prefix
    from devsched.protocol.subjects import DEFAULT_PREFIX, HostVerb, Subjects
except ImportError as exc:  # pragma: no cover - a Python without devsched
    raise SystemExit(
        f"host_user.py needs devsched-protocol ({exc}): run `uv run python deploy/nats/host_user.py ...` in a "
        "checkout, or `pip install devsched-protocol` first"
    ) from None

#: The account of the services and the streams, which exports the host subjects (accounts.conf).
DEFAULT_SERVICE_ACCOUNT = "DEVSCHED"
#: Per-host limits: one agent connection plus one while a restarted agent replaces it; an agent holds a
#: handful of subscriptions; payloads as large as the NATS server's own default (1 MiB), so an oversized
#: report is answered 413 by the scheduler rather than cutting the host's connection.
HOST_LIMITS = {"max_connections": 2, "max_subscriptions": 64, "max_payload": 1048576}
#: A single NATS subject token: the prefix and host ids (the same rule as devsched.core.ids).
TOKEN_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
#: Written into the password field when no hash is given: a bcrypt-looking value that matches no
#: password, so a block pasted without a real hash fails closed (the host cannot log in).
PLACEHOLDER_HASH = "$2a$11$REPLACE.WITH.THE.BCRYPT.HASH.OF.THIS.HOSTS.PASSWORD"

_TOKEN = re.compile(TOKEN_PATTERN)


def _token(what: str, value: str) -> str:
    if not _TOKEN.fullmatch(value):
        raise ValueError(f"{what} must be 1 to 64 of A-Z a-z 0-9 _ -, got {value!r}")
    return value


def stream_prefix(prefix: str) -> str:
    """`<PU>`: the prefix upper-cased with `-` turned into `_` (PROTOCOL.md)."""
    return prefix.upper().replace("-", "_")


def default_user(host_id: str, prefix: str = DEFAULT_PREFIX) -> str:
    """`host-<id>`; with another prefix `<prefix>-host-<id>`, so two deployments can share an account."""
    return f"host-{host_id}" if prefix == DEFAULT_PREFIX else f"{prefix}-host-{host_id}"


def account_name(host_id: str, prefix: str = DEFAULT_PREFIX) -> str:
    """`HOST_<id>`; with another prefix `<PU>_HOST_<id>`, so two deployments can share a server."""
    return f"HOST_{host_id}" if prefix == DEFAULT_PREFIX else f"{stream_prefix(prefix)}_HOST_{host_id}"


def jetstream_api(prefix: str = DEFAULT_PREFIX) -> str:
    """`P.js.API`: where a host's account maps the JetStream API subjects it imports.

    Not `$JS.API` itself: an account without JetStream answers `$JS.API.>` with 503 ("JetStream not
    enabled") before the import's answer arrives. The agent sends there (`jetstream_api_prefix`).
    """
    return f"{prefix}.js.API"


def log_subjects(host_id: str, prefix: str = DEFAULT_PREFIX) -> str:
    """`P.host.<id>.log.>`: where the host's agent publishes its attempts' step output (into `<PU>_LOGS`)."""
    return f"{prefix}.host.{host_id}.log.>"


def upload_subjects(host_id: str, prefix: str = DEFAULT_PREFIX) -> str:
    """`P.host.<id>.upload.>`: where the host's agent publishes artifact chunks (into `<PU>_UPLOADS`)."""
    return f"{prefix}.host.{host_id}.upload.>"


def host_requests(host_id: str, prefix: str = DEFAULT_PREFIX) -> str:
    """`P.host.<id>.*`: every request verb of this host, those of the protocol's table and any added later.

    One wildcard in the verb's place, the host id pinned: a new host endpoint reaches the scheduler without
    regenerating any host's block, and the host still reaches no other host's subjects. The one subject of
    that shape a host must not send to, its nudge, is denied (`host_denied`).
    """
    return f"{_token('prefix', prefix)}.host.{_token('host id', host_id)}.*"


def host_denied(host_id: str, prefix: str = DEFAULT_PREFIX) -> list[str]:
    """What the host may not publish although `host_requests` covers it: its nudge (the scheduler's to send)."""
    return [Subjects(_token("prefix", prefix)).host(_token("host id", host_id), HostVerb.NUDGE)]


def host_imports(host_id: str, prefix: str = DEFAULT_PREFIX) -> list[tuple[str, str, str]]:
    """What the host's account imports from the devsched account: (kind, exported subject, local subject)."""
    _token("host id", host_id)
    _token("prefix", prefix)
    stream = f"{stream_prefix(prefix)}_ASSIGNMENTS"
    consumer = f"host-{host_id}"
    imports = [("service", host_requests(host_id, prefix), "")]
    for api in ("CONSUMER.INFO", "CONSUMER.MSG.NEXT"):
        imports.append(
            ("service", f"$JS.API.{api}.{stream}.{consumer}", f"{jetstream_api(prefix)}.{api}.{stream}.{consumer}")
        )
    imports.append(("service", f"$JS.ACK.{stream}.{consumer}.>", ""))
    imports.append(("service", log_subjects(host_id, prefix), ""))
    imports.append(("service", upload_subjects(host_id, prefix), ""))
    imports.append(("stream", f"{prefix}.host.{host_id}.nudge", ""))
    return imports


def host_permissions(host_id: str, prefix: str = DEFAULT_PREFIX) -> dict[str, list[str]]:
    """The subjects a host may publish to (`publish`, less `publish_deny`) and subscribe to (`subscribe`).

    Raises:
        ValueError: the host id or prefix is not a single subject token (a `*`, `>` or `.` would widen
            every subject below to other hosts).
    """
    _token("host id", host_id)
    _token("prefix", prefix)
    stream = f"{stream_prefix(prefix)}_ASSIGNMENTS"
    consumer = f"host-{host_id}"
    publish = [
        host_requests(host_id, prefix),
        f"{jetstream_api(prefix)}.CONSUMER.INFO.{stream}.{consumer}",
        f"{jetstream_api(prefix)}.CONSUMER.MSG.NEXT.{stream}.{consumer}",
        f"$JS.ACK.{stream}.{consumer}.>",
        log_subjects(host_id, prefix),
        upload_subjects(host_id, prefix),
    ]
    subscribe = [f"{prefix}.host.{host_id}.nudge", f"{host_inbox_prefix(host_id)}.>"]
    return {"publish": publish, "publish_deny": host_denied(host_id, prefix), "subscribe": subscribe}


def _quoted_list(items: Sequence[str], indent: str) -> str:
    return "\n".join(f'{indent}"{item}"' for item in items)


def render(
    host_id: str,
    prefix: str = DEFAULT_PREFIX,
    user: str | None = None,
    password_hash: str | None = None,
    service_account: str = DEFAULT_SERVICE_ACCOUNT,
) -> str:
    """The host's account block, in NATS configuration syntax, with BEGIN/END markers around it.

    Raises:
        ValueError: an invalid host id, prefix, user name, account name or password hash.
    """
    permissions = host_permissions(host_id, prefix)
    imports = host_imports(host_id, prefix)
    user = _token("user", user) if user is not None else default_user(host_id, prefix)
    service_account = _token("account", service_account)
    if password_hash is None:
        password_hash = PLACEHOLDER_HASH
    elif not password_hash.startswith("$2") or '"' in password_hash or "\\" in password_hash:
        raise ValueError("the password hash must be a bcrypt hash ($2a$/$2b$...), e.g. from `nats server passwd`")
    limits = ", ".join(f"{key}: {value}" for key, value in HOST_LIMITS.items())
    return "\n".join(
        [
            f"# BEGIN {user}: generated by deploy/nats/host_user.py {host_id} --prefix {prefix}; do not edit by hand",
            f"{account_name(host_id, prefix)}: {{",
            f"  limits: {{ {limits} }}",
            "  users: [",
            "    {",
            f'      user: "{user}"',
            f'      password: "{password_hash}"',
            "      permissions: {",
            "        publish: {",
            "          allow: [",
            _quoted_list(permissions["publish"], "            "),
            "          ]",
            "          deny: [",
            _quoted_list(permissions["publish_deny"], "            "),
            "          ]",
            "        }",
            "        subscribe: {",
            "          allow: [",
            _quoted_list(permissions["subscribe"], "            "),
            "          ]",
            "        }",
            "      }",
            "    }",
            "  ]",
            "  imports: [",
            *(
                f'    {{ {kind}: {{ account: {service_account}, subject: "{subject}" }}'
                + (f', to: "{local}"' if local else "")
                + " }"
                for kind, subject, local in imports
            ),
            "  ]",
            "}",
            f"# END {user}",
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Print the block for the host named on the command line; exit 2 on invalid input."""
    parser = argparse.ArgumentParser(
        prog="host_user.py",
        description="Print the NATS account block that confines one devsched host to its own subjects.",
    )
    parser.add_argument("host_id", help="the agent's host_id (agent.toml)")
    parser.add_argument("--prefix", default=DEFAULT_PREFIX, help="DEVSCHED_SUBJECT_PREFIX of the deployment")
    parser.add_argument("--user", default=None, help="NATS user name (default: host-<host_id>)")
    parser.add_argument(
        "--account",
        default=DEFAULT_SERVICE_ACCOUNT,
        help="the account of the services and streams, which exports the host subjects (default: DEVSCHED)",
    )
    parser.add_argument(
        "--password-hash",
        default=None,
        help="bcrypt hash of the host's password (`nats server passwd`); default: a placeholder that never matches",
    )
    options = parser.parse_args(argv)
    try:
        block = render(options.host_id, options.prefix, options.user, options.password_hash, options.account)
    except ValueError as exc:
        parser.error(str(exc))
    sys.stdout.write(block + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
