"""A SeedLog's check of writes between steps reads every tuned entry: a one-entry write in a large float32 or
bfloat16 tensor, in its last partial block or in a column block of a fused weight, refuses the next step."""
import pytest
import torch

from sazo_lite import MeZO
from sazo_lite.seedlog import SeedLog


def _run(tensors):
    optimizer = MeZO(tensors, lr=1e-3, eps=1e-3, seed=5)
    log = SeedLog.attach(optimizer)
    loss = lambda: sum(t.float().pow(2).mean() for t in tensors)
    optimizer.step(loss)
    return optimizer, log, loss


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("where", [0, 150_000, -1], ids=["first", "middle", "tail"])
def test_a_one_entry_write_in_a_large_tensor_refuses_the_next_step(dtype, where):
    theta = torch.randn(300_001, generator=torch.Generator().manual_seed(0)).to(dtype)   # not whole blocks
    optimizer, log, loss = _run([theta])
    with torch.no_grad():
        theta[where] += 0.01 * max(1.0, abs(float(theta[where])))
    with pytest.raises(ValueError, match="Invalid weights"):
        optimizer.step(loss)
    assert log.num_steps == 1


def test_a_write_in_a_column_block_of_a_fused_weight_refuses_the_next_step_and_its_neighbour_does_not():
    fused = torch.randn(64, 96, generator=torch.Generator().manual_seed(1))
    block = fused[:, 32:64]          # non-contiguous: tuned in place
    optimizer, log, loss = _run([block])
    with torch.no_grad():
        fused[5, 10] += 1.0          # outside the tuned block: not the log's business
    optimizer.step(loss)
    with torch.no_grad():
        fused[5, 40] += 1e-3         # inside it
    with pytest.raises(ValueError, match="Invalid weights"):
        optimizer.step(loss)
    assert log.num_steps == 2


def test_steps_alone_are_never_refused_and_replay_bit_for_bit():
    theta = torch.randn(5_000, generator=torch.Generator().manual_seed(2))
    start = theta.clone()
    optimizer, log, loss = _run([theta])
    for _ in range(5):
        optimizer.step(loss)
    replayed = start.clone()
    SeedLog.from_bytes(log.to_bytes()).replay([replayed])
    assert log.num_steps == 6 and torch.equal(replayed, theta)
