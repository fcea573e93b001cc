"""A ready Prefect database for new Prefect homes: a local server's first start spends about half of its start-up
migrating an empty SQLite database and registering Prefect's block types; a copy of a database that went through
that once (with Prefect's memo of the registration) starts in about half the time.

The template is taken from the first server that starts on an empty home (SQLite's online backup: a consistent copy
while the server runs), once per Prefect version, into the user's cache folder (``$RAGEN_CACHE_DIR``, else
``$XDG_CACHE_HOME/ragen``, else ``~/.cache/ragen``). It holds only what every fresh server creates for itself:
never a flow run. Every step is best effort: a cache that cannot be read or written only costs the slower start,
and a server that fails to start from a seeded home is retried on an empty one (the template is then dropped).
Like the rest of :mod:`ragen_cli.local_server`, this module imports nothing of Prefect.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from contextlib import closing
from importlib import metadata
from pathlib import Path

DATABASE, MEMO = "prefect.db", "memo_store.toml"


def template_dir() -> Path | None:
    """The template folder of the installed Prefect version, or None when it cannot have one (no Prefect installed,
    or a database other than the home's SQLite file configured)."""
    if any(os.environ.get(f"PREFECT_{part}_DATABASE_CONNECTION_URL") for part in ("API", "SERVER")):
        return None
    try:
        version = metadata.version("prefect")
    except metadata.PackageNotFoundError:
        return None
    cache = os.environ.get("RAGEN_CACHE_DIR")
    if not cache:
        try:
            cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ragen"
        except RuntimeError:  # no home folder to be found: no cache
            return None
    return Path(cache) / "prefect-home" / version


def seed(home: Path) -> bool:
    """Copy the template into ``home`` when there is one and ``home`` has no database yet; True when copied. A
    template that is not a whole migrated SQLite database is dropped instead."""
    folder = template_dir()
    if folder is None or (home / DATABASE).exists() or not (folder / DATABASE).is_file():
        return False
    if not _migrated(folder / DATABASE):
        discard()
        return False
    try:
        for name in (DATABASE, MEMO):
            if (folder / name).is_file():
                shutil.copyfile(folder / name, home / name)
        return True
    except OSError:
        unseed(home)
        return False


def _migrated(database: Path) -> bool:
    """Whether ``database`` is an intact SQLite file that records a migration revision."""
    try:
        with closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as db:
            intact = db.execute("PRAGMA quick_check").fetchone()[0] == "ok"
            return intact and bool(db.execute("SELECT version_num FROM alembic_version").fetchall())
    except sqlite3.Error:
        return False


def unseed(home: Path) -> None:
    """Remove what :func:`seed` copied (and the files SQLite made beside it), leaving ``home`` as if never seeded."""
    for name in (DATABASE, f"{DATABASE}-wal", f"{DATABASE}-shm", f"{DATABASE}-journal", MEMO):
        (home / name).unlink(missing_ok=True)  # the home is ours: a failure here is a real error


def discard() -> None:
    """Drop the template (a server did not start from it)."""
    folder = template_dir()
    if folder is None:
        return
    for name in (DATABASE, MEMO):
        try:
            (folder / name).unlink(missing_ok=True)
        except OSError:
            pass


def save(home: Path) -> None:
    """Keep the database of a server that has just started in ``home`` as the template, unless one exists (so after
    a start from the template this does nothing). Written under temporary names and renamed into place, so a reader
    sees a whole file or none."""
    folder = template_dir()
    if folder is None or (folder / DATABASE).is_file() or not (home / DATABASE).is_file():
        return
    suffix = f".{os.getpid()}.tmp"
    staged = [folder / f"{DATABASE}{suffix}", folder / f"{MEMO}{suffix}"]
    try:
        folder.mkdir(parents=True, exist_ok=True)
        source = f"file:{home / DATABASE}?mode=ro"
        with closing(sqlite3.connect(source, uri=True)) as live, closing(sqlite3.connect(staged[0])) as copy:
            if live.execute("SELECT count(*) FROM flow_run").fetchone()[0]:
                return  # not a fresh database (the finally clause removes the empty staged file)
            live.backup(copy)
        if (home / MEMO).is_file():
            shutil.copyfile(home / MEMO, staged[1])
            os.replace(staged[1], folder / MEMO)
        os.replace(staged[0], folder / DATABASE)  # last: its presence says the template is complete
    except (OSError, sqlite3.Error):
        pass
    finally:
        for path in staged:
            try:
                path.unlink(missing_ok=True)
            except OSError:
                pass
