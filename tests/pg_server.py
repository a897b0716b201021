"""A throwaway PostgreSQL server for the tests and benchmarks: Debian's binaries, a temp directory, a Unix socket.

    server = PgServer.start()          # initdb + pg_ctl start, as an unprivileged user when we are root
    url = server.new_database()        # postgresql://evermind:<password>@/db_3?host=/tmp/...&port=...
    server.kill()                      # kill -9 of the postmaster (a crash); server.restart() brings it back
    server.stop()                      # pg_ctl stop -m immediate, and the directory goes

The server listens on a Unix socket in its own directory only (no TCP port) and asks for a password
(scram-sha-256), so the URLs the tests use carry a credential that must never show in a log, an error or a repr.
`find_bin()` names the binaries' directory, or None: the tests then skip with that reason (CI installs the
`postgresql` package first, see .ci/run).
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

PG_USER = "evermind"  # the superuser inside the throwaway cluster
RUN_AS = ("postgres", "nobody")  # the system user that runs the server when we are root (first that exists)


def find_bin() -> Path | None:
    """The directory holding initdb, pg_ctl and postgres: $EVERMIND_PG_BIN, Debian's newest
    /usr/lib/postgresql/N/bin, or the one beside a `pg_ctl` on PATH."""
    candidates = [os.environ.get("EVERMIND_PG_BIN", "")]
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name)
                         if Path(p).parent.name.isdigit() else 0, reverse=True)
    on_path = shutil.which("pg_ctl")
    if on_path:
        candidates.append(str(Path(on_path).resolve().parent))
    for c in candidates:
        if c and all((Path(c) / tool).is_file() for tool in ("initdb", "pg_ctl", "postgres")):
            return Path(c)
    return None


def _user() -> pwd.struct_passwd | None:
    """The unprivileged user to run the server as (None: we are not root, run as ourselves)."""
    if os.geteuid() != 0:
        return None
    for name in RUN_AS:
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise RuntimeError(f"running as root and none of the users {RUN_AS} exists to run PostgreSQL as")


class PgServer:
    """One running throwaway cluster (see the module docstring)."""

    def __init__(self, bin_dir: Path, root: Path, user: pwd.struct_passwd | None, password: str) -> None:
        self.bin = bin_dir
        self.root = root
        self.data = root / "data"
        self.socket_dir = root / "sock"
        self.user = user
        self.password = password
        self.port = 5432  # the socket's name only (.s.PGSQL.5432 in our own directory): no TCP listener
        self._databases = 0
        self._made: set[str] = set()

    # ---- life ---------------------------------------------------------------------------------------------
    @classmethod
    def start(cls, bin_dir: Path | None = None) -> "PgServer":
        """initdb a new cluster in a temp directory and start it.

        Raises:
            RuntimeError: no binaries, or the server would not start (its log is in the message).
        """
        bin_dir = bin_dir or find_bin()
        if bin_dir is None:
            raise RuntimeError("no PostgreSQL binaries found (apt-get install postgresql)")
        user = _user()
        root = Path(tempfile.mkdtemp(prefix="evpg-", dir="/tmp"))  # short: a socket path has ~100 bytes
        server = cls(bin_dir, root, user, secrets.token_urlsafe(18))
        server.socket_dir.mkdir()
        pwfile = root / "pw"
        pwfile.write_text(server.password + "\n")
        if user is not None:
            os.chmod(root, 0o755)
            for p in (root, server.socket_dir, pwfile):
                os.chown(p, user.pw_uid, user.pw_gid)
        locale = ("C.UTF-8" if Path("/usr/lib/locale/C.utf8").exists() or Path("/usr/lib/locale/C.UTF-8").exists()
                  else "C")
        server._run([str(bin_dir / "initdb"), "-D", str(server.data), "-U", PG_USER, "--pwfile", str(pwfile),
                     "-A", "scram-sha-256", "-E", "UTF8", f"--locale={locale}", "--no-sync"])
        pwfile.unlink()
        server._start()
        return server

    def _run(self, argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
        if self.user is not None:
            argv = ["setpriv", f"--reuid={self.user.pw_uid}", f"--regid={self.user.pw_gid}", "--clear-groups", *argv]
        out = subprocess.run(argv, capture_output=True, text=True, cwd=self.root)
        if check and out.returncode != 0:
            raise RuntimeError(f"{argv[-1] if argv else ''} failed ({out.returncode}): {out.stderr[-2000:]}")
        return out

    def _start(self) -> None:
        opts = (f"-c listen_addresses='' -k {self.socket_dir} -p {self.port} -c fsync=off -c full_page_writes=off "
                "-c max_connections=200 -c shared_buffers=64MB")
        out = self._run([str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "log"), "-o", opts,
                         "-w", "-t", "60", "start"], check=False)
        if out.returncode != 0:
            log = (self.root / "log").read_text(errors="replace")[-2000:] if (self.root / "log").exists() else ""
            raise RuntimeError(f"pg_ctl start failed: {out.stderr[-1000:]} {log}")

    def pid(self) -> int:
        """The postmaster's pid."""
        return int((self.data / "postmaster.pid").read_text().split()[0])

    def kill(self) -> None:
        """kill -9 of the postmaster and every backend: a crash (the next start recovers from the WAL)."""
        pid = self.pid()
        kids = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
        for p in [pid, *map(int, kids)]:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
            time.sleep(0.05)

    def restart(self) -> None:
        """Start the server again after kill() (crash recovery runs first)."""
        self._start()

    def stop(self) -> None:
        """Stop the server at once and delete its directory."""
        try:
            self._run([str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop"], check=False)
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    # ---- databases ----------------------------------------------------------------------------------------
    def url(self, database: str = "postgres", *, password: str | None = None) -> str:
        """A libpq URL to `database` over the socket (with the password, or `password` instead)."""
        pw = quote(self.password if password is None else password, safe="")
        return f"postgresql://{PG_USER}:{pw}@/{database}?host={quote(str(self.socket_dir), safe='')}&port={self.port}"

    def new_schema(self, database: str = "evermind_tests") -> str:
        """A fresh schema in `database` (created on first use): the URL of a store of its own (search_path)."""
        import psycopg

        if database not in self._made:
            with psycopg.connect(self.url(), autocommit=True) as conn:
                if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone() is None:
                    conn.execute(f'CREATE DATABASE "{database}"')  # (our own fixed name)
            self._made.add(database)
        self._databases += 1
        name = f"s{os.getpid()}_{self._databases}"
        with psycopg.connect(self.url(database), autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{name}"')  # (our own generated name)
        return self.url(database) + "&options=" + quote(f"-csearch_path={name}", safe="")

    def new_database(self, name: str | None = None) -> str:
        """Create a fresh database and return its URL."""
        import psycopg

        self._databases += 1
        name = name or f"db_{os.getpid()}_{self._databases}_{secrets.token_hex(3)}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')  # (our own generated name, not input)
        return self.url(name)
