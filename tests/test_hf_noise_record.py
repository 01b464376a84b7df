"""ZOTrainer's check of a checkpoint's optimizer.pt loads it into stand-ins: that says nothing about the run's z.

Since MeZO's state records its noise source, the stand-ins (noise=None) warned NoiseSourceWarning for every
checkpoint whose MeZO drew z from a table (the default on CPU models of 2^20 entries and more)."""
import warnings

import torch

from sazo_lite.engine import MeZO, NoiseSourceWarning
from sazo_lite.hf import ZOTrainer
from sazo_lite.noise import GaussianTable


def test_the_checkpoint_check_does_not_warn_of_the_stand_ins_noise(tmp_path):
    theta = torch.zeros(8)
    opt = MeZO([theta], lr=0.1, eps=1e-3, seed=3, noise=GaussianTable(size=1024, chunk=256, seed=5))
    opt.step(lambda: (theta - 1).pow(2))
    torch.save(opt.state_dict(), tmp_path / "optimizer.pt")
    torch.save({}, tmp_path / "scheduler.pt")
    with warnings.catch_warnings():
        warnings.simplefilter("error", NoiseSourceWarning)
        groups, seed = ZOTrainer._saved_optimizer(str(tmp_path))
    assert seed == opt.state_dict()["state"][0]["seed"] and len(groups) == 1
    # the record is there, and a MeZO with another source is told
    assert "gaussian-table" in opt.state_dict()["noise"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        MeZO([torch.zeros(8)], lr=0.0, noise=None).load_state_dict(torch.load(tmp_path / "optimizer.pt"))
    assert any(issubclass(w.category, NoiseSourceWarning) for w in caught)
