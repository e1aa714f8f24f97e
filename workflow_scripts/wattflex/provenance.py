"""Artifact metadata: schema version and provenance on everything wattflex writes.

Parquet artifacts carry a JSON document under the schema-metadata key ``wattflex``;
JSON artifacts carry ``schema_version`` and ``provenance`` keys; CSV outputs get a JSON
sidecar (``<file>.meta.json``). Readers refuse an unknown *major* schema version, so a
file written by an incompatible future wattflex fails loudly instead of being misread.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import json
import math
import os
import re
import subprocess
import sys
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # Imported where used: the Snakefile imports this module at every `snakemake` start, and an
    # emulated run's job never needs pandas.
    import pandas as pd
    import pyarrow as pa

from wattflex import SCHEMA_VERSION, __version__

META_KEY = b"wattflex"
REPORT_META_ID = "wattflex-meta"  # id of the JSON <script> that carries a report's metadata
_PACKAGES = (
    "numpy",
    "pandas",
    "pyarrow",
    "scipy",
    "scikit-learn",
    "scikit-posthocs",
    "statsmodels",
    "snakemake",
    "matplotlib",
    "torch",
    "transformers",
    "peft",
    "nvidia-ml-py",
)


class SchemaVersionError(ValueError):
    """An artifact written with a schema this wattflex cannot read."""


def check_schema_version(found: str | None, path: str | os.PathLike) -> None:
    """Check that an artifact's ``schema_version`` has the major version this wattflex reads.

    Raises SchemaVersionError when it is missing (not a wattflex artifact) or of another major.
    """
    if found is None:
        raise SchemaVersionError(
            f"{path}: no schema_version; not a wattflex artifact (or written by a pre-1.0 tool)"
        )
    major = str(found).split(".")[0]
    if major != SCHEMA_VERSION.split(".")[0]:
        raise SchemaVersionError(
            f"{path}: schema_version {found} is not readable by wattflex {__version__} "
            f"(reads {SCHEMA_VERSION.split('.')[0]}.x); rerun the stage that wrote it or upgrade wattflex"
        )


@functools.lru_cache(maxsize=1)
def code_version() -> dict[str, Any]:
    """Git commit of the wattflex source tree and whether it had uncommitted changes. A commit
    is claimed only when the repository around the tree tracks its files: a copy without
    ``.git`` dropped (untracked or ignored) into another repository is not that repository's
    commit, and claims none."""
    here = Path(__file__).resolve().parent

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(here), *args], capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD") if git("ls-files", "--", ".") else None
        dirty = bool(git("status", "--porcelain", "--", ".")) if commit else None
    except (OSError, subprocess.SubprocessError):
        commit, dirty = None, None
    return {"wattflex_version": __version__, "git_commit": commit, "git_dirty": dirty}


@functools.lru_cache(maxsize=1)
def package_versions() -> dict[str, str]:
    """The versions of Python and of the installed packages that shape the outputs (those not
    installed are left out), for the provenance record.
    """
    out = {"python": sys.version.split()[0]}
    for name in _PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def params_hash(params: Any) -> str:
    """Stable hash of a JSON-able config slice (key order does not matter)."""
    blob = json.dumps(params, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def file_checksum(path: str | os.PathLike) -> str:
    """The first 16 hex digits of the file's SHA-256 (read in 1 MiB chunks)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


