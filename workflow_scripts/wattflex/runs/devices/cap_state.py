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

Every open, rename and unlink works on the folder's open descriptor (``dir_fd``, the file's own
name opened with ``O_NOFOLLOW``), held from the check to the last use: a folder swapped for a link
after it was checked is not followed, and a record is removed from the folder it was read from
(``held_records``), never by its path again.
"""

from __future__ import annotations

import errno
import fnmatch
import json
import os
import secrets
import stat
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from wattflex.provenance import strict_json
from wattflex.runs.devices.base import CapError

STATE_DIR_ENV = "WATTFLEX_STATE_DIR"
DEFAULT_STATE_DIR = "/var/tmp/wattflex"  # survives the job (SLURM may give each job its own /tmp)
MAX_STATE_BYTES = 1 << 20  # a record is ~1 kB per GPU; anything larger is not one of ours
MAX_LINKS = (
    40  # Linux's own limit on links followed in one path lookup (MAXSYMLINKS, path_resolution(7))
)
MAX_INTERPRETERS = 4  # nested #! interpreters the kernel follows (BINPRM_MAX_RECURSION, fs/exec.c)


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
    """The folder's descriptor once it is checked (None when it does not exist and ``create`` is off).

    The folder is made and opened through its parent's descriptor, its own name with
    ``O_NOFOLLOW``: a link at the name is refused, never followed."""
    path = Path(path)
    if create:
        path.parent.mkdir(parents=True, exist_ok=True)
    try:
        parent = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        yield None
        return
    try:
        if create:
            try:
                os.mkdir(path.name, 0o755 if os.geteuid() == 0 else 0o700, dir_fd=parent)
            except FileExistsError:
                pass
        fd = os.open(path.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent)
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
    finally:
        os.close(parent)
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


def remove_record(dfd: int, name: str) -> None:
    """Remove the record ``name`` from the open folder ``dfd`` (the name only: unlink follows no link)."""
    try:
        os.unlink(name, dir_fd=dfd)
    except FileNotFoundError:
        pass


def remove_own_record(folder: str | Path, name: str) -> None:
    """Remove this process's record ``name`` from ``folder``, opened and checked as it was written."""
    with open_folder(folder, trusted_uids()) as dfd:
        if dfd is not None:
            remove_record(dfd, name)


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


@contextmanager
def held_records(
    folder: str | Path, pattern: str, trusted: frozenset[int]
) -> Iterator[tuple[int | None, list[dict[str, Any]]]]:
    """The open folder's descriptor and every file matching ``pattern`` in it (``read_records``'s
    entries, each with its ``name``); the descriptor stays open until the block ends, so whatever
    the caller removes (``remove_record``) is in the folder it read, whatever became of the path.
    The descriptor is None when the folder is absent or not trusted (then the one entry says why)."""
    folder = Path(folder)
    with ExitStack() as stack:
        try:
            dfd = stack.enter_context(open_folder(folder, trusted))
        except UnsafeStateDir as exc:
            entry = {"path": folder, "name": None, "owner": None, "doc": None}
            yield None, [{**entry, "problem": str(exc), "untrusted": True}]
            return
        if dfd is None:
            yield None, []
            return
        out = []
        for name in sorted(n for n in os.listdir(dfd) if fnmatch.fnmatchcase(n, pattern)):
            doc, owner, problem = _read_one(dfd, name, trusted)
            untrusted = problem is not None and not problem.startswith("unreadable")
            out.append(
                {
                    "path": folder / name,
                    "name": name,
                    "owner": owner,
                    "doc": doc,
                    "problem": problem,
                    "untrusted": untrusted,
                }
            )
        yield dfd, out


def read_records(folder: str | Path, pattern: str, trusted: frozenset[int]) -> list[dict[str, Any]]:
    """Every file matching ``pattern``: path, owner, and the document or why it is not trusted.

    ``untrusted`` marks a file (or folder) no wattflex process of a trusted user could have
    written (links, foreign owners, unsafe folders): reported, never acted on."""
    with held_records(folder, pattern, trusted) as (_, records):
        return records


def root_owned_problem(path: str | Path, _links: int = 0) -> str | None:
    """Why root should not run or trust ``path`` (None when it may): the file and every folder
    on its way from ``/``, through every link and the links' own targets, must be root's and
    writable by nobody else, as sudo's ``secure_path`` and SLURM's prolog/epilog rules expect.
    A world-writable folder with the sticky bit (``/tmp``) passes on the way only: another user
    cannot rename or remove the root-owned entry checked next."""
    path = str(path)
    if not os.path.isabs(path):
        return f"{path} is not an absolute path"
    here, parts = "/", Path(path).parts[1:]
    for i, part in enumerate(("",) + parts):
        cur = os.path.join(here, part) if part else "/"
        try:
            st = os.lstat(cur)
        except OSError as exc:
            return f"{cur}: {exc.strerror or exc}"
        if st.st_uid != 0:
            return f"{cur} is owned by uid {st.st_uid}, not by root"
        if stat.S_ISLNK(st.st_mode):
            if _links >= MAX_LINKS:
                return f"{path}: more than {MAX_LINKS} links"
            target = os.path.join(here, os.readlink(cur))
            return root_owned_problem(os.path.join(target, *parts[i:]), _links + 1)
        sticky_on_the_way = (
            stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX and i < len(parts)
        )
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not sticky_on_the_way:
            return f"{cur} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
        here = cur
    return None


def program_problem(path: str | Path) -> str | None:
    """Why root should not execute ``path`` (None when it may): the program is root's end to end
    (``root_owned_problem``), and so is each ``#!`` interpreter it names, which is what runs."""
    for _ in range(MAX_INTERPRETERS + 1):
        problem = root_owned_problem(path)
        if problem:
            return problem
        try:
            with open(path, "rb") as fh:
                head = fh.read(256)
        except OSError as exc:
            return f"{path}: {exc.strerror or exc}"
        if not head.startswith(b"#!"):
            return None
        words = head[2:].split(b"\n", 1)[0].split()
        if not words:
            return f"{path} has an empty #! line"
        interpreter = os.fsdecode(words[0])
        if os.path.basename(interpreter) == "env":
            return f"{path} names its interpreter through {interpreter}, which searches PATH"
        path = interpreter
    return f"more than {MAX_INTERPRETERS} nested #! interpreters"


def command_problem(argv: list[str]) -> str | None:
    """Why root should not run the command ``argv`` (None when it may): its program is an
    absolute path (no PATH look-up) root owns end to end with its interpreters, and so is every
    other word that names an existing file (a sudo wrapper, a script handed to an interpreter)."""
    if not argv or not os.path.isabs(argv[0]):
        return f"its program {argv[0] if argv else ''!r} is not an absolute path"
    for word in argv:
        if word == argv[0] or (os.path.isabs(word) and os.path.lexists(word)):
            problem = program_problem(word)
            if problem:
                return f"{word}: {problem}"
    return None
