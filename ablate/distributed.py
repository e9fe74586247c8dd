"""One job across several processes (``accelerate launch``, ``torchrun``): which process this is, and the few
collective steps a run takes.

The launcher sets ``WORLD_SIZE`` and ``RANK`` in every process's environment; nothing else here needs Accelerate
until a collective step runs, which joins the job's process group (Accelerate's ``PartialState``: gloo on CPUs,
NCCL on GPUs; the Trainer joins the same one). With one process, every function is a no-op that returns its input
and no process group is made, so a single-process run is exactly what it was.

What the run does with them: rank 0 alone writes the run folder, the W&B run and the checkpoints' metadata
(:func:`is_main`); caches are built by rank 0 first and read by the others (:func:`main_first`); the evaluation
samples and scores a contiguous block of the prompts on each rank (:func:`shard`) and gathers the rows in
prompt order (:func:`gather_rows`), so every prompt is scored once and the rows are those of one process.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


def world_size() -> int:
    """How many processes run this job (1 unless a launcher says otherwise)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    """This process's index among them (0: the one that writes)."""
    return int(os.environ.get("RANK", "0"))


def is_main() -> bool:
    return rank() == 0


def _group() -> None:
    """Join the job's process group (once; Accelerate reads the launcher's environment)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        from accelerate import PartialState

        PartialState()


def broadcast(obj: Any) -> Any:
    """Rank 0's ``obj`` in every process (any picklable object)."""
    if world_size() == 1:
        return obj
    import torch.distributed as dist

    _group()
    box = [obj if is_main() else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather(obj: Any) -> list[Any]:
    """Every process's ``obj``, in rank order, in every process."""
    if world_size() == 1:
        return [obj]
    import torch.distributed as dist

    _group()
    out: list[Any] = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    if world_size() > 1:
        import torch.distributed as dist

        _group()
        dist.barrier()


@contextmanager
def main_first() -> Iterator[None]:
    """Rank 0 runs the block, then the others do (a cache rank 0 built is then a hit for them)."""
    if world_size() == 1:
        yield
        return
    if not is_main():
        barrier()
    yield
    if is_main():
        barrier()


def close() -> None:
    """Leave the job's process group, if this process joined one (before the interpreter exits: a gloo group left
    open can abort the process at exit)."""
    import torch.distributed as dist

    if world_size() > 1 and dist.is_initialized():
        dist.destroy_process_group()


def shard(n: int) -> range:
    """This process's contiguous block of ``range(n)``: blocks in rank order, sizes differing by at most one."""
    size, r = world_size(), rank()
    start = r * (n // size) + min(r, n % size)
    return range(start, start + n // size + (r < n % size))


def gather_rows(columns: dict[str, list]) -> dict[str, list]:
    """Columns of per-row values, each process holding its shard's rows: every column of every process,
    concatenated in rank order (the rows in the order of one process)."""
    if world_size() == 1:
        return columns
    parts = gather(columns)
    return {k: [v for part in parts for v in part[k]] for k in columns}
