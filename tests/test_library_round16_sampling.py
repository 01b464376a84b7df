"""Round 16 of the library's red team, sampling and training: what the hunt in the samplers, the sum tree, the
training loop, seed logs and the distributed closure found.

Each defect's test fails on the code before its fix.
"""
from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
import torch

from sazo_lite.engine import MeZO
from sazo_lite.samplers import OracleSampler, PlainSAZOSampler, Sampler, SAZOSampler, StaleCorrectedSAZOSampler
from sazo_lite.seedlog import _LR, _RECORD, _STEP, SeedLog
from sazo_lite.sumtree import SumTree
from sazo_lite.train import best_rate, past_edge, train
from sazo_lite.variance import distribution


def _trained(sampler, steps: int = 30, batch_size: int = 4, seed: int = 0):
    """``sampler`` after ``steps`` draws and updates with diffs whose size grows with the index."""
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        indices, _ = sampler.sample(batch_size)
        scale = (1.0 + indices.double()) ** 2
        sampler.update(indices, scale * torch.randn(batch_size, generator=generator, dtype=torch.float64))
    return sampler


def _draw_frequencies(sampler, draws: int = 200_000, batch_size: int = 2_000) -> np.ndarray:
    counts = np.zeros(sampler.num_examples)
    for _ in range(draws // batch_size):
        indices, _ = sampler.sample(batch_size)
        counts += np.bincount(indices.numpy(), minlength=sampler.num_examples)
    return counts / draws


# --- 1. a setting the store's sums are computed from, changed between steps ------------------------------------
# (statistic: s = G or sqrt(G); the stale correction's min_factor / max_factor: the clip of its factors)
_RESCORED = [
    ("tree statistic", lambda: SAZOSampler(24, sum_tree=True, seed=1), {"statistic": "square"}),
    ("cdf statistic", lambda: SAZOSampler(24, sum_tree=False, seed=1), {"statistic": "square"}),
    ("square to abs", lambda: SAZOSampler(24, sum_tree=True, statistic="square", seed=1), {"statistic": "abs"}),
    ("max_factor", lambda: StaleCorrectedSAZOSampler(24, growth_rate=0.5, seed=1), {"max_factor": 1.2}),
    ("min_factor", lambda: StaleCorrectedSAZOSampler(24, growth_rate=0.5, seed=1), {"min_factor": 1.0}),
]


@pytest.mark.parametrize("case, make, change", _RESCORED, ids=[c[0] for c in _RESCORED])
def test_a_scoring_setting_changed_between_steps_keeps_probs_a_distribution(case, make, change):
    """The store held sums of the scores under the old setting while ``probs`` and the weights read the new one:
    a statistic switched in tree mode gave ``probs`` summing to 0.92, a stale correction's max_factor set after a
    draw 1.3. The store is summed again when such a setting changes."""
    sampler = _trained(make())
    sampler.probs   # the store's sums (a CDF is kept from one read to the next refresh)
    for name, value in change.items():
        setattr(sampler, name, value)
    probs = sampler.probs
    assert abs(float(probs.sum()) - 1.0) < 1e-6
    indices, weights = sampler.sample(64)
    assert torch.allclose(weights, 1.0 / (24 * probs[indices]), rtol=1e-12)


@pytest.mark.parametrize("case, make, change", _RESCORED, ids=[c[0] for c in _RESCORED])
def test_after_a_scoring_setting_changes_draws_follow_the_probs_the_weights_assume(case, make, change):
    """Unbiasedness needs the draws to come from the p of the weights 1/(N·p): with the old sums the draws
    followed the old scores (an example drawn ~2× as often as its p said, its weight unchanged)."""
    sampler = _trained(make())
    sampler.probs
    for name, value in change.items():
        setattr(sampler, name, value)
    probs = sampler.probs.numpy()
    frequencies = _draw_frequencies(sampler)
    # 200k draws: each frequency within 5 standard errors of its p
    assert np.all(np.abs(frequencies - probs) <= 5 * np.sqrt(probs / 200_000) + 1e-9)


@pytest.mark.parametrize("case, make, change", _RESCORED, ids=[c[0] for c in _RESCORED])
def test_after_a_scoring_setting_changes_the_state_resumes_bit_for_bit(case, make, change):
    sampler = _trained(make())
    sampler.probs
    for name, value in change.items():
        setattr(sampler, name, value)
    _trained(sampler, steps=3, seed=5)
    resumed = make()
    resumed.load_state_dict(sampler.state_dict())
    for step in range(5):
        (i, w), (j, v) = sampler.sample(8), resumed.sample(8)
        assert torch.equal(i, j) and torch.equal(w, v)
        diffs = torch.randn(8, generator=torch.Generator().manual_seed(step), dtype=torch.float64)
        sampler.update(i, diffs)
        resumed.update(j, diffs)
    assert torch.equal(sampler.probs, resumed.probs)


def test_a_statistic_switch_sums_the_prior_again_in_the_new_units():
    """The prior s̄ is the root-mean-square score of the seen examples: after a switch it is read from the scores
    under the new statistic, as a sampler built with it and loaded with the same estimates reads it."""
    sampler = _trained(SAZOSampler(40, sum_tree=True, seed=3), steps=4)   # some examples still unseen
    sampler.statistic = "square"
    scores = sampler.scores()
    seen = sampler.counts > 0
    assert not bool(seen.all())
    expected = float(torch.sqrt((sampler.estimates.double()[seen].sqrt() ** 2).mean()))
    assert float(scores[~seen][0]) == pytest.approx(expected, rel=1e-12)


def test_settings_that_do_not_change_the_scores_leave_a_run_as_it_was():
    """Setting a scoring setting to the value it holds rebuilds nothing: the run is bit for bit the same."""
    plain, touched = _trained(SAZOSampler(24, sum_tree=True, seed=2)), _trained(SAZOSampler(24, sum_tree=True, seed=2))
    touched.statistic = str("abs")
    for _ in range(3):
        (i, w), (j, v) = plain.sample(8), touched.sample(8)
        assert torch.equal(i, j) and torch.equal(w, v)
    assert plain.state_dict()["extra"] == touched.state_dict()["extra"]


def test_a_deepcopy_after_a_change_is_rescored_on_its_own():
    sampler = _trained(StaleCorrectedSAZOSampler(24, growth_rate=0.5, seed=1))
    sampler.probs
    twin = copy.deepcopy(sampler)
    twin.max_factor = 1.1
    assert abs(float(twin.probs.sum()) - 1.0) < 1e-9 and abs(float(sampler.probs.sum()) - 1.0) < 1e-9


# --- 2. a state saved right after a setting changed -------------------------------------------------------------
@pytest.mark.parametrize("sum_tree", [True, False])
def test_a_statistic_switched_just_before_saving_makes_a_state_that_loads(sum_tree):
    """The state recorded the new statistic with the running Σ s² of the old one (nothing had read the setting
    since it was set): 'Invalid state: seen_sq 4.07, but the estimates give Σ s² = 2.2', for the sampler's own
    state. ``state()`` checks the settings first, as a draw does."""
    sampler = _trained(SAZOSampler(50, sum_tree=sum_tree, statistic="square", seed=4), steps=9)
    sampler.statistic = "abs"
    state = sampler.state_dict()
    resumed = SAZOSampler(50, sum_tree=sum_tree, seed=9)
    resumed.load_state_dict(state)
    for _ in range(3):
        (i, w), (j, v) = sampler.sample(8), resumed.sample(8)
        assert torch.equal(i, j) and torch.equal(w, v)


@pytest.mark.parametrize("name, bad", [("uniform_mix", 1.5), ("statistic", "sqaure"), ("ema_decay", -0.5)])
def test_a_state_is_not_written_with_a_setting_it_could_not_load(name, bad):
    """A setting set out of its rule after the last draw was written into the state, which every sampler then
    refused to load; it is refused where the state is taken, naming it, with the sampler unchanged."""
    sampler = _trained(SAZOSampler(16, seed=2), steps=5)
    setattr(sampler, name, bad)
    with pytest.raises(ValueError, match=f"Invalid {name}"):
        sampler.state_dict()


def test_an_oracle_state_is_not_written_with_a_mix_it_could_not_load():
    norms = torch.linspace(0.0, 1.0, 8, dtype=torch.float64)
    oracle = OracleSampler(8, lambda: norms, uniform_mix=0.2)
    oracle.uniform_mix = 1.5
    with pytest.raises(ValueError, match="Invalid uniform_mix"):
        oracle.state_dict()
    oracle.uniform_mix = np.float32(0.5)   # a numpy λ is still recorded as the Python float it holds
    assert oracle.state_dict()["hyperparameters"] == {"uniform_mix": 0.5}


# --- 3. best_rate's tie-break ------------------------------------------------------------------------------------
@pytest.mark.parametrize("order", [(1e-3, 2e-3), (2e-3, 1e-3)])
def test_a_nan_tie_break_is_refused_rather_than_won_by_grid_order(order):
    """Between equal medians a NaN tie-break compared false with 0.5 both ways, so the rate listed first won:
    1e-3 (NaN) in one order, 2e-3 (0.5) in the other."""
    per_rate = {rate: [10, 20, 30] for rate in order}
    with pytest.raises(ValueError, match="Invalid tiebreak of rate 0.001"):
        best_rate(per_rate, tiebreak={1e-3: float("nan"), 2e-3: 0.5})
    assert best_rate(per_rate, tiebreak={1e-3: math.inf, 2e-3: 0.5}) == 2e-3


@pytest.mark.parametrize("tiebreak, message", [({1e-3: 0.4}, "no value for rate 0.002"),
                                               ({1e-3: 0.4, 2e-3: True}, "Invalid tiebreak of rate 0.002"),
                                               ({1e-3: 0.4, 2e-3: "0.1"}, "Invalid tiebreak of rate 0.002"),
                                               ([0.4, 0.5], "Invalid tiebreak")])
def test_a_tie_break_without_a_number_for_each_rate_is_refused_naming_it(tiebreak, message):
    with pytest.raises(ValueError, match=message):
        best_rate({1e-3: [10], 2e-3: [10]}, tiebreak=tiebreak)


def test_tie_breaks_given_as_numpy_numbers_or_tensors_still_pick_the_smallest():
    per_rate = {1e-3: [10, 20], 2e-3: [10, 20], 4e-3: [5, None]}
    assert best_rate(per_rate, tiebreak={1e-3: np.float32(0.9), 2e-3: torch.tensor(0.5), 4e-3: 0.1}) == 2e-3


# --- 4. a seed log's records changed on disk ----------------------------------------------------------------------
def _logged_run(steps: int = 6):
    """(θ₀, tuned θ, log) of a small MeZO run whose lr changes once."""
    theta = torch.randn(6, generator=torch.Generator().manual_seed(0))
    start = theta.clone()
    opt = MeZO([theta], lr=0.05, eps=1e-3, seed=11)
    log = SeedLog.attach(opt)
    for step in range(steps):
        if step == 3:
            opt.param_groups[0]["lr"] = 0.02
        opt.step(lambda: (theta - 1.0).pow(2))
    return start, theta, log


def _with_value(data: bytes, index: int, value: float) -> bytes:
    """The log's bytes with record ``index``'s value replaced in place (as a bad sector or a stray write would)."""
    head, _, body = data.partition(b"\n")
    table = np.frombuffer(body, dtype=_RECORD).copy()
    table["value"][index] = value
    return head + b"\n" + table.tobytes()


@pytest.mark.parametrize("kind", [_STEP, _LR])
def test_a_record_changed_on_disk_is_refused_before_replay_moves_anything(kind):
    """A g or an lr changed in the file parsed (a finite number) and replayed another θ without a word: the log
    records its records' SHA-256, and replay refuses records that do not match it."""
    start, tuned, log = _logged_run()
    index = max(i for i, record in enumerate(log.records) if record[0] == kind)
    altered = SeedLog.from_bytes(_with_value(log.to_bytes(), index, log.records[index][2] * 1.5))
    replica = start.clone()
    with pytest.raises(ValueError, match="Invalid seed log: its records or eps do not match"):
        altered.replay([replica])
    assert torch.equal(replica, start)


def test_a_log_read_back_replays_bit_for_bit_and_writes_the_same_bytes():
    start, tuned, log = _logged_run()
    data = log.to_bytes()
    loaded = SeedLog.from_bytes(data)
    assert loaded.to_bytes() == data and "sha256" not in loaded.header
    replica = start.clone()
    loaded.replay([replica])
    assert torch.equal(replica, tuned)


def test_a_log_written_without_the_digest_still_replays():
    start, tuned, log = _logged_run()
    head, _, body = log.to_bytes().partition(b"\n")
    header = json.loads(head)
    del header["sha256"]
    replica = start.clone()
    SeedLog.from_bytes(json.dumps(header).encode() + b"\n" + body).replay([replica])
    assert torch.equal(replica, tuned)


@pytest.mark.parametrize("digest", ["abc", 5, None, "G" * 64, "A" * 64])
def test_a_malformed_digest_is_refused_when_the_log_is_read(digest):
    _, _, log = _logged_run(steps=2)
    head, _, body = log.to_bytes().partition(b"\n")
    header = json.loads(head)
    header["sha256"] = digest
    data = json.dumps(header).encode() + b"\n" + body
    if digest is None:   # JSON null: no digest, as a log written before it
        SeedLog.from_bytes(data)
        return
    with pytest.raises(ValueError, match="Invalid seed log: sha256"):
        SeedLog.from_bytes(data)


# --- 5. a sampler's probs that are no distribution --------------------------------------------------------------
class _Scored(Sampler):
    """A user's sampler that gives its scores as ``probs`` (or any vector it is handed)."""

    def __init__(self, probs, num_examples: int = 2):
        super().__init__(num_examples, seed=0)
        self._given = probs

    @property
    def probs(self):
        return self._given


def test_probs_that_do_not_sum_to_one_are_refused_not_drawn_with_wrong_weights():
    """torch.multinomial normalises what it is given: probs [1, 3] drew example 1 three times in four, with weights
    1/(N·p) = 1/6, so E[w·f] was F/4 without a word."""
    sampler = _Scored(torch.tensor([1.0, 3.0], dtype=torch.float64))
    with pytest.raises(ValueError, match="Invalid probs: entries sum to 4"):
        sampler.sample(8)


@pytest.mark.parametrize("probs, message", [
    (torch.tensor([0.25, 0.25, 0.5], dtype=torch.float64), "shape \\(3,\\)"),   # drew index 2 of N = 2
    (torch.tensor([1.5, -0.5], dtype=torch.float64), "finite and non-negative"),
    (torch.tensor([float("nan"), 1.0], dtype=torch.float64), "finite and non-negative"),
    (torch.tensor([[0.5, 0.5]], dtype=torch.float64), "shape"),
])
def test_probs_of_another_shape_or_negative_are_refused_naming_probs(probs, message):
    with pytest.raises(ValueError, match=f"Invalid probs: .*{message}"):
        _Scored(probs).sample(4)


def test_a_distribution_given_in_float32_or_as_a_list_still_draws_and_weights_by_it():
    """The check takes what the variance helpers take (float32 rounding of the sum): the draws and the weights
    1/(N·p) are those of the distribution given."""
    for probs in (torch.tensor([0.2, 0.8]), [0.2, 0.8], np.array([0.2, 0.8], dtype=np.float32)):
        sampler = _Scored(probs)
        indices, weights = sampler.sample(400)
        expected = 1.0 / (2 * torch.as_tensor(probs, dtype=torch.float64)[indices])
        assert torch.allclose(weights, expected) and 0.7 < float((indices == 1).double().mean()) < 0.9


def test_the_oracle_draws_bit_for_bit_as_before_the_check():
    """The oracle's p is already a float64 distribution: it reaches torch.multinomial unchanged."""
    norms = torch.linspace(0.0, 2.0, 10, dtype=torch.float64)
    oracle, generator = OracleSampler(10, lambda: norms, uniform_mix=0.1, seed=5), torch.Generator().manual_seed(5)
    probs = oracle.probs
    indices, weights = oracle.sample(64)
    expected = torch.multinomial(probs, 64, replacement=True, generator=generator)
    assert torch.equal(indices, expected) and torch.equal(weights, 1.0 / (10 * probs[expected]))


def test_distribution_names_the_argument_and_its_length():
    assert distribution("p", torch.tensor([0.5, 0.5]), 2).dtype == torch.float64
    with pytest.raises(ValueError, match="Invalid p: shape \\(2,\\) \\(expected \\(3,\\)"):
        distribution("p", [0.5, 0.5], 3)
    with pytest.raises(ValueError, match="Invalid num_examples"):
        distribution("p", [1.0], 0)


# --- 6. property: every sampler, after any run and any change of its settings, draws by its probs ---------------
from hypothesis import HealthCheck, given, settings, strategies as st   # noqa: E402

PROPERTY = settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
_MAKERS = {
    "plain": lambda n, tree: PlainSAZOSampler(n, sum_tree=tree, seed=3),
    "abs": lambda n, tree: SAZOSampler(n, sum_tree=tree, seed=3),
    "square": lambda n, tree: SAZOSampler(n, sum_tree=tree, statistic="square", seed=3),
    "stale": lambda n, tree: StaleCorrectedSAZOSampler(n, growth_rate=0.5, seed=3),
}
_CHANGES = [("uniform_mix", 0.5), ("uniform_mix", 1.0), ("ema_decay", 0.0), ("statistic", "square"),
            ("statistic", "abs"), ("prior_strength", 4.0), ("level_decay", 0.0), ("min_factor", 1.0),
            ("max_factor", 1.5), ("growth_rate", 1.0)]


@PROPERTY
@given(kind=st.sampled_from(sorted(_MAKERS)), n=st.integers(1, 40), tree=st.booleans(),
       plan=st.lists(st.tuples(st.integers(1, 6), st.floats(-6, 6), st.integers(0, len(_CHANGES))), max_size=12))
def test_after_any_run_and_any_settings_the_weights_are_one_over_n_p_of_a_distribution(kind, n, tree, plan):
    """After updates (zero, tiny, huge diffs; repeated indices) and settings set between steps, ``probs`` is a
    distribution, each draw's weight is 1/(N·p) of that distribution, and the state loads and draws on alike."""
    sampler = _MAKERS[kind](n, tree)
    generator = torch.Generator().manual_seed(n)
    for batch, scale, change in plan:
        indices, _ = sampler.sample(batch)
        if batch > 2:
            indices[-1] = indices[0]   # a repeated index
        diffs = 10.0 ** scale * torch.randn(batch, generator=generator, dtype=torch.float64)
        sampler.update(indices, diffs * (scale > -5))
        if change < len(_CHANGES) and _CHANGES[change][0] in sampler.SETTINGS:
            setattr(sampler, *_CHANGES[change])
        probs = sampler.probs
        assert abs(float(probs.sum()) - 1.0) < 1e-6 and bool((probs >= 0).all())
        indices, weights = sampler.sample(16)
        assert torch.allclose(weights, 1.0 / (n * probs[indices]), rtol=1e-12, atol=0)
    twin = _MAKERS[kind](n, tree)
    twin.load_state_dict(sampler.state_dict())
    (i, w), (j, v) = sampler.sample(8), twin.sample(8)
    assert torch.equal(i, j) and torch.equal(w, v)


# --- 7. the oracle under a folded MeZO ------------------------------------------------------------------------------
def _oracle_run(fold: bool, steps: int, theta=None, states=None):
    """θ after ``steps`` steps of ``train`` with an oracle whose norms read θ (least squares, 30 examples)."""
    data = torch.Generator().manual_seed(0)
    x, y = torch.randn(30, 4, generator=data, dtype=torch.float64), torch.randn(30, generator=data, dtype=torch.float64)
    theta = torch.zeros(4, dtype=torch.float64) if theta is None else theta
    opt = MeZO([theta], lr=0.02, eps=1e-3, seed=4, fold_updates=fold)
    sampler = OracleSampler(30, lambda: (x @ theta - y).abs() * x.norm(dim=1), uniform_mix=0.2, seed=1)
    if states is not None:
        opt.load_state_dict(states[0])
        sampler.load_state_dict(states[1])
    train(opt, sampler, lambda idx: (x[idx] @ theta - y[idx]) ** 2, steps, batch_size=4, progress=False)
    return theta, opt, sampler


def test_an_oracle_under_a_folded_mezo_draws_by_the_norms_at_the_updated_theta():
    """Between steps a folded MeZO holds θ − εz; train drew from the oracle there, so its norms were those of the
    last step's θ − εz: the folded run drew other examples than the unfolded one (whose θ it otherwise equals bit
    for bit) and than itself resumed from a checkpoint. train now flushes before a draw that reads θ."""
    folded, _, _ = _oracle_run(True, 20)
    plain, _, _ = _oracle_run(False, 20)
    assert torch.equal(folded, plain)
    theta, opt, sampler = _oracle_run(True, 8)
    resumed, _, _ = _oracle_run(True, 12, theta.clone(), (opt.state_dict(), sampler.state_dict()))
    assert torch.equal(resumed, folded)


def test_samplers_that_do_not_read_theta_keep_the_fold():
    """Only a sampler whose draws read θ costs the fold its saved pass."""
    from sazo_lite.samplers import UniformSampler
    assert OracleSampler.reads_parameters and not SAZOSampler.reads_parameters
    assert not UniformSampler.reads_parameters


def test_a_sampler_that_reads_theta_in_its_update_sees_the_updated_theta_under_a_fold():
    """A sampler fed the true norms at its updates (as the benchmarks' noiseless diagnostics are) read θ − εz."""
    seen = []

    class Recording(SAZOSampler):
        reads_parameters = True

        def _observe(self, indices, diffs):
            seen.append(theta.clone())
            super()._observe(indices, diffs)

    runs = {}
    for fold in (False, True):
        theta = torch.zeros(3, dtype=torch.float64)
        seen.clear()
        opt = MeZO([theta], lr=0.1, eps=1e-3, seed=2, fold_updates=fold)
        train(opt, Recording(5, seed=0), lambda idx: (theta.sum() - idx.double()) ** 2, 4, batch_size=2,
              progress=False)
        runs[fold] = list(seen)
    assert all(torch.equal(a, b) for a, b in zip(runs[False], runs[True])) and len(runs[True]) == 4


# --- 8. the robust rule's vectorised update against the rule written out one example at a time -------------------
def _robust_rule_by_hand(state: dict, indices, diffs, sampler) -> dict:
    """SAZOSampler's docstring rule, one example at a time, in float64 (G stored in float32)."""
    n_examples, square = sampler.num_examples, sampler.statistic == "square"
    g, counts = state["G"].astype(np.float64), state["n"]
    seen = counts > 0
    scores = np.where(seen, np.sqrt(g) if square else g, 0.0)
    prior_score = math.sqrt((scores[seen] ** 2).mean()) if seen.any() else 0.0
    sampling = np.where(seen, scores, prior_score)
    total = sampling.sum()
    lam = sampler.uniform_mix
    probs = (1 - lam) * sampling / total + lam / n_examples if total > 0 else np.full(n_examples, 1 / n_examples)
    steps = state["t"] + 1
    rate = max(1 / steps, 1 - sampler.level_decay)
    level = (1 - rate) * state["L"] + rate * np.mean(np.abs(diffs) / (n_examples * probs[indices]))
    observed = {}
    for i, d in zip(indices, diffs):
        o = min(abs(d) / level, 1e30) if level > 0 else 0.0
        observed.setdefault(int(i), []).append(min(o * o, 1e30) if square else o)
    new_g, new_n = state["G"].copy(), counts.copy()
    for i, values in observed.items():
        c = sampler.prior_strength if (counts[i] > 0 or seen.any()) else 0.0
        decay = min((counts[i] + c) / (counts[i] + c + 1), sampler.ema_decay)
        old = float(state["G"][i]) if counts[i] > 0 else (prior_score ** 2 if square else prior_score)
        new_g[i] = np.float32(decay * old + (1 - decay) * np.mean(values))
        new_n[i] = min(counts[i] + 1, 65535)
    return {"G": new_g, "n": new_n, "L": level, "t": steps}


@PROPERTY
@given(n=st.integers(1, 30), tree=st.booleans(), square=st.booleans(), beta=st.sampled_from([0.0, 0.5, 0.9]),
       strength=st.sampled_from([0.0, 1.0, 3.0]), mix=st.sampled_from([0.1, 0.5, 1.0]),
       level_decay=st.sampled_from([0.0, 0.5, 0.99]), seed=st.integers(0, 2 ** 16),
       batches=st.lists(st.integers(1, 6), min_size=1, max_size=12))
def test_the_vectorised_robust_update_is_the_rule_one_example_at_a_time(n, tree, square, beta, strength, mix,
                                                                         level_decay, seed, batches):
    sampler = SAZOSampler(n, ema_decay=beta, prior_strength=strength, uniform_mix=mix, level_decay=level_decay,
                          statistic="square" if square else "abs", sum_tree=tree, seed=seed)
    state = {"G": np.zeros(n, np.float32), "n": np.zeros(n, np.int64), "L": 0.0, "t": 0}
    rng = np.random.default_rng(seed)
    for batch in batches:
        indices = rng.integers(0, n, batch)
        diffs = rng.standard_normal(batch) * 10.0 ** rng.integers(-3, 3, batch) * (rng.random() > 0.2)
        state = _robust_rule_by_hand(state, indices, diffs, sampler)
        sampler.update(torch.from_numpy(indices), torch.from_numpy(diffs))
    assert np.array_equal(sampler.counts.numpy(), state["n"]) and sampler.level_steps == state["t"]
    # float32 sums in tree mode: p (hence L and the estimates) to float32 rounding of the root
    tolerance = 1e-5 if tree else 1e-9   # (a float32 rounding may flip at a tie: not exact even in CDF mode)
    assert sampler.level == pytest.approx(state["L"], rel=tolerance, abs=0)
    assert np.allclose(sampler.estimates.numpy(), state["G"], rtol=tolerance * 10, atol=0)


# --- 9. crafted states and arguments refused with ValueError ------------------------------------------------------
def test_a_step_count_no_run_reaches_is_refused_in_a_stale_state():
    """A level_steps of 10²⁹ loaded (only ≥ 0 was checked), and every draw of the stale correction then raised
    OverflowError computing the ages in int64."""
    sampler = _trained(StaleCorrectedSAZOSampler(8, seed=1), steps=4)
    state = sampler.state_dict()
    state["extra"]["level_steps"] = 10 ** 29
    target = StaleCorrectedSAZOSampler(8, seed=1)
    with pytest.raises(ValueError, match="Invalid level_steps"):
        target.load_state_dict(state)
    target.sample(4)


@pytest.mark.parametrize("sum_tree", [torch.zeros(3), np.array([True, False]), "yes", 1])
def test_the_stale_correction_names_a_sum_tree_that_is_not_a_bool(sum_tree):
    """``if sum_tree:`` raised torch's 'ambiguous' RuntimeError on a tensor (numpy's ValueError on an array, not
    naming sum_tree); 1 and "yes" are named as what they are, not as True."""
    with pytest.raises(ValueError, match="Invalid sum_tree"):
        StaleCorrectedSAZOSampler(8, sum_tree=sum_tree)
    state = StaleCorrectedSAZOSampler(8).state_dict()
    state["hyperparameters"]["sum_tree"] = sum_tree
    with pytest.raises(ValueError, match="Invalid sum_tree"):
        StaleCorrectedSAZOSampler(8).load_state_dict(state)


# --- 10. a sum tree over an owner's leaves that are not weights --------------------------------------------------
@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_a_tree_over_leaves_that_are_not_weights_is_refused_at_build_and_refresh(bad):
    """An owner's negative leaf was summed as given: leaves [−1, 2, 3, 1] drew leaf 2 three times in five, and a
    leaf set to −5 after a refresh left only leaf 3 drawn, without a word; NaN read as 'all weights are zero'."""
    leaves = np.array([bad, 2.0, 3.0, 1.0])
    with pytest.raises(ValueError, match="Invalid leaf_values: entries must be finite and non-negative"):
        SumTree.over(4, lambda i: leaves[i])
    leaves[0] = 1.0
    tree = SumTree.over(4, lambda i: leaves[i])
    before = tree.tree.clone()
    leaves[0] = bad
    with pytest.raises(ValueError, match="Invalid leaf_values"):
        tree.refresh(np.array([0]))
    leaves[0] = 1.0
    assert torch.equal(tree.tree, before)   # no sum changed


def test_a_tree_over_leaves_of_another_length_is_refused():
    with pytest.raises(ValueError, match="Invalid leaf_values"):
        SumTree.over(4, lambda i: np.ones(3))


def test_trees_over_valid_leaves_sum_and_draw_as_before():
    leaves = np.array([0.0, 2.0, 3.0, 1.0, 0.5])
    tree = SumTree.over(5, lambda i: leaves[i], dtype=np.float32)
    leaves[1] = 4.0
    tree.refresh(np.array([1, 1]))
    assert tree.total == pytest.approx(8.5) and torch.equal(tree.tree, SumTree.over(5, lambda i: leaves[i],
                                                                                    dtype=np.float32).tree)
    draws = tree.sample(20_000, torch.Generator().manual_seed(0)).numpy()
    assert not (draws == 0).any() and abs(float((draws == 1).mean()) - 4.0 / 8.5) < 0.02


def test_an_eps_changed_on_disk_is_refused_before_replay_moves_anything():
    """``replay(params)`` builds its optimiser from the header's eps: an eps edited in the file (0.001 → 0.002, one
    digit) replayed another θ without a word."""
    start, tuned, log = _logged_run()
    data = log.to_bytes()
    assert data.count(b'"eps": 0.001') == 1
    altered = SeedLog.from_bytes(data.replace(b'"eps": 0.001', b'"eps": 0.002'))
    replica = start.clone()
    with pytest.raises(ValueError, match="Invalid seed log: its records or eps do not match"):
        altered.replay([replica])
    assert torch.equal(replica, start)


def test_a_sampler_pickled_before_the_store_recorded_its_settings_still_draws_as_it_did():
    import pickle

    sampler = _trained(SAZOSampler(24, sum_tree=True, seed=6))
    twin = pickle.loads(pickle.dumps(sampler))
    del twin.__dict__["_scored_with"]   # as a sampler pickled before round 16
    for _ in range(3):
        (i, w), (j, v) = sampler.sample(8), twin.sample(8)
        assert torch.equal(i, j) and torch.equal(w, v)
    assert sampler.state_dict()["extra"] == twin.state_dict()["extra"]


# --- 11. the distributed closure: every rank must hold the same global batch --------------------------------------
def _two_ranks(monkeypatch, rank: int, others: list):
    """Rank ``rank`` of a world of 2 whose other rank's indices are ``others`` (the all-gather simulated)."""
    from sazo_lite import distributed

    monkeypatch.setattr(distributed, "rank_and_world", lambda: (rank, 2))
    digests = lambda mine, world: [distributed._batch_digest(others), mine][::1 if rank else -1]
    monkeypatch.setattr(distributed, "_gathered", digests)
    return distributed


@pytest.mark.parametrize("rank", [0, 1])
def test_a_rank_that_drew_another_batch_is_refused_before_the_step(monkeypatch, rank):
    """Each rank evaluated its shard of its own batch and the all-gather joined them: with a sampler seeded
    differently on one rank, every rank took the losses of two batches as one, without a word."""
    distributed = _two_ranks(monkeypatch, rank, others=[0, 1, 2, 4])
    with pytest.raises(ValueError, match="Invalid indices: rank\\(s\\) \\[1\\] drew another global batch"):
        distributed.distributed_closure(lambda idx: torch.zeros(len(idx)), torch.tensor([0, 1, 2, 3]))


def test_ranks_that_drew_the_same_batch_get_their_shards(monkeypatch):
    distributed = _two_ranks(monkeypatch, 1, others=np.array([5, 6, 7, 8]))
    seen = []
    closure = distributed.distributed_closure(lambda idx: seen.append(idx) or torch.zeros(len(idx)),
                                              torch.tensor([5, 6, 7, 8]))
    monkeypatch.setattr(distributed, "gather_losses", lambda losses: losses)
    closure()
    assert seen[0].tolist() == [7, 8]


def test_one_process_gathers_nothing():
    from sazo_lite import distributed

    closure = distributed.distributed_closure(lambda idx: idx.double(), torch.tensor([3, 1]))
    assert closure().tolist() == [3.0, 1.0]


def _rank_main(rank: int, port: int, folder: str) -> None:
    """One gloo rank: rank 1 draws another batch; each rank writes what distributed_closure did."""
    import os

    import torch.distributed as dist

    from sazo_lite import distributed

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        same = distributed.distributed_closure(lambda idx: idx.double(), torch.tensor([4, 5, 6, 7]))()
        try:
            distributed.distributed_closure(lambda idx: idx.double(), torch.tensor([4, 5, 6, 7 + rank]))
            outcome = "ran"
        except ValueError as error:
            outcome = str(error)
        with open(os.path.join(folder, f"rank{rank}.txt"), "w") as handle:
            handle.write(json.dumps([same.tolist(), outcome]))
    finally:
        dist.destroy_process_group()


def test_two_gloo_ranks_with_different_batches_both_refuse_and_equal_ones_gather(tmp_path):
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    mp.spawn(_rank_main, args=(port, str(tmp_path)), nprocs=2, join=True)
    for rank in range(2):
        same, outcome = json.loads((tmp_path / f"rank{rank}.txt").read_text())
        assert same == [4.0, 5.0, 6.0, 7.0]
        assert "rank(s) [1] drew another global batch" in outcome


def test_a_log_built_by_hand_still_serialises_and_is_refused_where_it_is_read():
    """The digest reads the header as given: a header without directions made ``to_bytes`` raise KeyError."""
    data = SeedLog({"format": 3}, []).to_bytes()
    with pytest.raises(ValueError, match="Invalid seed log"):
        SeedLog.from_bytes(data)


# --- 12. past_edge's flags ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("flags", [["False", "False", "True"], [float("nan"), False, False], [None, False],
                                   [0.0, 1.0], [2, 0]])
def test_flags_that_are_not_yes_or_no_are_refused_not_read_as_diverged(flags):
    """bool() read "False" (a flag read back from a CSV) and NaN as True: every such rate was past its edge, and the
    grid rule skipped it without a word."""
    with pytest.raises(ValueError, match="Invalid diverged"):
        past_edge(flags)


def test_flags_given_as_bools_of_any_library_or_zero_and_one_still_count():
    assert past_edge([np.bool_(True), torch.tensor(True), False, 0]) and not past_edge([1, 0, np.bool_(False)])
    assert past_edge(np.array([True, False])) and not past_edge(torch.tensor([True, False, False]))


def test_a_log_whose_file_missed_its_digest_is_not_written_again_as_sound(tmp_path):
    """Loading a changed file and saving it gave it a new SHA-256: the copy replayed the changed records silently."""
    start, _, log = _logged_run()
    index = max(i for i, record in enumerate(log.records) if record[0] == _STEP)
    altered = SeedLog.from_bytes(_with_value(log.to_bytes(), index, 2.0 * log.records[index][2]))
    with pytest.raises(ValueError, match="its records or eps do not match"):
        altered.save(tmp_path / "copy.seedlog")
    assert not (tmp_path / "copy.seedlog").exists()
