"""The run's PostgreSQL: a private cluster on 127.0.0.1:5432, the address
the docs name, started for the run and stopped after it."""

from __future__ import annotations

import glob
import os
import subprocess

from shell import BASE, Failure

PORT = 5432


def pg_bin() -> str:
    found = (
        os.environ.get("BATON_PG_BIN")
        or (sorted(glob.glob("/usr/lib/postgresql/*/bin"))[-1:] or [""])[0]
    )
    if not found or not os.access(os.path.join(found, "initdb"), os.X_OK):
        raise Failure(
            "PostgreSQL's server binaries are missing (Debian: postgresql; or set BATON_PG_BIN); "
            "scripts/test installs them as root"
        )
    return found


def as_postgres(argv: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *argv] if os.getuid() == 0 else argv


class Cluster:
    def __init__(self) -> None:
        self.bin = pg_bin()
        self.dir = os.path.join(BASE, "pg")
        self.data = os.path.join(self.dir, "data")

    def start(self) -> None:
        subprocess.run(["rm", "-rf", self.dir], check=True)
        os.makedirs(self.dir)
        if os.getuid() == 0:
            subprocess.run(["chown", "postgres", self.dir], check=True)
        self._pg(
            [
                "initdb",
                "-D",
                self.data,
                "-A",
                "trust",
                "-U",
                "postgres",
                "--no-sync",
                "-E",
                "UTF8",
                "--locale=C",
            ]
        )
        self._pg(
            [
                "pg_ctl",
                "-D",
                self.data,
                "-l",
                os.path.join(self.dir, "log"),
                "-w",
                "start",
                "-o",
                f"-p {PORT} -c listen_addresses=127.0.0.1 -k {self.dir} -c fsync=off",
            ]
        )

    def stop(self) -> None:
        if os.path.exists(os.path.join(self.data, "postmaster.pid")):
            self._pg(["pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop"])

    def drop_databases(self) -> None:
        """What one file's blocks created, dropped before the next file."""
        names = self.query(
            "SELECT datname FROM pg_database "
            "WHERE datname NOT IN ('postgres', 'template0', 'template1')"
        )
        for name in names.split():
            self.query(f'DROP DATABASE "{name}" WITH (FORCE)')

    def query(self, sql: str, db: str = "postgres") -> str:
        return self.psql(["-qAt", "-c", sql], db)

    def psql(self, args: list[str], db: str) -> str:
        """psql on `db` with `args`, stopping at the first error."""
        argv = ["psql", "-h", "127.0.0.1", "-p", str(PORT), "-U", "postgres", "-d", db, "-X"]
        argv += ["-v", "ON_ERROR_STOP=1", *args]
        out = subprocess.run(argv, check=False, capture_output=True, text=True)
        if out.returncode != 0:
            raise Failure(f"psql {' '.join(args)}: {out.stderr.strip()}")
        return out.stdout.strip()

    def _pg(self, argv: list[str]) -> None:
        argv[0] = os.path.join(self.bin, argv[0])
        out = subprocess.run(as_postgres(argv), check=False, capture_output=True, text=True)
        if out.returncode != 0:
            raise Failure(f"{' '.join(argv)}: {out.stderr.strip() or out.stdout.strip()}")
