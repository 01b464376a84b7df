"""The benchmarks' diagnosis samplers whose norms read θ declare it, so a folded MeZO is flushed before them."""
import torch

from benchmarks.queries import InformedSampler, NoiselessSAZO, SmoothedOracle
from sazo_lite import MeZO
from sazo_lite.train import train

_MAKERS = {
    "informed-fresh": lambda n, norms: InformedSampler(n, norms, stale=False, seed=1),
    "informed-stale": lambda n, norms: InformedSampler(n, norms, stale=True, seed=1),
    "noiseless": lambda n, norms: NoiselessSAZO(n, norms, seed=1),
    "smoothed": lambda n, norms: SmoothedOracle(n, norms, horizon=3.0, seed=1),
}


def _run(kind: str, fold: bool) -> torch.Tensor:
    """θ after 15 steps of least squares (24 examples) with a sampler fed the true norms at θ."""
    data = torch.Generator().manual_seed(0)
    x, y = torch.randn(24, 3, generator=data, dtype=torch.float64), torch.randn(24, generator=data, dtype=torch.float64)
    theta = torch.zeros(3, dtype=torch.float64)
    sampler = _MAKERS[kind](24, lambda: (x @ theta - y).abs() * x.norm(dim=1))
    opt = MeZO([theta], lr=0.02, eps=1e-3, seed=4, fold_updates=fold)
    train(opt, sampler, lambda idx: (x[idx] @ theta - y[idx]) ** 2, 15, batch_size=4, progress=False)
    return theta


def test_each_sampler_that_reads_theta_runs_folded_as_unfolded():
    """Read at θ − εz (the fold's pending update) they drew other examples: the folded run left the unfolded one."""
    for kind in _MAKERS:
        assert torch.equal(_run(kind, True), _run(kind, False)), kind
