"""Round 17 of the library's red team, sampling and training: what the hunt in the samplers, the sum tree, the
training loop, seed logs, the distributed helpers and the variance helpers found.

Each defect's test fails on the code before its fix.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from sazo_lite.samplers import PlainSAZOSampler, SAZOSampler, StaleCorrectedSAZOSampler
from test_library_round16_sampling import _trained


def _plain_prior(sampler) -> float:
    """The prior in G's units from the estimates and counts alone: sqrt(mean G²) ("abs", s = G) or mean G
    ("square", s = sqrt(G), s̄² = mean s²) over the examples seen."""
    g = sampler.estimates.double()[sampler.counts > 0]
    return float(g.mean()) if sampler.statistic == "square" else float((g * g).mean().sqrt())


# --- 1. prior() after a statistic switch ------------------------------------------------------------------------
@pytest.mark.parametrize("make, switch", [
    (lambda: SAZOSampler(24, seed=1), "square"),
    (lambda: SAZOSampler(24, sum_tree=True, statistic="square", seed=1), "abs"),
    (lambda: StaleCorrectedSAZOSampler(24, seed=1), "square"),
], ids=["abs to square", "square to abs (tree)", "stale-corrected"])
def test_prior_follows_a_statistic_switched_between_steps_at_once(make, switch):
    """Round 16 made a statistic change sum the scores again at the next draw, update, probs or scores; prior()
    read the running Σ s² without that check, so right after the switch it reported s̄ of the old statistic in
    the new one's units (1.50 where the scores give 1.00)."""
    sampler = _trained(make())
    assert sampler.prior() == pytest.approx(_plain_prior(sampler), rel=1e-9)
    sampler.statistic = switch
    assert sampler.prior() == pytest.approx(_plain_prior(sampler), rel=1e-9)


@pytest.mark.parametrize("make", [lambda: SAZOSampler(8), lambda: PlainSAZOSampler(8)], ids=["robust", "plain"])
def test_decay_checks_ema_decay_set_between_steps(make):
    """decay() is 'the EMA decay the next update applies'; an ema_decay of −0.5 set between steps was returned
    as −0.5 while the next update refuses it."""
    sampler = make()
    sampler.ema_decay = -0.5
    with pytest.raises(ValueError, match="ema_decay"):
        sampler.decay([0, 1, 20])


# --- 2. train: an interrupted run resumed equals the uninterrupted one ------------------------------------------
import signal  # noqa: E402

from sazo_lite.course.problems import LeastSquares  # noqa: E402
from sazo_lite.engine import MeZO  # noqa: E402
from sazo_lite.noise import PlainNoise  # noqa: E402
from test_library_round8 import _InterruptedUpdate  # noqa: E402
from sazo_lite.samplers import OracleSampler, UniformSampler  # noqa: E402
from sazo_lite.train import History, NoiseScaledStep, train  # noqa: E402

_PROBLEM = LeastSquares(num_examples=40, dim=6, heterogeneity=1.5)
_SAMPLERS = {
    "sazo": lambda theta: SAZOSampler(40, seed=4),
    "sazo-tree": lambda theta: SAZOSampler(40, sum_tree=True, seed=4),
    "plain": lambda theta: PlainSAZOSampler(40, seed=4),
    "stale": lambda theta: StaleCorrectedSAZOSampler(40, seed=4),
    "oracle": lambda theta: OracleSampler(40, lambda: _PROBLEM.norms(theta), uniform_mix=0.1, seed=4),
    "uniform": lambda theta: UniformSampler(40, seed=4),
}


def _run(name, *, fold=False, noise=None):
    theta = _PROBLEM.initial_theta()
    optimizer = MeZO([theta], lr=0.01, eps=1e-4, seed=3, fold_updates=fold, noise=noise or PlainNoise())
    return theta, optimizer, _SAMPLERS[name](theta), NoiseScaledStep(warmup=3)


def _train(run, losses, steps, history=None):
    theta, optimizer, sampler, rule = run
    return train(optimizer, sampler, losses, steps, batch_size=3, progress=False, step_rule=rule, history=history)


