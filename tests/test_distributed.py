"""Data-parallel ZO: 2 gloo processes match one process; a crashed rank fails the job fast."""
import os
import socket
import subprocess
import sys
import time

import pytest
import torch

from sazo_lite import distributed


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(tmp_path, *args, timeout=120):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
           f"--master_port={free_port()}", "-m", "sazo_lite.distributed", *args]
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=tmp_path)
    return proc, time.monotonic() - start


def test_two_gloo_ranks_match_a_single_process(tmp_path):
    proc, _ = torchrun(tmp_path, "--steps", "20", "--out", str(tmp_path / "w.pt"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    parallel = torch.load(tmp_path / "w.pt")
    single = distributed.run_demo(steps=20)
    initial = distributed._demo_problem()[0].state_dict()
    for name in single:
        assert torch.allclose(parallel[name], single[name], rtol=1e-5, atol=1e-6), name
        assert not torch.equal(single[name], initial[name])  # training moved the weights


def test_a_crashed_rank_fails_the_job_with_a_clear_error(tmp_path):
    proc, elapsed = torchrun(tmp_path, "--steps", "20", "--crash-rank", "1", "--crash-step", "5",
                             "--timeout", "20")
    assert proc.returncode != 0
    assert "rank 1 crashed on purpose" in proc.stderr + proc.stdout
    assert elapsed < 100


def test_shard_and_communication_table():
    idx = torch.arange(8)
    assert torch.equal(torch.cat([distributed.shard(idx, r, 2) for r in range(2)]), idx)
    with pytest.raises(ValueError, match="batch_size"):
        distributed.shard(torch.arange(7), 0, 2)
    table = distributed.communication_bytes(batch_size=16, num_params=134_515_008, world_size=8)
    assert table["ddp"] / table["zo"] > 1e6


@pytest.mark.parametrize("rank, world_size", [(2, 2), (-1, 2), (0, 0), (1.0, 2), (True, 2)])
def test_a_rank_outside_the_world_raises_instead_of_an_empty_shard(rank, world_size):
    # issue 17: shard(idx, rank=2, world_size=2) used to return an empty block (that rank trained on nothing)
    with pytest.raises(ValueError, match="Invalid (rank|world_size)"):
        distributed.shard(torch.arange(8), rank, world_size)
