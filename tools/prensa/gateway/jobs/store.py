"""Where bulk jobs live: uploaded files on disk and jobs, their progress and each line's answer in
SQLite, in `--data-dir`, so that a job survives the gateway's death and resumes where it stopped.

A line's answer is kept in the database as soon as it is known (one row per line, keyed by the
job and the line's number), and the output and error files are written from those rows once every
line has one: written to a temporary file and renamed, so no crash leaves a half file, and a line
run twice (its answer lost with a killed process) is kept once. A job is run by the gateway that
holds its lease; a lease not renewed in time (its holder died) is taken over. The model version
each name of a job reached at its first line is kept too (`pin`): every line of the job is
answered by that version, through restarts, however the name moves meanwhile.
"""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DATABASE = "jobs.sqlite"
FILES = "files"
LEASE_S = 30.0  # a job whose holder has not renewed its lease for this long is taken over

SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    id TEXT PRIMARY KEY, purpose TEXT NOT NULL, filename TEXT NOT NULL, bytes INTEGER NOT NULL,
    created_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, endpoint TEXT NOT NULL, input_file_id TEXT NOT NULL,
    completion_window TEXT NOT NULL, status TEXT NOT NULL, created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL, stamps TEXT NOT NULL DEFAULT '{}', total INTEGER NOT NULL DEFAULT 0,
    output_file_id TEXT, error_file_id TEXT, errors TEXT, metadata TEXT,
    holder TEXT, lease_until REAL NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS job_models (
    job_id TEXT NOT NULL, name TEXT NOT NULL, model TEXT NOT NULL, PRIMARY KEY (job_id, name)
);
CREATE TABLE IF NOT EXISTS answers (
    job_id TEXT NOT NULL, line INTEGER NOT NULL, custom_id TEXT NOT NULL, status_code INTEGER NOT NULL,
    body TEXT NOT NULL, PRIMARY KEY (job_id, line)
);
"""

# A job's statuses, as OpenAI's batch objects carry them.
VALIDATING, IN_PROGRESS, FINALIZING, COMPLETED = (
    "validating",
    "in_progress",
    "finalizing",
    "completed",
)
FAILED, CANCELLING, CANCELLED, EXPIRED = "failed", "cancelling", "cancelled", "expired"
OPEN = (VALIDATING, IN_PROGRESS, FINALIZING, CANCELLING)  # a gateway still has work on these


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


@dataclass(frozen=True)
class StoredFile:
    id: str
    purpose: str
    filename: str
    bytes: int
    created_at: int


@dataclass(frozen=True)
class Job:
    """One batch job as stored; `stamps` holds the times of its statuses (`in_progress_at`, ...)."""

    id: str
    endpoint: str
    input_file_id: str
    completion_window: str
    status: str
    created_at: int
    expires_at: int
    stamps: dict[str, int]
    total: int
    completed: int
    failed: int
    output_file_id: str | None
    error_file_id: str | None
    errors: list[dict[str, Any]] | None
    metadata: dict[str, str] | None
    models: dict[str, str]  # each model name its lines ask for -> the version pinned


class JobStore:
    """The files and jobs of one data directory; each call opens its own connection (SQLite's WAL
    lets several gateway processes read and write the same file)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / FILES).mkdir(parents=True, exist_ok=True)
        self.database = root / DATABASE
        with self._connection() as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.executescript(SCHEMA)

    @contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection]:
        with closing(sqlite3.connect(self.database, timeout=30, isolation_level=None)) as db:
            db.row_factory = sqlite3.Row
            yield db

    # files

    def path(self, file_id: str) -> Path:
        return self.root / FILES / file_id

    def add_file(self, staged: Path, purpose: str, filename: str) -> StoredFile:
        """`staged` (a file already on this disk) kept as a new file; renamed into place first, so a
        file listed is whole."""
        stored = StoredFile(
            new_id("file"), purpose, filename, staged.stat().st_size, int(time.time())
        )
        os.replace(staged, self.path(stored.id))
        with self._connection() as db:
            db.execute(
                "INSERT INTO files VALUES (?, ?, ?, ?, ?)",
                (stored.id, purpose, filename, stored.bytes, stored.created_at),
            )
        return stored

    def staging(self) -> Path:
        """A new temporary path beside the files, for a file being written."""
        return self.root / FILES / f".{new_id('upload')}.tmp"

    def file(self, file_id: str) -> StoredFile | None:
        with self._connection() as db:
            row = db.execute("SELECT * FROM files WHERE id = ?", (file_id,)).fetchone()
        return StoredFile(**dict(row)) if row else None

    def files(self) -> list[StoredFile]:
        with self._connection() as db:
            rows = db.execute("SELECT * FROM files ORDER BY created_at DESC, id").fetchall()
        return [StoredFile(**dict(row)) for row in rows]

    def delete_file(self, file_id: str) -> bool:
        with self._connection() as db:
            deleted = db.execute("DELETE FROM files WHERE id = ?", (file_id,)).rowcount
        self.path(file_id).unlink(missing_ok=True)
        return bool(deleted)

    # jobs

    def add_job(
        self,
        endpoint: str,
        input_file_id: str,
        window_s: int,
        window: str,
        metadata: dict[str, str] | None,
    ) -> Job:
        now = int(time.time())
        job_id = new_id("batch")
        with self._connection() as db:
            db.execute(
                "INSERT INTO jobs (id, endpoint, input_file_id, completion_window, status, created_at, "
                "expires_at, metadata) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    job_id,
                    endpoint,
                    input_file_id,
                    window,
                    VALIDATING,
                    now,
                    now + window_s,
                    json.dumps(metadata) if metadata else None,
                ),
            )
        job = self.job(job_id)
        assert job is not None
        return job

    def _job(self, db: sqlite3.Connection, row: sqlite3.Row) -> Job:
        counts = db.execute(
            "SELECT SUM(status_code < 400), SUM(status_code >= 400) FROM answers WHERE job_id = ?",
            (row["id"],),
        ).fetchone()
        models = db.execute("SELECT name, model FROM job_models WHERE job_id = ?", (row["id"],))
        return Job(
            row["id"],
            row["endpoint"],
            row["input_file_id"],
            row["completion_window"],
            row["status"],
            row["created_at"],
            row["expires_at"],
            json.loads(row["stamps"]),
            row["total"],
            counts[0] or 0,
            counts[1] or 0,
            row["output_file_id"],
            row["error_file_id"],
            json.loads(row["errors"]) if row["errors"] else None,
            json.loads(row["metadata"]) if row["metadata"] else None,
            dict(models.fetchall()),
        )

    def job(self, job_id: str) -> Job | None:
        with self._connection() as db:
            row = db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
            return self._job(db, row) if row else None

    def jobs(self) -> list[Job]:
        with self._connection() as db:
            rows = db.execute("SELECT * FROM jobs ORDER BY created_at DESC, id").fetchall()
            return [self._job(db, row) for row in rows]

    def move(self, job_id: str, status: str, **fields: Any) -> None:
        """The job to `status`, stamping when (`<status>_at`), with other columns set."""
        now = int(time.time())
        with self._connection() as db:
            db.execute("BEGIN IMMEDIATE")
            row = db.execute("SELECT stamps FROM jobs WHERE id = ?", (job_id,)).fetchone()
            stamps = {**json.loads(row["stamps"]), f"{status}_at": now}
            columns = {"status": status, "stamps": json.dumps(stamps), **fields}
            assignments = ", ".join(f"{name} = ?" for name in columns)
            db.execute(f"UPDATE jobs SET {assignments} WHERE id = ?", (*columns.values(), job_id))
            db.execute("COMMIT")

    def claim(self, holder: str) -> Job | None:
        """An open job no live gateway holds, leased to `holder` (the oldest first)."""
        now = time.time()
        with self._connection() as db:
            db.execute("BEGIN IMMEDIATE")
            row = db.execute(
                f"SELECT * FROM jobs WHERE status IN ({','.join('?' * len(OPEN))}) "
                "AND (holder IS NULL OR holder = ? OR lease_until < ?) ORDER BY created_at LIMIT 1",
                (*OPEN, holder, now),
            ).fetchone()
            if row is None:
                db.execute("COMMIT")
                return None
            db.execute(
                "UPDATE jobs SET holder = ?, lease_until = ? WHERE id = ?",
                (holder, now + LEASE_S, row["id"]),
            )
            db.execute("COMMIT")
            return self._job(db, row)

    def renew(self, job_id: str, holder: str) -> bool:
        """The lease extended; False when another gateway took the job over."""
        with self._connection() as db:
            return bool(
                db.execute(
                    "UPDATE jobs SET lease_until = ? WHERE id = ? AND holder = ?",
                    (time.time() + LEASE_S, job_id, holder),
                ).rowcount
            )

    def release(self, job_id: str, holder: str) -> None:
        with self._connection() as db:
            db.execute(
                "UPDATE jobs SET holder = NULL, lease_until = 0 WHERE id = ? AND holder = ?",
                (job_id, holder),
            )

    def pin(self, job_id: str, name: str, model: str) -> str:
        """The version `name` reaches for `job_id`: `model` unless one was pinned already (by this
        gateway before a restart, or by another)."""
        with self._connection() as db:
            db.execute("INSERT OR IGNORE INTO job_models VALUES (?, ?, ?)", (job_id, name, model))
            row = db.execute(
                "SELECT model FROM job_models WHERE job_id = ? AND name = ?", (job_id, name)
            ).fetchone()
        return str(row[0])

    # answers

    def answered(self, job_id: str) -> set[int]:
        with self._connection() as db:
            return {
                row[0] for row in db.execute("SELECT line FROM answers WHERE job_id = ?", (job_id,))
            }

    def answer(self, job_id: str, line: int, custom_id: str, status_code: int, body: str) -> None:
        """One line's answer; a line answered again (its first answer lost with a killed gateway
        before this row was written, or written twice) keeps one row."""
        with self._connection() as db:
            db.execute(
                "INSERT OR REPLACE INTO answers VALUES (?, ?, ?, ?, ?)",
                (job_id, line, custom_id, status_code, body),
            )

    def answers(self, job_id: str) -> Iterator[sqlite3.Row]:
        with self._connection() as db:
            yield from db.execute(
                "SELECT line, custom_id, status_code, body FROM answers WHERE job_id = ? ORDER BY line",
                (job_id,),
            )