def _same_run(run, reference, exact: bool = True) -> None:
    """θ, the sampler's state and the step rule's state bit for bit as the reference run's; not ``exact``: the same
    draws (generator and counts) and θ to rounding (MeZO puts θ back from θ − εz by adding εz: exact up to the
    rounding of those adds, docs/guarantees.md)."""
    if not exact:
        assert torch.allclose(run[0], reference[0], rtol=1e-9, atol=1e-12)
        mine, theirs = run[2].state_dict(), reference[2].state_dict()
        assert torch.equal(mine["generator"], theirs["generator"])
        if "counts" in mine:
            assert torch.equal(mine["counts"], theirs["counts"])
        return
    assert torch.equal(run[0], reference[0])
    mine, theirs = run[2].state_dict(), reference[2].state_dict()
    assert mine.keys() == theirs.keys()
    for key in mine:
        a, b = mine[key], theirs[key]
        if isinstance(a, dict):
            assert a.keys() == b.keys() and all(
                torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a)
        else:
            assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
    assert run[3].state_dict() == reference[3].state_dict()


@pytest.mark.parametrize("fold", [False, True], ids=["plain", "folded"])
@pytest.mark.parametrize("call", [1, 2], ids=["first pass", "second pass"])
@pytest.mark.parametrize("name", list(_SAMPLERS))
def test_a_step_interrupted_in_its_closure_is_drawn_again_when_the_run_resumes(name, call, fold):
    """MeZO puts θ back and keeps its step count when the closure raises (Ctrl-C in a forward pass), so the next
    step takes the same z; the sampler's generator had drawn that step's batch, and the resumed run's next draw
    was the one after it: 30 steps interrupted at step 13 and resumed ended 0.12 away from the uninterrupted θ."""
    reference = _run(name, fold=fold)
    _train(reference, lambda i: _PROBLEM.losses(reference[0], i), 30)
    run, calls = _run(name, fold=fold), []

    def losses(indices):
        calls.append(1)
        if len(calls) == 2 * 13 + call:
            raise KeyboardInterrupt
        return _PROBLEM.losses(run[0], indices)

    history = History()
    with pytest.raises(KeyboardInterrupt):
        _train(run, losses, 30, history)
    assert len(history.loss) == run[1].step_count == 13
    _train(run, losses, 30 - 13)
    _same_run(run, reference, exact=call == 1)   # the first pass's θ + εz is put back exactly here


@pytest.mark.parametrize("name", ["sazo", "oracle", "plain"])
def test_a_ctrl_c_during_the_update_pass_feeds_the_sampler_and_the_step_rule(name):
    """The update pass holds Ctrl-C until it is done, so the step commits and KeyboardInterrupt leaves step():
    train recorded the step but neither the sampler nor the step rule saw it, and the resumed run parted from the
    uninterrupted one (the sampler without that step's diffs)."""
    reference = _run(name)
    _train(reference, lambda i: _PROBLEM.losses(reference[0], i), 20)
    run = _run(name, noise=_InterruptedUpdate(at=3 * 7))   # the 7th step's update pass
    history = History()
    with pytest.raises(KeyboardInterrupt):
        _train(run, lambda i: _PROBLEM.losses(run[0], i), 20, history)
    assert len(history.loss) == run[1].step_count == 7 and run[3].seen == 7
    _train(run, lambda i: _PROBLEM.losses(run[0], i), 20 - 7)
    _same_run(run, reference)


# --- 3. NoiseScaledStep: settings set between steps ---------------------------------------------------------------
@pytest.mark.parametrize("name, value", [("max_scale", 0.5), ("decay", 1.5), ("decay", math.nan), ("warmup", 0),
                                         ("decay", True)])
