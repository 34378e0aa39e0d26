"""A private PostgreSQL cluster for tests and for ``make postgres-up``: never a running service.

``initdb`` makes a cluster in a directory of its own (trust authentication, one
superuser ``mqttbed``), ``pg_ctl`` starts it listening on loopback at a free port and on a
unix socket inside that directory, and stopping it (``pg_ctl stop``, then a kill of the
postmaster's process group should that fail) leaves no process behind. As root (CI, this
machine) every PostgreSQL program runs as the ``postgres`` OS user, since ``initdb``
refuses root; the binaries and that user come from Debian's ``postgresql`` package
(``scripts/system-deps.sh``).

As a program: ``python -m tests.postgres_cluster up --dir DIR`` starts (or restarts) a
cluster in DIR and prints its URL for ``MQTTBED_DATABASE_URL``; ``down --dir DIR`` stops it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SUPERUSER = "mqttbed"
OS_USER = "postgres"  # who runs the server when we are root


def postgres_bindir() -> Path:
    """The directory of ``initdb`` and ``pg_ctl``: Debian keeps them out of PATH, under
    /usr/lib/postgresql/VERSION/bin (the newest installed is taken), else PATH's."""
    versions = sorted((p for p in Path("/usr/lib/postgresql").glob("*/bin/initdb")
                       if p.parent.parent.name.isdigit()),
                      key=lambda p: int(p.parent.parent.name))
    if versions:
        return versions[-1].parent
    found = shutil.which("initdb")
    if found is None:
        raise RuntimeError("no PostgreSQL server here (initdb not found): install Debian's "
                           "postgresql package (scripts/system-deps.sh does)")
    return Path(found).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresCluster:
    """One PostgreSQL server on 127.0.0.1:``port`` with its data and socket in ``root``."""

    def __init__(self, root: Path, port: int | None = None):
        self.root = root
        self.data = root / "data"
        self.socket_dir = root / "socket"
        self.log = root / "postgres.log"
        self.port = port if port is not None else _free_port()
        self.bindir = postgres_bindir()
        self._as_postgres = os.geteuid() == 0

    # -- the server's life ----------------------------------------------------------------

    def _run(self, *argv: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
        """A PostgreSQL program, as the ``postgres`` user when we are root."""
        extra: dict = {}
        if self._as_postgres:
            extra = {"user": OS_USER, "group": OS_USER, "extra_groups": []}
        return subprocess.run([str(self.bindir / argv[0]), *argv[1:]], cwd=self.root,
                              capture_output=True, text=True, timeout=timeout_s,
                              env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                                   "LC_ALL": "C.UTF-8"}, check=False, **extra)

    def _checked(self, *argv: str, timeout_s: float = 60) -> str:
        done = self._run(*argv, timeout_s=timeout_s)
        if done.returncode != 0:
            log = self.log.read_text()[-3000:] if self.log.exists() else ""
            raise RuntimeError(f"{' '.join(argv[:2])} failed ({done.returncode}): "
                               f"{done.stdout[-2000:]}{done.stderr[-2000:]}\n{log}")
        return done.stdout

    def init(self) -> None:
        """``initdb`` the cluster (once): trust on loopback and the socket, superuser
        ``mqttbed``."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.socket_dir.mkdir(exist_ok=True)
        if self._as_postgres:
            user = pwd.getpwnam(OS_USER)
            for path in (self.root, self.socket_dir):
                os.chown(path, user.pw_uid, user.pw_gid)
            self.root.chmod(0o700)
        if not (self.data / "PG_VERSION").exists():
            self._checked("initdb", "-D", str(self.data), "-U", SUPERUSER, "--auth=trust",
                          "-E", "UTF8", "--no-sync", "--no-instructions")

    def start(self) -> None:
        """Start the server and wait until it accepts connections. No fsync: a test
        cluster, which a crash of this machine may lose (a server restart loses nothing)."""
        options = (f"-p {self.port} -k {self.socket_dir} -c listen_addresses=127.0.0.1 "
                   "-c fsync=off -c synchronous_commit=off -c full_page_writes=off "
                   "-c max_connections=100 -c shared_buffers=32MB "
                   # not UTC, so that the tests see times come back in UTC all the same
                   "-c timezone=Asia/Kolkata")
        self._checked("pg_ctl", "start", "-D", str(self.data), "-l", str(self.log), "-w",
                      "-t", "60", "-o", options)

    def restart(self) -> None:
        """Stop the server as an administrator would (``-m fast``: every session is
        terminated, open transactions rolled back) and start it again on the same port."""
        self._checked("pg_ctl", "restart", "-D", str(self.data), "-l", str(self.log), "-m",
                      "fast", "-w", "-t", "60")

    def stop(self) -> None:
        """Stop the server; whatever of it is left is killed."""
        pid = self.postmaster_pid()
        if pid is None:
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._run("pg_ctl", "stop", "-D", str(self.data), "-m", "fast", "-w", "-t", "20",
                      timeout_s=30)
        if self.postmaster_pid() is not None or _alive(pid):
            # pg_ctl detaches the postmaster into a session of its own: its group is it
            # and every backend
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)

    def postmaster_pid(self) -> int | None:
        """The running postmaster's pid (from ``postmaster.pid``), or None."""
        try:
            pid = int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        return pid if _alive(pid) else None

    def remove(self) -> None:
        """Stop the server and delete its directory."""
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    # -- databases ------------------------------------------------------------------------

    def url(self, database: str = "postgres") -> str:
        """The SQLAlchemy URL of ``database`` over TCP (``MQTTBED_DATABASE_URL``)."""
        return f"postgresql+psycopg://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str | None = None) -> str:
        """A new empty database; its URL."""
        import psycopg

        name = name or f"t_{secrets.token_hex(6)}"
        with psycopg.connect(host="127.0.0.1", port=self.port, user=SUPERUSER,
                             dbname="postgres", autocommit=True) as conn:
            # a file copy of template1 (a checkpoint, cheap without fsync) takes half the time
            # of PostgreSQL 15's default WAL-logged copy
            conn.execute(f'CREATE DATABASE "{name}" STRATEGY FILE_COPY')
        return self.url(name)

    def drop_database(self, name: str) -> None:
        """Drop ``name``, ending any session still connected to it."""
        import psycopg

        with psycopg.connect(host="127.0.0.1", port=self.port, user=SUPERUSER,
                             dbname="postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def terminate_backend(self, pid: int) -> None:
        """End one server session as an administrator would (``pg_terminate_backend``)."""
        import psycopg

        with psycopg.connect(host="127.0.0.1", port=self.port, user=SUPERUSER,
                             dbname="postgres", autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))

    def version(self) -> str:
        """``server_version`` as the running server reports it."""
        import psycopg

        with psycopg.connect(host="127.0.0.1", port=self.port, user=SUPERUSER,
                             dbname="postgres") as conn:
            row = conn.execute("SHOW server_version").fetchone()
        assert row is not None
        return str(row[0])


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