def provenance(
    params: Any = None,
    inputs: Iterable[str | os.PathLike] = (),
    backend: str | None = None,
    device_model: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """The provenance record stored with every artifact.

    ``backend`` and ``device_model`` default to those of the wattflex artifacts among
    ``inputs`` (comma-joined when they differ), so a derived table says what its data
    came from without every rule script passing it on.
    """
    inputs = [p for p in inputs if Path(p).is_file()]
    record: dict[str, Any] = {
        **code_version(),
        "params_hash": params_hash(params) if params is not None else None,
        "inputs": {str(p): file_checksum(p) for p in inputs},
        "packages": package_versions(),
    }
    backend = backend if backend is not None else inherited(inputs, "backend")
    device_model = device_model if device_model is not None else inherited(inputs, "device_model")
    if backend is not None:
        record["backend"] = backend
    if device_model is not None:
        record["device_model"] = device_model
    record.update(extra)
    return record


def artifact_meta(path: str | os.PathLike) -> dict[str, Any] | None:
    """The ``{schema_version, provenance, ...}`` document of any wattflex artifact (parquet,
    JSON, CSV via its sidecar, PNG, SVG, report HTML, a plain document such as an OpenADR object via
    its sidecar), or None if ``path`` carries none."""
    path = Path(path)
    suffix = path.suffix.lower()
    sidecar = Path(f"{path}.meta.json")
    try:
        if suffix == ".parquet":
            import pyarrow.parquet as pq

            raw = (pq.read_schema(path).metadata or {}).get(META_KEY)
            return json.loads(raw) if raw else None
        if suffix == ".json":
            doc = json.loads(path.read_text())
            if isinstance(doc, dict) and "schema_version" in doc:
                return doc
            return _own_sidecar(path, sidecar)
        if suffix in (".csv", ".md"):
            return _own_sidecar(path, sidecar)
        if suffix == ".png":
            from PIL import Image

            with Image.open(path) as img:
                # save_png writes the chunk before the pixels, where opening the file reads it
                # (``info``); ``text`` decodes the whole image to find chunks after them.
                raw = img.info.get(META_KEY.decode())
                if raw is None:
                    raw = img.text.get(META_KEY.decode())
            return json.loads(raw) if raw else None
        if suffix == ".html":
            return read_html_meta(path) or None
        if suffix == ".svg":
            import xml.etree.ElementTree as ET

            node = ET.parse(path).find(".//{http://purl.org/dc/elements/1.1/}description")
            return json.loads(node.text) if node is not None and node.text else None
    except (OSError, ValueError, SyntaxError):
        return None
    return None


def _own_sidecar(path: Path, sidecar: Path) -> dict[str, Any] | None:
    """The sidecar's document if it is ``path``'s own (:func:`check_sidecar`), else None."""
    if not sidecar.is_file():
        return None
    try:
        return check_sidecar(path, json.loads(sidecar.read_text()))
    except StaleSidecarError:
        return None


def inherited(inputs: Iterable[str | os.PathLike], key: str) -> str | None:
    """``key`` (backend, device_model) of the wattflex artifacts in ``inputs``, comma-joined."""
    values: set[str] = set()
    for path in inputs:
        doc = artifact_meta(path) or {}
        value = (doc.get("provenance") or {}).get(key) or doc.get(key)
        if value:
            values.update(v for v in str(value).split(",") if v)
    return ",".join(sorted(values)) or None


class OutputPathError(ValueError):
    """An output path wattflex refuses to write: an input, a folder, a link or a special file."""


def check_writable(path: str | os.PathLike) -> None:
    """Refuse an output ``path`` that is a folder, a symbolic link (wattflex never replaces
    a link, nor writes through one: give the target's own path) or an existing file that
    is not a regular one (``/dev/null``, a FIFO, a socket). A regular file is replaced
    atomically (see :func:`write_together`)."""
    p = Path(path)
    _check_folder(p)
    if p.is_symlink():
        raise OutputPathError(
            f"{path}: output is a symbolic link (to {os.readlink(p)}); wattflex does not "
            "replace links or write through them: give the target path or remove the link"
        )
    if p.is_dir():
        raise OutputPathError(f"{path}: output is a folder; give a file name")
    if p.exists() and not p.is_file():
        raise OutputPathError(
            f"{path}: output exists and is not a regular file (a device, FIFO or socket); "
            "wattflex only writes regular files"
        )


def _check_folder(p: Path) -> None:
    """Refuse, before any work, an output the OS would refuse at the end: under a file, in a
    folder that cannot be written (read-only filesystem, no permission), or with a name
    longer than the filesystem allows."""
    ancestor = p.parent
    while not ancestor.is_dir():
        if ancestor.exists() or ancestor.is_symlink():
            raise OutputPathError(
                f"{p}: {ancestor}, a folder above the output, is a file (or a broken link), "
                "not a folder: give another output path"
            )
        ancestor = ancestor.parent
    if not os.access(ancestor, os.W_OK | os.X_OK):
        readonly = bool(os.statvfs(ancestor).f_flag & os.ST_RDONLY)
        raise OutputPathError(
            f"{p}: cannot write into {ancestor} ("
            f"{'a read-only file system' if readonly else 'permission denied'}): "
            "give an output path in a writable folder"
        )
    name_max = os.pathconf(ancestor, "PC_NAME_MAX")
    too_long = [part for part in p.relative_to(ancestor).parts if len(os.fsencode(part)) > name_max]
    if too_long:
        raise OutputPathError(
            f"{p}: the name {too_long[0][:40]}... is {len(os.fsencode(too_long[0]))} bytes long; "
            f"this filesystem allows {name_max}: give a shorter name"
        )


def check_outputs(
    outputs: Iterable[str | os.PathLike | None], inputs: Iterable[str | os.PathLike | None]
) -> None:
    """The output-path check every command runs before it reads or writes anything big:
    each output passes :func:`check_writable`, no two outputs are the same file and no
    output is (after resolving links, ``..`` and hard links) one of the ``inputs``, so a
    slip like ``-o`` equal to the input never destroys it. ``None`` entries are ignored;
    for a CSV output pass its ``.meta.json`` sidecar too (``write_csv`` writes it)."""
    outs = [str(o) for o in outputs if o is not None]
    ins = [str(i) for i in inputs if i is not None]
    seen: dict[str, str] = {}
    for out in outs:
        check_writable(out)
        real = os.path.realpath(out)
        if real in seen:
            raise OutputPathError(f"{out}: given twice as an output (also as {seen[real]})")
        seen[real] = out
        for inp in ins:
            same = real == os.path.realpath(inp)
            if not same and os.path.exists(out) and os.path.exists(inp):
                try:
                    same = os.path.samefile(out, inp)
                except OSError:
                    pass
            if same:
                raise OutputPathError(
                    f"{out}: output is the input {inp}; writing it would destroy the "
                    "input: choose another output path"
                )


class OutputWriteError(OSError):
    """The operating system refused to write an output (read-only or full filesystem, a file
    where a folder should be, a name too long): one line naming the output and the cause."""

    def __str__(self) -> str:
        return str(self.strerror)


def _new_file_mode(path: Path) -> int:
    """An existing file's mode, else the usual one (0666 less the umask)."""
    try:
        return path.stat().st_mode & 0o7777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def _unlink(path: str | os.PathLike | None) -> None:
    try:
        if path is not None:
            os.unlink(path)
    except OSError:
        pass


def write_together(files: list[tuple[str | os.PathLike, Any]]) -> None:
    """Write ``files`` (``(path, write)`` pairs, ``write(tmp)`` writing one file) as a set:
    each into a temporary file in its folder, then renamed over its path (``os.replace``),
    the first path last, so a reader that finds it finds its companions (a CSV and its
    sidecar). A reader never sees half a file; a failure while writing leaves every old file
    as it was and no new one, and a rename that fails puts back what the set had renamed
    (kept meanwhile as hard links). Every file gets the first one's mode (a 0600 CSV keeps a
    0600 sidecar). The renames of a set hold a lock on its folder (:func:`_folder_lock`), so
    two commands writing one output at once leave one's CSV with that one's sidecar. The OS's
    refusal becomes :class:`OutputWriteError` naming the output, not a temporary name."""
    import tempfile

    paths = [Path(p) for p, _ in files]
    tmps: list[str | None] = [None] * len(files)
    olds: list[str | None] = [None] * len(files)
    done: list[int] = []
    current = paths[0]
    mode = _new_file_mode(paths[0])
    lock = None
    try:
        for i, (path, write) in enumerate(zip(paths, (w for _, w in files))):
            current = path
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmps[i] = tempfile.mkstemp(
                prefix=f".{path.name[:64]}.", suffix=".tmp", dir=path.parent
            )
            os.close(fd)
            write(tmps[i])
            _fsync(tmps[i])  # before the chmod: a 0200 output's file could not be opened after
            os.chmod(tmps[i], mode)
        folders = list(dict.fromkeys(p.parent for p in paths))
        for folder in folders:  # the temporary names are durable before any rename
            _fsync(folder)
        lock = _folder_lock(paths) if len(files) > 1 else None
        for i in reversed(range(len(files))):
            current = paths[i]
            if paths[i].exists():
                olds[i] = f"{tmps[i]}.old"
                os.link(paths[i], olds[i])
            os.replace(tmps[i], paths[i])
            tmps[i] = None
            done.append(i)
        for folder in folders:  # and the renames before the command says it is done
            _fsync(folder)
        _remove_stale_companions(paths)
    except BaseException as exc:
        for i in done:  # put the set back as it was
            if olds[i] is not None:
                os.replace(olds[i], paths[i])
                olds[i] = None
            else:
                _unlink(paths[i])
        if isinstance(exc, OSError) and not isinstance(exc, OutputWriteError):
            rest = "" if len(files) == 1 else f" (none of its {len(files)} files was written)"
            raise OutputWriteError(
                exc.errno, f"{current}: cannot write it: {exc.strerror or exc}{rest}"
            ) from None
        raise
    finally:
        if lock is not None:
            os.close(lock)  # releases the lock
        for tmp in (*tmps, *olds):
            _unlink(tmp)


def _fsync(path: str | os.PathLike) -> None:
    """``fsync`` a file or a folder (its entries: the names a rename made), so what a
    command reported written survives a crash or a power cut. A filesystem that cannot
    sync a folder (``EINVAL`` on some FUSE and network mounts), or a folder this user may
    write but not read, is passed over."""
    try:
        fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if os.path.isdir(path) else 0))
    except PermissionError:  # a folder one may write but not list (mode -wx): nothing to sync by
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