def test_noise_scaled_step_checks_a_setting_set_between_steps_before_reading_it(name, value):
    """The settings were checked at construction only: max_scale = 0.5 set later halved every rate (the clip's
    bounds crossed), decay = 1.5 or NaN drove the running mean off (NaN: the scale stuck at 1/max_scale)."""
    rule = NoiseScaledStep(warmup=2)
    for g in (2.0, 2.0, 1.0, 1.0):
        rule.observe(g)
    before = rule.state_dict()
    setattr(rule, name, value)
    for call in (rule.scale, lambda: rule.observe(1.0), rule.state_dict):
        with pytest.raises(ValueError, match=name):
            call()
    assert (rule.seen, rule.reference, rule.mean) == (before["seen"], before["reference"], before["mean"])


# --- 4. SeedLog: weights written between recorded steps ------------------------------------------------------------
from sazo_lite.seedlog import SeedLog  # noqa: E402


def _writes():
    def clamp(theta):
        with torch.no_grad():
            theta.clamp_(max=0.05)

    def data(theta):
        theta.data.copy_(theta.data * 0.5)   # .data: no version bump

    def numpy(theta):
        theta.detach().numpy()[1] += 1e-12   # one entry, a tiny change

    return {"clamp_": clamp, ".data": data, "numpy": numpy}


def _logged(fold=False):
    theta = torch.linspace(-1.0, 1.0, 6, dtype=torch.float64)
    start = theta.clone()
    optimizer = MeZO([theta], lr=0.05, eps=1e-3, seed=3, fold_updates=fold, noise=PlainNoise())
    return theta, start, optimizer, SeedLog.attach(optimizer)


def _loss(theta):
    return lambda: (theta - 0.3).pow(2)


@pytest.mark.parametrize("write", list(_writes()))
@pytest.mark.parametrize("when", ["after steps", "after attach"])
def test_a_seed_log_refuses_a_step_after_the_weights_were_written_between_steps(write, when):
    """A log records steps only: θ written between steps was left out, and the replay rebuilt another θ without
    a word (a clamp_ between steps: replay 0.27 off). The next step is refused now, before anything moves."""
    theta, start, optimizer, log = _logged()
    if when == "after steps":
        for _ in range(3):
            optimizer.step(_loss(theta))
    _writes()[write](theta)
    written, steps = theta.clone(), optimizer.step_count
    with pytest.raises(ValueError, match="Invalid weights"):
        optimizer.step(_loss(theta))
    assert torch.equal(theta, written) and optimizer.step_count == steps and log.num_steps == steps


@pytest.mark.parametrize("fold", [False, True], ids=["plain", "folded"])
def test_a_seed_log_still_records_flushes_failed_steps_and_train_runs_and_replays_them_bit_for_bit(fold):
    """No step refused that the log can replay: a folded run flushed between steps (train's evaluate), steps whose
    closure raised after one or two passes (θ put back, as replayed), a SAZO train run with a step rule."""
    theta, start, optimizer, log = _logged(fold)
    calls = []

    def losses(indices):
        calls.append(1)
        if len(calls) in (7, 14):   # the 4th step's first pass, then (next call of train) its 4th step's second
            raise RuntimeError("a failing forward")
        return (theta - 0.3).pow(2)[indices % 6]

    sampler, rule = SAZOSampler(6, seed=2), NoiseScaledStep(warmup=2)
    for _ in range(3):
        try:
            train(optimizer, sampler, losses, 10, batch_size=2, progress=False, step_rule=rule,
                  evaluate=lambda: float((theta - 0.3).pow(2).mean()), log_every=3)
        except RuntimeError:
            pass
    optimizer.flush()
    replayed = start.clone()
    SeedLog.from_bytes(log.to_bytes()).replay([replayed])
    assert optimizer.step_count == 3 + 3 + 10 and torch.equal(replayed, theta)


def test_a_hook_that_moves_theta_after_the_log_saw_the_step_is_caught_at_the_next_step():
    """A step hook registered after the log that writes θ (a projection onto a ball): the log recorded the step
    before the write, and its replay missed every projection."""
    theta, start, optimizer, log = _logged()

    def project(optimizer, event):
        with torch.no_grad():
            theta.clamp_(-0.5, 0.5)

    optimizer.register_step_hook(project)
    optimizer.step(_loss(theta))
    with pytest.raises(ValueError, match="Invalid weights"):
        optimizer.step(_loss(theta))


