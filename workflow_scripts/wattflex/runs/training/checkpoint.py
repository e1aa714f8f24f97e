"""The paper's one distributed checkpoint (model + optimizer, every rank writes its shard).

Saved with torch DCP, asynchronously where asked (``cuda.checkpoint_async``, the default):
``dcp.async_save`` copies the state dict to host memory, training resumes, and a thread
writes the files. Its collectives run on a gloo group of their own (as torchtitan's async
checkpointing does), so they never interleave with the training loop's all-reduces on the
default group. The step that waits for the copy still shows the dip (the steady-state
protocol excludes it); the write is waited for before the run ends, and its size (bytes
written, all ranks) and end time are added to the checkpoint event then.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

RUN_PLACEHOLDER = "{run}"


def checkpoint_root(checkpoint_dir: str | None, outdir: str | Path) -> Path:
    """Where a run's checkpoints go: ``<outdir>/checkpoint`` by default; else ``checkpoint_dir``
    with environment variables expanded (``$TMPDIR``, ``$SLURM_JOB_ID``: node-local scratch)
    and ``{run}`` replaced by the run's directory below the results root
    (``<campaign>/runs/<group>/cap<W>``); without ``{run}`` that directory is appended, so
    concurrent runs never share a checkpoint."""
    if not checkpoint_dir:
        return Path(outdir) / "checkpoint"
    run = "/".join(Path(outdir).resolve().parts[-4:])
    expanded = os.path.expanduser(os.path.expandvars(checkpoint_dir))
    if "$" in expanded:
        raise ValueError(
            f"cuda.checkpoint_dir {checkpoint_dir!r}: environment variable not set "
            f"({expanded!r}); set it in the job's environment or give a plain path"
        )
    if RUN_PLACEHOLDER in expanded:
        return Path(expanded.replace(RUN_PLACEHOLDER, run))
    return Path(expanded) / run


@dataclass
class Save:
    """A checkpoint being written; ``finish`` completes its ``event``."""

    path: Path
    event: dict[str, Any]
    future: Any = None  # async_save's future; None: written synchronously
    done_s: list[float] = field(default_factory=list)


def start(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    path: Path,
    event: dict[str, Any],
    t0: float,
    group: Any = None,
    use_async: bool = True,
) -> Save:
    """Save ``model`` and ``optimizer`` to ``path``; returns once training may go on."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, optimizer)
    save = Save(path, event)
    if use_async:
        save.future = dcp.async_save(
            {"model": msd, "optim": osd}, checkpoint_id=str(path), process_group=group
        )
        save.future.add_done_callback(lambda _: save.done_s.append(time.time() - t0))
    else:
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(path))
        save.done_s.append(time.time() - t0)
    return save


def latest(root: Path) -> tuple[int, Path] | None:
    """The newest complete checkpoint under ``root`` (``step<N>`` folders whose DCP metadata,
    written last, is there): (N, path), or None. A write cut short (a job killed for a
    requeue while writing) has no metadata and is skipped."""
    done = [
        (int(p.name[4:]), p)
        for p in Path(root).glob("step*")
        if p.name[4:].isdigit() and (p / ".metadata").is_file()
    ]
    return max(done) if done else None


def load(model: torch.nn.Module, optimizer: torch.optim.Optimizer, path: Path) -> None:
    """Load a checkpoint written by :func:`start` into ``model`` and ``optimizer`` (every rank
    reads its shard; the optimizer's states are initialised first so DCP has them to fill)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    msd, osd = get_state_dict(model, optimizer)
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
    )


def bytes_written(path: Path, rank: int) -> int:
    """Bytes of the files this rank wrote into the DCP directory ``path`` (its ``__<rank>_*``
    shards; rank 0 also the metadata), so a sum over ranks counts each file once whether the
    directory is shared or node-local."""
    own = [f for f in path.glob(f"__{rank}_*") if f.is_file()]
    if rank == 0:
        own += [f for f in path.iterdir() if f.is_file() and not f.name.startswith("__")]
    return sum(f.stat().st_size for f in own)


def finish(save: Save, rank: int, world: int, keep: bool, group: Any = None) -> None:
    """Wait for the write, record ``written_s`` (rank 0's end) and ``bytes`` (all ranks) in the
    event, and remove the checkpoint unless kept."""
    if save.future is not None:
        save.future.result()
    size = torch.tensor([bytes_written(save.path, rank)], dtype=torch.int64)
    if world > 1:
        torch.distributed.all_reduce(size, group=group)  # a gloo group: CPU tensors
    save.event.update(
        {
            "written_s": save.done_s[0] if save.done_s else None,
            "bytes": int(size.item()),
            "async": save.future is not None,
        }
    )
    if rank == 0 and not keep:
        shutil.rmtree(save.path, ignore_errors=True)
        with contextlib.suppress(OSError):
            save.path.parent.rmdir()  # only if no other checkpoint lives there
