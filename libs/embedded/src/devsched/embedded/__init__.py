"""devsched.embedded: real nats-server and PostgreSQL processes from pip-installed binaries.

Used by the test fixtures and by `devsched up`, so that neither needs Docker or a system install. Its
`ChildProcess` (devsched.embedded.supervisor) runs every child process of ours: these servers, the
services of `devsched up` and the processes tests start.
"""

from devsched.embedded.nats_cluster import NatsCluster
from devsched.embedded.nats_server import ClusterSpec, NatsServer, jetstream_ready, nats_server_binary
from devsched.embedded.postgres_server import PostgresServer, postgres_bin_dir, postgres_ready
from devsched.embedded.server import ServerProcess, free_port
from devsched.embedded.supervisor import ChildProcess, EmbeddedServerError, exit_on_sigterm, stop_all, wait_until

__all__ = [
    "ChildProcess",
    "ClusterSpec",
    "EmbeddedServerError",
    "NatsCluster",
    "NatsServer",
    "PostgresServer",
    "ServerProcess",
    "exit_on_sigterm",
    "free_port",
    "jetstream_ready",
    "nats_server_binary",
    "postgres_bin_dir",
    "postgres_ready",
    "stop_all",
    "wait_until",
]
