"""devsched.embedded: real nats-server and PostgreSQL processes from pip-installed binaries.

Used by the test fixtures and by `devsched up`, so that neither needs Docker or a system install.
"""

from devsched.embedded.nats_server import NatsServer, jetstream_ready, nats_server_binary
from devsched.embedded.postgres_server import PostgresServer, postgres_bin_dir, postgres_ready
from devsched.embedded.process import EmbeddedServerError, free_port, parent_death_hook, wait_until

__all__ = [
    "EmbeddedServerError",
    "NatsServer",
    "PostgresServer",
    "free_port",
    "jetstream_ready",
    "nats_server_binary",
    "parent_death_hook",
    "postgres_bin_dir",
    "postgres_ready",
    "wait_until",
]