PREFIX = "mqttbed-postgres-"
OWNER_FILE = "owner.pid"  # the pid of the process a temporary cluster belongs to


def temporary_cluster() -> PostgresCluster:
    """A started cluster in a new directory under the system temp dir (the pytest temp
    dirs are private to root, where the ``postgres`` user could not reach its files).
    Clusters a killed test session left behind are stopped and deleted first."""
    reap_stale_clusters()
    cluster = PostgresCluster(Path(tempfile.mkdtemp(prefix=PREFIX)))
    (cluster.root / OWNER_FILE).write_text(f"{os.getpid()}\n")
    try:
        cluster.init()
        cluster.start()
    except BaseException:
        cluster.remove()
        raise
    return cluster


def reap_stale_clusters() -> list[Path]:
    """Stop and delete the temporary clusters whose owning process is gone; return them."""
    reaped = []
    for root in Path(tempfile.gettempdir()).glob(f"{PREFIX}*"):
        try:
            owner = int((root / OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue  # not one of ours, or still being made
        if not _alive(owner):
            PostgresCluster(root, port=0).remove()
            reaped.append(root)
    return reaped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.postgres_cluster",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["up", "down"])
    parser.add_argument("--dir", type=Path, default=Path("data/postgres"))
    parser.add_argument("--port", type=int, default=5433)
    args = parser.parse_args(argv)
    cluster = PostgresCluster(args.dir.resolve(), args.port)
    if args.action == "down":
        cluster.stop()
        print(f"PostgreSQL in {cluster.root} stopped")
        return 0
    cluster.init()
    if cluster.postmaster_pid() is None:
        cluster.start()
    url = cluster.url("mqttbed")
    with contextlib.suppress(Exception):  # it exists after the first `up`
        cluster.create_database("mqttbed")
    print(f"PostgreSQL {cluster.version()} in {cluster.root} on 127.0.0.1:{cluster.port}\n"
          f"export MQTTBED_DATABASE_URL={url}\nstop it with: make postgres-down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
