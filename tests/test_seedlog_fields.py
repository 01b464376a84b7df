"""A seed log's header names only the fields a log is written with: a renamed field is a changed file.

Before, a flipped byte in the name "sha256" read the log as one written before the digest existed, so records
changed on disk replayed another θ without a word; a flipped byte in "devices" dropped the device check."""
import json

import numpy as np
import pytest
import torch

from sazo_lite import MeZO, SeedLog
from sazo_lite.seedlog import _RECORD


def _log_bytes() -> tuple[torch.Tensor, bytes, torch.Tensor]:
    theta = torch.randn(5, generator=torch.Generator().manual_seed(3))
    start = theta.clone()
    opt = MeZO([theta], lr=0.05, eps=1e-3, seed=7)
    log = SeedLog.attach(opt)
    for _ in range(4):
        opt.step(lambda: (theta - 1.0).pow(2))
    return start, log.to_bytes(), theta


def _renamed(data: bytes, old: str, new: str, scale_g: float = 1.0) -> bytes:
    head, _, body = data.partition(b"\n")
    assert f'"{old}"'.encode() in head
    head = head.replace(f'"{old}"'.encode(), f'"{new}"'.encode(), 1)
    table = np.frombuffer(body, dtype=_RECORD).copy()
    table["value"][-1] *= scale_g
    return head + b"\n" + table.tobytes()


def test_a_log_with_its_digest_field_renamed_and_a_record_changed_is_refused():
    _, data, _ = _log_bytes()
    with pytest.raises(ValueError, match="unknown header field 'sha2d6'"):
        SeedLog.from_bytes(_renamed(data, "sha256", "sha2d6", scale_g=1.5))


@pytest.mark.parametrize("field", ["format", "optimizer", "eps", "base_seed", "start_step", "directions", "groups",
                                   "records", "sha256"])
def test_every_header_field_renamed_is_refused(field):
    _, data, _ = _log_bytes()
    with pytest.raises(ValueError, match="Invalid seed log"):
        SeedLog.from_bytes(_renamed(data, field, field[:-1] + "X"))


@pytest.mark.parametrize("field", ["perturbation", "shapes", "dtypes", "devices"])
def test_every_group_field_renamed_is_refused(field):
    _, data, _ = _log_bytes()
    with pytest.raises(ValueError, match="Invalid seed log: param group"):
        SeedLog.from_bytes(_renamed(data, field, field[:-1] + "X"))


def test_a_log_as_written_still_reads_and_replays():
    start, data, tuned = _log_bytes()
    header = json.loads(data.partition(b"\n")[0])
    assert set(header) >= {"sha256", "records", "groups"}
    replica = start.clone()
    SeedLog.from_bytes(data).replay([replica])
    assert torch.equal(replica, tuned) and not torch.equal(replica, start)