# Files a command writes beside its output, named after it: a set written without one of them
# removes the one an earlier command left (it would describe another output).
COMPANIONS = (".meta.json", ".totals.json")


def _remove_stale_companions(paths: list[Path]) -> None:
    """Remove the companion files (:data:`COMPANIONS`) of the outputs in ``paths`` that this set
    did not write: another command's sidecar beside a new output would claim it. Killed before
    this, a stale sidecar stays, but its ``sha256`` no longer matches and every reader says so
    (:func:`check_sidecar`)."""
    written = {str(p) for p in paths}
    for p in paths:
        if str(p).endswith(COMPANIONS):
            continue
        for suffix in COMPANIONS:
            companion = f"{p}{suffix}"
            if companion not in written and os.path.lexists(companion):
                _unlink(companion)


def _folder_lock(paths: list[Path]) -> int | None:
    """An exclusive ``flock`` on the folder of ``paths[0]`` (a descriptor; closing it unlocks),
    held while a set is renamed into place: a lock on the folder itself leaves no lock file
    behind. A filesystem without flock on folders (some NFS) gets None: the renames go on
    unlocked."""
    import fcntl

    try:
        fd = os.open(paths[0].parent, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:
        os.close(fd)
        return None
    return fd


def _atomic_write(path: str | os.PathLike, write: Any) -> None:
    """One file written whole or not at all (:func:`write_together`)."""
    write_together([(path, write)])


def write_parquet(
    df: pd.DataFrame | pa.Table,
    path: str | os.PathLike,
    prov: dict[str, Any] | None = None,
    **meta: Any,
) -> None:
    """A DataFrame (its index dropped) or a pyarrow Table as a wattflex parquet artifact."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    check_writable(path)
    table = df if isinstance(df, pa.Table) else pa.Table.from_pandas(df, preserve_index=False)
    doc = {"schema_version": SCHEMA_VERSION, "provenance": prov or provenance(), **meta}
    table = table.replace_schema_metadata(
        {**(table.schema.metadata or {}), META_KEY: strict_json(doc).encode()}
    )
    _atomic_write(path, lambda tmp: pq.write_table(table, tmp))


def read_parquet_meta(path: str | os.PathLike) -> dict[str, Any]:
    """The wattflex metadata stored in a parquet file's schema (``{}`` when it has none).

    Raises SchemaVersionError when that metadata's schema version is not readable.
    """
    import pyarrow.parquet as pq

    raw = (pq.read_schema(path).metadata or {}).get(META_KEY)
    doc = json.loads(raw) if raw else {}
    check_schema_version(doc.get("schema_version"), path)
    return doc


def read_parquet(path: str | os.PathLike, columns: list[str] | None = None) -> pd.DataFrame:
    """Read a wattflex parquet artifact, refusing unknown major schema versions."""
    import pandas as pd

    read_parquet_meta(path)
    return pd.read_parquet(path, columns=columns)


def json_safe(obj: Any) -> Any:
    """``obj`` with every non-finite float (NaN, inf) as None: strict JSON parsers reject
    Python's ``NaN``, and an undefined statistic is null (its reason beside it)."""
    if isinstance(obj, float):
        return obj if obj == obj and obj not in (float("inf"), float("-inf")) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if type(obj).__module__ == "numpy" and hasattr(obj, "item"):
        return json_safe(obj.item()) if getattr(obj, "ndim", 0) == 0 else json_safe(obj.tolist())
    return obj


def strict_json(obj: Any, **kwargs: Any) -> str:
    """JSON text that strict parsers accept: non-finite floats as null (:func:`json_safe`),
    and ``allow_nan=False`` at the writer so a NaN that slips past (one made by ``default``)
    is an error here, never a ``NaN`` token in a file."""
    return json.dumps(json_safe(obj), allow_nan=False, **{"default": _json_default, **kwargs})


def undefined_values(obj: Any, where: str = "") -> dict[str, str]:
    """``{dotted.path: "NaN" | "inf" | "-inf"}`` of every non-finite float in ``obj``: the
    reason beside each ``null`` :func:`strict_json` writes for one."""
    if type(obj).__module__ == "numpy" and hasattr(obj, "tolist"):
        obj = obj.tolist()
    if isinstance(obj, float) and not math.isfinite(obj):
        return {where: "NaN" if obj != obj else ("inf" if obj > 0 else "-inf")}
    items = (
        obj.items()
        if isinstance(obj, dict)
        else enumerate(obj)
        if isinstance(obj, (list, tuple))
        else ()
    )
    found: dict[str, str] = {}
    for key, value in items:
        found.update(undefined_values(value, f"{where}.{key}" if where else str(key)))
    return found


def json_file(
    obj: dict[str, Any], path: str | os.PathLike, prov: dict[str, Any] | None = None
) -> tuple[str | os.PathLike, Any]:
    """``(path, write)`` of a JSON artifact, for :func:`write_together`. Strict JSON: an
    undefined value (NaN, inf) is ``null``, and ``undefined`` maps its dotted path to what it
    was (``{"summary.power_w_sem": "NaN"}``); pandas readers of these records take null as
    missing, as they took NaN."""
    check_writable(path)
    doc = {"schema_version": SCHEMA_VERSION, **obj, "provenance": prov or provenance()}
    undefined = undefined_values(doc)
    if undefined:
        doc["undefined"] = undefined
    return path, lambda tmp: Path(tmp).write_text(strict_json(doc, indent=2) + "\n")


def write_json(
    obj: dict[str, Any], path: str | os.PathLike, prov: dict[str, Any] | None = None
) -> None:
    """Write ``obj`` as strict JSON to ``path`` with ``prov`` in it, atomically (see
    :func:`write_together`).
    """
    write_together([json_file(obj, path, prov)])


def read_json(path: str | os.PathLike) -> dict[str, Any]:
    """A JSON artifact written by wattflex.

    Raises SchemaVersionError when its schema version is missing or of another major version.
    """
    doc = json.loads(Path(path).read_text())
    check_schema_version(doc.get("schema_version"), path)
    return doc


def document_files(
    data: bytes, path: str | os.PathLike, prov: dict[str, Any] | None = None, **meta: Any
) -> list[tuple[str | os.PathLike, Any]]:
    """A plain document (``data``: a CSV, an OpenADR object, a page) and its
    ``<path>.meta.json`` sidecar as ``(path, write)`` pairs, the document first
    (:func:`write_together` renames it last). The sidecar carries the document's ``sha256``,
    so a reader tells a sidecar that describes another file (a kill between the two renames,
    a file replaced by hand) from the document's own (:func:`check_sidecar`)."""
    check_writable(path)
    digest = hashlib.sha256(data).hexdigest()
    sidecar = json_file(
        {"artifact": Path(path).name, "sha256": digest, **meta}, f"{path}.meta.json", prov
    )
    return [(path, lambda tmp: Path(tmp).write_bytes(data)), sidecar]


def csv_files(
    df: pd.DataFrame, path: str | os.PathLike, prov: dict[str, Any] | None = None, **meta: Any
) -> list[tuple[str | os.PathLike, Any]]:
    """The CSV and its ``<path>.meta.json`` sidecar (:func:`document_files`), CSV first."""
    data = df.to_csv(index=False).encode()
    return document_files(data, path, prov, columns=list(map(str, df.columns)), **meta)


class StaleSidecarError(ValueError):
    """A ``.meta.json`` sidecar whose ``sha256`` is not that of the file beside it."""


def check_sidecar(path: str | os.PathLike, doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` (the sidecar of ``path``), refused with one line when the hash it records is
    not ``path``'s: the sidecar belongs to another output (a command killed between its two
    renames, or the file replaced since). A sidecar without ``sha256`` (written before sidecars carried
    it) is taken as it is."""
    recorded = doc.get("sha256")
    if recorded is not None:
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        if h.hexdigest() != recorded:
            raise StaleSidecarError(
                f"{path}: its sidecar {path}.meta.json describes another file (sha256 "
                f"{recorded[:12]}..., the file's is {h.hexdigest()[:12]}...): the command that "
                "wrote it was stopped or the file was replaced since; rerun that command (or "
                "remove the sidecar to read an edited file as your own)"
            )
    return doc


def read_sidecar(path: str | os.PathLike) -> dict[str, Any]:
    """The sidecar ``<path>.meta.json`` of a document, its schema version and its hash of
    ``path`` checked (:func:`check_sidecar`)."""
    return check_sidecar(path, read_json(f"{path}.meta.json"))


def write_csv(
    df: pd.DataFrame, path: str | os.PathLike, prov: dict[str, Any] | None = None, **meta: Any
) -> None:
    """CSV for people and spreadsheets, with provenance in ``<path>.meta.json``; the two
    appear together or not at all."""
    write_together(csv_files(df, path, prov, **meta))


def read_csv(path: str | os.PathLike, **kwargs: Any) -> pd.DataFrame:
    """Read a wattflex CSV, refusing one whose sidecar has an unknown major schema version or
    describes another file (:func:`read_sidecar`)."""
    import pandas as pd

    read_sidecar(path)
    return pd.read_csv(path, **kwargs)


def save_png(
    fig: Any,
    path: str | os.PathLike,
    prov: dict[str, Any] | None = None,
    dpi: float | None = None,
    **meta: Any,
) -> None:
    """Save a matplotlib figure (anything with ``savefig``; only ``plots`` imports matplotlib)
    as a PNG carrying schema version and provenance in its text chunk ``wattflex``, so a figure
    found on its own still says what made it, and beside it the same figure as SVG (vector, for
    print and zoom; the document in its ``dc:description``). Both written atomically, together,
    the chunk ahead of the pixels."""
    check_writable(path)
    svg = Path(path).with_suffix(".svg")
    check_writable(svg)
    doc = {"schema_version": SCHEMA_VERSION, **meta, "provenance": prov or provenance()}
    text = strict_json(doc)
    # zlib level 3, not Pillow's 6: the default campaign's 17 figures encode in 0.81 s instead
    # of 1.40 s for 1% more bytes (1.91 vs 1.89 MB; measured on 2 cores).
    write_together(
        [
            (
                path,
                lambda tmp: fig.savefig(
                    tmp,
                    format="png",
                    dpi=dpi,
                    metadata={META_KEY.decode(): text},
                    pil_kwargs={"compress_level": 3},
                ),
            ),
            (
                svg,
                lambda tmp: fig.savefig(
                    tmp, format="svg", metadata={"Description": text, "Date": None}
                ),
            ),
        ]
    )


def read_png_meta(path: str | os.PathLike) -> dict[str, Any]:
    """The metadata ``save_png`` wrote, refusing unknown major schema versions."""
    doc = artifact_meta(path) or {}
    check_schema_version(doc.get("schema_version"), path)
    return doc


def _json_default(o: Any) -> Any:
    import numpy as np

    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)


def read_html_meta(path: str | os.PathLike) -> dict[str, Any]:
    """The JSON document embedded in a wattflex HTML report ({} if it carries none)."""
    m = re.search(
        rf'<script type="application/json" id="{REPORT_META_ID}">(.*?)</script>',
        Path(path).read_text(),
        re.S,
    )
    return json.loads(m.group(1)) if m else {}
