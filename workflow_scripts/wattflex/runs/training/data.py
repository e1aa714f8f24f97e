"""Token batches: pre-tokenised shards from local files, or synthetic tokens.

Shards are parquet files, or Arrow IPC files (what ``datasets.save_to_disk`` writes),
with one column of token-id lists (``input_ids`` or ``tokens``). Documents are packed
into one stream and cut into ``seq_len`` windows (no padding, no loss masking); data-
parallel rank ``r`` of ``w`` takes every ``w``-th batch. The stream cycles when exhausted
(a 30-minute power measurement must not stop for lack of data).

Synthetic tokens are learnable on purpose (arithmetic progressions modulo the vocabulary
with a per-sequence start and stride), so a few steps of training visibly lower the loss.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

TOKEN_COLUMNS = ("input_ids", "tokens")
SHARD_SUFFIXES = (".parquet", ".arrow")


def synthetic_batches(
    vocab: int, seq_len: int, batch: int, seed: int, rank: int = 0
) -> Iterator[torch.Tensor]:
    """Endless synthetic ``[batch, seq_len]`` token batches (arithmetic runs of ids under ``vocab``),
    the same for the same ``seed`` and ``rank``.
    """
    rng = np.random.default_rng([seed, rank])
    pos = np.arange(seq_len)
    while True:
        start = rng.integers(0, vocab, size=(batch, 1))
        stride = rng.integers(1, 4, size=(batch, 1))
        yield torch.from_numpy((start + stride * pos) % vocab).long()


def shard_files(path: str | Path) -> list[Path]:
    """The token shards at ``path``: the file itself, or the ``.parquet``/``.arrow`` files under it.

    Raises FileNotFoundError when there are none.
    """
    p = Path(path)
    files = [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.suffix in SHARD_SUFFIXES)
    if not files:
        raise FileNotFoundError(f"{path}: no {'/'.join(SHARD_SUFFIXES)} shards of token ids found")
    return files


def _token_arrays(path: Path) -> Iterator[np.ndarray]:
    """Flat token-id arrays from one shard, a record batch at a time (bounded memory)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if path.suffix == ".parquet":
        pf = pq.ParquetFile(path)
        names = pf.schema_arrow.names
        col = next((c for c in TOKEN_COLUMNS if c in names), None)
        if col is None:
            raise ValueError(
                f"{path}: no token column (expected one of {TOKEN_COLUMNS}, found {names})"
            )
        batches = pf.iter_batches(columns=[col])
    else:
        with pa.memory_map(str(path)) as src:
            try:
                table = pa.ipc.open_stream(src).read_all()
            except pa.ArrowInvalid:
                table = pa.ipc.open_file(src).read_all()
        col = next((c for c in TOKEN_COLUMNS if c in table.column_names), None)
        if col is None:
            raise ValueError(
                f"{path}: no token column (expected one of {TOKEN_COLUMNS}, found {table.column_names})"
            )
        batches = table.select([col]).to_batches()
    for rb in batches:
        arr = rb.column(0)
        yield np.asarray(arr.flatten() if hasattr(arr, "flatten") else arr, dtype=np.int64)


def shard_batches(
    path: str | Path, vocab: int, seq_len: int, batch: int, rank: int = 0, world: int = 1
) -> Iterator[torch.Tensor]:
    """``[batch, seq_len]`` token tensors packed from the shards under ``path``, cycling."""
    files = shard_files(path)
    need = batch * seq_len
    index = 0
    while True:
        buf = np.empty(0, dtype=np.int64)
        produced = False
        for f in files:
            for arr in _token_arrays(f):
                if arr.size and (arr.min() < 0 or arr.max() >= vocab):
                    raise ValueError(
                        f"{f}: token ids outside [0, {vocab}) — shards tokenised for another vocabulary?"
                    )
                buf = np.concatenate([buf, arr])
                while buf.size >= need:
                    chunk, buf = buf[:need], buf[need:]
                    if index % world == rank:
                        produced = True
                        yield torch.from_numpy(chunk.reshape(batch, seq_len).copy())
                    index += 1
        if not produced:
            raise ValueError(
                f"{path}: fewer than {need * world} tokens; cannot fill one batch per rank"
            )


def batches(
    data_path: str | None,
    vocab: int,
    seq_len: int,
    batch: int,
    seed: int,
    rank: int = 0,
    world: int = 1,
) -> Iterator[torch.Tensor]:
    """Endless ``[batch, seq_len]`` token batches for ``rank`` of ``world``: from the shards at
    ``data_path``, or synthetic ones when it is None.
    """
    if data_path is None:
        return synthetic_batches(vocab, seq_len, batch, seed, rank)
    return shard_batches(data_path, vocab, seq_len, batch, rank, world)