# --- guards (no defect found): plain references on random inputs ---------------------------------------------------
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from sazo_lite.sumtree import SumTree  # noqa: E402

_SIZES = st.sampled_from([0.0, 1e-300, 1e-30, 1e-3, 1.0, 7.5, 1e30, 1e300])


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 40), data=st.data())
def test_sum_tree_against_a_plain_array_under_random_updates(n, data):
    """After every update (repeated indices: the last write wins, as numpy's), each internal node is the sum of its
    children, the leaves are the array, and the tree equals one built from the array."""
    weights = np.array(data.draw(st.lists(_SIZES, min_size=n, max_size=n)))
    tree, plain = SumTree(torch.from_numpy(weights.copy())), weights.copy()
    for _ in range(data.draw(st.integers(1, 5))):
        indices = data.draw(st.lists(st.integers(0, n - 1), max_size=6))
        values = data.draw(st.lists(_SIZES, min_size=len(indices), max_size=len(indices)))
        tree.update(torch.tensor(indices, dtype=torch.long), torch.tensor(values, dtype=torch.float64))
        for i, v in zip(indices, values):
            plain[i] = v
        nodes = tree.tree.numpy()
        assert np.array_equal(nodes[n:], plain)
        assert all(nodes[k] == nodes[2 * k] + nodes[2 * k + 1] for k in range(1, n))
        assert np.array_equal(nodes[1:], SumTree(torch.from_numpy(plain.copy())).tree.numpy()[1:])


_RULES_TO_FUZZ = {
    "sazo": lambda n, tree, mix: SAZOSampler(n, sum_tree=tree, uniform_mix=mix, seed=n),
    "sazo-square": lambda n, tree, mix: SAZOSampler(n, sum_tree=tree, uniform_mix=mix, statistic="square", seed=n),
    "plain": lambda n, tree, mix: PlainSAZOSampler(n, sum_tree=tree, uniform_mix=mix, seed=n),
    "stale": lambda n, tree, mix: StaleCorrectedSAZOSampler(n, uniform_mix=mix, seed=n),
}


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(list(_RULES_TO_FUZZ)), n=st.integers(1, 9), tree=st.booleans(),
       mix=st.sampled_from([1e-6, 0.1, 1.0]), data=st.data())
def test_sampler_probs_and_weights_against_a_plain_reference_on_random_feedback(name, n, tree, mix, data):
    """p from the scores by the plain formula, weights 1/(N·p) of the drawn indices, and E_p[w·g] = mean(g) by
    exact enumeration, after feedback of every size (zeros, 1e-300, 1e15, repeated indices)."""
    sampler = _RULES_TO_FUZZ[name](n, tree, mix)
    generator = np.random.default_rng(n)
    for _ in range(data.draw(st.integers(0, 6))):
        indices = data.draw(st.lists(st.integers(0, n - 1), max_size=5))
        scale = data.draw(st.sampled_from([0.0, 1e-300, 1.0, 1e15]))   # the plain rule refuses d² past float32
        diffs = torch.from_numpy(generator.normal(size=len(indices)) * scale)
        sampler.update(torch.tensor(indices, dtype=torch.long), diffs)
        probs, scores = sampler.probs.numpy(), sampler.scores().numpy()
        total = scores.sum()
        reference = (1 - mix) * scores / total + mix / n if total > 0 else np.full(n, 1.0 / n)
        assert np.allclose(probs, reference, rtol=2e-6, atol=0)
        g = generator.normal(size=n)
        assert (probs * (1.0 / (n * probs)) * g).sum() == pytest.approx(g.mean(), abs=1e-12)
        drawn, weights = sampler.sample(8)
        assert torch.allclose(weights, 1.0 / (n * torch.from_numpy(probs)[drawn]), rtol=1e-12)


