"""The training loop: samplers and optimiser meet through indices, weights and diffs."""
import pytest
import torch

import sazo_lite as sz
from sazo_lite.course.problems import LeastSquares


def samplers(problem, theta):
    return {"uniform": sz.UniformSampler(problem.num_examples, seed=1),
            "sazo": sz.SAZOSampler(problem.num_examples, seed=1),
            "oracle": sz.OracleSampler(problem.num_examples, lambda: problem.norms(theta), seed=1)}


@pytest.mark.parametrize("name", ["uniform", "sazo", "oracle"])
def test_two_closure_calls_per_step_and_query_count(name):
    problem = LeastSquares(32, 4, heterogeneity=1.0)
    theta = problem.initial_theta()
    sampler = samplers(problem, theta)[name]
    calls = []

    def batch_losses(idx):
        calls.append(len(idx))
        return problem.losses(theta, idx)

    history = sz.train(sz.MeZO([theta], lr=0.01), sampler, batch_losses, 25, batch_size=3,
                       evaluate=lambda: problem.gap(theta), log_every=10, record_probs=True, progress=False)
    assert calls == [3] * 50
    assert history.queries == [6 * (t + 1) for t in range(25)]
    assert history.logged_steps == [10, 20, 25] and len(history.metrics) == 3
    assert all(torch.isclose(p.sum(), torch.tensor(1.0, dtype=p.dtype)) for p in history.probs)


def test_training_reduces_the_gap_and_stops_early():
    problem = LeastSquares(64, 5, heterogeneity=0.5, seed=2)
    theta = problem.initial_theta()
    start = problem.gap(theta)
    history = sz.train(sz.MeZO([theta], lr=0.02, eps=1e-4), sz.SAZOSampler(64, seed=0),
                       lambda idx: problem.losses(theta, idx), 5000, batch_size=2,
                       evaluate=lambda: problem.gap(theta) / start, log_every=20,
                       stop_below=0.1, progress=False)
    assert history.metrics[-1] < 0.1
    assert len(history.loss) < 5000  # stopped early
    assert sz.queries_to_target(history, 0.1) == history.logged_queries[-1]
    assert sz.queries_to_target(history, -1.0) is None


def test_uniform_and_oracle_samplers():
    uniform = sz.UniformSampler(10, seed=0)
    idx, w = uniform.sample(1000)
    assert torch.equal(w, torch.ones(1000, dtype=torch.float64))
    assert idx.min() >= 0 and idx.max() < 10 and len(idx.unique()) == 10
    norms = torch.tensor([1.0, 3.0, 0.0, 6.0], dtype=torch.float64)
    oracle = sz.OracleSampler(4, lambda: norms, seed=0)
    assert torch.allclose(oracle.probs, norms / 10)
    idx, w = oracle.sample(20000)
    assert 2 not in idx.tolist()  # zero-norm examples are never needed by the oracle
    assert torch.allclose(w, 1 / (4 * oracle.probs[idx]))
    freq = torch.bincount(idx, minlength=4).double() / 20000
    assert torch.allclose(freq, oracle.probs, atol=0.02)


def test_sampler_state_round_trip_replays_draws():
    sampler = sz.UniformSampler(50, seed=3)
    sampler.sample(5)
    state = sampler.state_dict()
    first = sampler.sample(8)[0]
    other = sz.UniformSampler(50, seed=99)
    other.load_state_dict(state)
    assert torch.equal(other.sample(8)[0], first)
    with pytest.raises(ValueError, match="num_examples"):
        sz.UniformSampler(49).load_state_dict(state)


@pytest.mark.parametrize("make", [lambda: sz.UniformSampler(0), lambda: sz.SAZOSampler(-1),
                                  lambda: sz.OracleSampler(0, lambda: torch.ones(1))])
def test_num_examples_must_be_positive(make):
    with pytest.raises(ValueError, match="num_examples"):
        make()


def test_bad_batch_size_and_indices():
    sampler = sz.UniformSampler(5)
    with pytest.raises(ValueError, match="batch_size"):
        sampler.sample(0)
    with pytest.raises(ValueError, match="indices"):
        sampler.update(torch.tensor([0, 5]), torch.ones(2))
    with pytest.raises(ValueError, match="directional_diffs"):
        sampler.update(torch.tensor([0, 1]), torch.ones(3))
