"""Cap state folders and files that root can trust.

``wattflex restore-caps`` runs as root from the SLURM epilog, and ``wattflex control`` often
runs as root too, so nothing in a state folder may be trusted for being there:

* a folder is used only when it is a real directory (not a symlink) owned by root or by the
  run's own user and writable by nobody else; root creates its own as 0755, a user as 0700.
  Default: ``/var/tmp/wattflex`` for root, ``/var/tmp/wattflex-<uid>`` for everyone else
  (``/var/tmp`` is world-writable, so a shared folder there is anyone's to plant);
* a file is read only when it is a regular file (opened with ``O_NOFOLLOW``) owned by root or
  by one of the trusted users, and small;
* files are written to a fresh name created exclusively (``O_CREAT|O_EXCL|O_NOFOLLOW``) in the
  open folder, then renamed over the record: a planted link is replaced, never followed.

Every operation works on the folder's open descriptor (``dir_fd``), so a folder swapped for a
link after it was checked is not followed either.
"""

from __future__ import annotations

import errno
import fnmatch
import json
import os
import secrets
import stat
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from wattflex.provenance import strict_json
from wattflex.runs.devices.base import CapError

STATE_DIR_ENV = "WATTFLEX_STATE_DIR"
DEFAULT_STATE_DIR = "/var/tmp/wattflex"  # survives the job (SLURM may give each job its own /tmp)
MAX_STATE_BYTES = 1 << 20  # a record is ~1 kB per GPU; anything larger is not one of ours


class UnsafeStateDir(CapError):
    """A state folder another user could have written: nothing in it is read or written."""


def default_state_dir(uid: int | None = None) -> Path:
    """``$WATTFLEX_STATE_DIR``, else root's ``/var/tmp/wattflex`` or a user's ``/var/tmp/wattflex-<uid>``."""
    if os.environ.get(STATE_DIR_ENV):
        return Path(os.environ[STATE_DIR_ENV])
    uid = os.geteuid() if uid is None else uid
    return Path(DEFAULT_STATE_DIR if uid == 0 else f"{DEFAULT_STATE_DIR}-{uid}")


def trusted_uids(job_uid: int | None = None) -> frozenset[int]:
    """Root, this process's user and (for root in an epilog) the job's user."""
    return frozenset({0, os.geteuid()} | ({job_uid} if job_uid is not None else set()))


def folder_problem(st: os.stat_result, trusted: Iterable[int]) -> str | None:
    """Why a folder with this ``fstat`` may not be trusted (None when it may)."""
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid not in trusted:
        return f"is owned by uid {st.st_uid}, not by root or the run's user"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


@contextmanager
def open_folder(
    path: str | Path, trusted: Iterable[int], create: bool = False
) -> Iterator[int | None]:
    """The folder's descriptor once it is checked (None when it does not exist and ``create`` is off)."""
    path = Path(path)
    if create:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(path, 0o755 if os.geteuid() == 0 else 0o700)
        except FileExistsError:
            pass
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except FileNotFoundError:
        if create:
            raise
        yield None
        return
    except OSError as exc:
        why = (
            "is a symbolic link"
            if exc.errno == errno.ELOOP or path.is_symlink()
            else (exc.strerror or str(exc))
        )
        raise UnsafeStateDir(f"cap state folder {path} {why}: not used") from None
    try:
        bad = folder_problem(os.fstat(fd), trusted)
        if bad:
            raise UnsafeStateDir(
                f"cap state folder {path} {bad}: not used (make it root's or the run "
                f"user's, mode 0755 or 0700)"
            )
        yield fd
    finally:
        os.close(fd)


def write_record(folder: str | Path, name: str, doc: dict[str, Any]) -> Path:
    """Write ``doc`` to ``folder/name`` through an exclusively created temporary file."""
    with open_folder(folder, trusted_uids(), create=True) as dfd:
        tmp = f".{name}.{secrets.token_hex(8)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=dfd)
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(strict_json(doc, indent=2))
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            os.unlink(tmp, dir_fd=dfd)
            raise
    return Path(folder) / name


def remove_record(path: Path) -> None:
    """Remove a record (the name only: unlink never follows a link)."""
    path.unlink(missing_ok=True)


def _read_one(dfd: int, name: str, trusted: frozenset[int]) -> tuple[Any, int | None, str | None]:
    """(parsed document, owner uid, problem) of one file in an open folder."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dfd)
    except OSError as exc:
        return (
            None,
            None,
            "is a symbolic link" if exc.errno == errno.ELOOP else (exc.strerror or str(exc)),
        )
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            return None, st.st_uid, "is not a regular file"
        if st.st_uid not in trusted:
            return None, st.st_uid, f"is owned by uid {st.st_uid}, not by root or the run's user"
        data = fh.read(MAX_STATE_BYTES + 1)
    if len(data) > MAX_STATE_BYTES:
        return None, st.st_uid, f"is larger than {MAX_STATE_BYTES} bytes"
    try:
        return json.loads(data), st.st_uid, None
    except ValueError as exc:
        return None, st.st_uid, f"unreadable: {exc}"


def read_records(folder: str | Path, pattern: str, trusted: frozenset[int]) -> list[dict[str, Any]]:
    """Every file matching ``pattern``: path, owner, and the document or why it is not trusted.

    ``untrusted`` marks a file (or folder) no wattflex process of a trusted user could have
    written (links, foreign owners, unsafe folders): reported, never acted on."""
    folder = Path(folder)
    try:
        with open_folder(folder, trusted) as dfd:
            if dfd is None:
                return []
            out = []
            for name in sorted(n for n in os.listdir(dfd) if fnmatch.fnmatchcase(n, pattern)):
                doc, owner, problem = _read_one(dfd, name, trusted)
                untrusted = problem is not None and not problem.startswith("unreadable")
                out.append(
                    {
                        "path": folder / name,
                        "owner": owner,
                        "doc": doc,
                        "problem": problem,
                        "untrusted": untrusted,
                    }
                )
            return out
    except UnsafeStateDir as exc:
        return [
            {"path": folder, "owner": None, "doc": None, "problem": str(exc), "untrusted": True}
        ]