def test_noise_scaled_step_with_numpy_settings_set_between_steps_writes_a_state_torch_load_reads(tmp_path):
    """A numpy float32 decay (a schedule computed with numpy) ran the mean in float32 (NumPy 2 keeps float32 ×
    Python float in float32) and the state held numpy scalars, which torch.load(weights_only=True), its default,
    refused. The settings are used and recorded as the Python numbers the checks return."""
    rule, plain = NoiseScaledStep(warmup=2), NoiseScaledStep(warmup=2, decay=float(np.float32(0.9)))
    rule.decay, rule.warmup = np.float32(0.9), np.int64(2)
    for g in (2.0, 1.0, 0.3, 0.7, 1.9):
        rule.observe(g)
        plain.observe(g)
    assert type(rule.mean) is float and rule.mean == plain.mean
    torch.save(rule.state_dict(), tmp_path / "rule.pt")
    state = torch.load(tmp_path / "rule.pt", weights_only=True)
    resumed = NoiseScaledStep(warmup=2, decay=float(np.float32(0.9)))
    resumed.load_state_dict(state)
    assert resumed.scale() == plain.scale()


# --- 5. queries_to_target: counts and values of other lengths ---------------------------------------------------
from sazo_lite.train import queries_to_target  # noqa: E402


def test_queries_to_target_refuses_counts_and_values_of_other_lengths():
    """(history.queries, history.metrics): per-step counts zipped with per-log-point values paired the k-th value
    with the k-th step's count, so a target met at the 3rd log point (60 queries) read 6, silently."""
    theta = _PROBLEM.initial_theta()
    history = train(MeZO([theta], lr=0.05, eps=1e-4, seed=0), SAZOSampler(40, seed=0),
                    lambda i: _PROBLEM.losses(theta, i), 30, batch_size=1, log_every=10, progress=False,
                    evaluate=lambda: _PROBLEM.gap(theta))
    target = history.metrics[-1]
    assert queries_to_target(history, target) in history.logged_queries
    with pytest.raises(ValueError, match="Invalid record"):
        queries_to_target((history.queries, history.metrics), target)
    assert queries_to_target(([0, 10], []), 1.0) is None   # no values: never reached, as before


# --- 6. the distribution check's tolerance for half-precision vectors ----------------------------------------------
from sazo_lite.samplers import Sampler  # noqa: E402
from sazo_lite.variance import distribution, tv_distance, variance_ratio  # noqa: E402


class _HalfProbs(Sampler):
    """A sampler whose probs are a float16 vector summing to ``total``."""

    def __init__(self, n, total):
        super().__init__(n)
        self.total = total

    @property
    def probs(self):
        return torch.full((self.num_examples,), self.total / self.num_examples, dtype=torch.float16)


@pytest.mark.parametrize("dtype, n", [(torch.bfloat16, 256), (torch.bfloat16, 4096), (torch.float16, 20_000)])
def test_a_half_precision_vector_far_from_summing_to_1_is_no_distribution(dtype, n):
    """8·sqrt(n)·eps passed 1 for half precision (bfloat16 from n = 256, float16 from 16,384), so a vector summing
    to 1.9 was read as p: a TV of 0.45 against uniform, V(p)/V(p*) of 0.65 (below its minimum, 1)."""
    scores = torch.full((n,), 1.9 / n, dtype=dtype)
    with pytest.raises(ValueError, match="Invalid p: entries sum to"):
        tv_distance(scores, torch.full((n,), 1.0 / n))
    with pytest.raises(ValueError, match="Invalid probs: entries sum to"):
        variance_ratio(torch.rand(n, dtype=torch.float64) + 0.1, scores)
    softmax = torch.softmax(torch.randn(n, generator=torch.Generator().manual_seed(0)), 0).to(dtype)
    assert distribution("probs", softmax, n).sum().item() == pytest.approx(1.0, abs=1e-2)   # rounding still passes


def test_a_sampler_whose_float16_probs_sum_to_1_5_does_not_draw():
    """multinomial normalised the float16 probs and the weights 1/(N·p) came out 2/3 of 1: E[w·f] = 2F/3."""
    with pytest.raises(ValueError, match="Invalid probs"):
        _HalfProbs(20_000, 1.5).sample(4)
    indices, weights = _HalfProbs(20_000, 1.0).sample(4)
    assert torch.allclose(weights, torch.ones(4, dtype=torch.float64), rtol=1e-3)
