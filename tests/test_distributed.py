"""ablate.distributed: one process is a no-op; two real processes (gloo, spawned here) shard, gather in rank
order, broadcast rank 0's value, and run a main_first block on rank 0 before the others."""

from __future__ import annotations

import json
import os
import time

import pytest
import torch.multiprocessing as mp

from ablate import distributed
from tests.conftest import free_port


def test_one_process_is_a_no_op(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    assert distributed.world_size() == 1 and distributed.is_main()
    assert distributed.shard(5) == range(5)
    rows = {"a": [1, 2]}
    assert distributed.gather_rows(rows) is rows
    assert distributed.broadcast("x") == "x" and distributed.gather(3) == [3]
    with distributed.main_first():
        pass
    distributed.close()


@pytest.mark.parametrize("n", [0, 1, 4, 7, 128])
@pytest.mark.parametrize("size", [2, 3])
def test_shards_cover_in_order(monkeypatch, n, size):
    blocks = []
    for r in range(size):
        monkeypatch.setenv("WORLD_SIZE", str(size))
        monkeypatch.setenv("RANK", str(r))
        blocks.append(distributed.shard(n))
    assert [i for b in blocks for i in b] == list(range(n))
    assert max(map(len, blocks)) - min(map(len, blocks)) <= 1


def _worker(rank: int, size: int, port: int, out: str) -> None:
    os.environ.update(
        WORLD_SIZE=str(size), RANK=str(rank), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    marker = os.path.join(out, "built")
    with distributed.main_first():  # rank 0 builds; the others find it built when they enter
        seen = os.path.exists(marker)
        if distributed.is_main():
            time.sleep(0.5)  # a slow build: the others must still wait for it
            open(marker, "w").close()
    mine = list(distributed.shard(7))
    result = {
        "seen_built": seen,
        "rows": distributed.gather_rows({"i": mine, "r": [rank] * len(mine)}),
        "broadcast": distributed.broadcast(f"from {rank}"),
    }
    with open(os.path.join(out, f"{rank}.json"), "w") as f:
        json.dump(result, f)
    distributed.close()


@pytest.mark.slow
def test_two_processes(tmp_path):
    mp.spawn(_worker, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    r0, r1 = (json.loads((tmp_path / f"{r}.json").read_text()) for r in (0, 1))
    assert r0["seen_built"] is False and r1["seen_built"] is True
    assert r0["rows"] == r1["rows"] == {"i": list(range(7)), "r": [0, 0, 0, 0, 1, 1, 1]}
    assert r0["broadcast"] == r1["broadcast"] == "from 0"
