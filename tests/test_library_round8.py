"""Round 8 red team of the public API (engine, samplers, train, seed log, distributed helpers): each
test failed on the code before its fix. A History that lost committed steps, a run on parameters that
do not reach the loss, ..."""
import signal
import warnings

import pytest
import torch

from sazo_lite import MeZO
from sazo_lite.noise import PlainNoise
from sazo_lite.samplers import SAZOSampler, UniformSampler
from sazo_lite.train import FlatLossWarning, History, train


def _problem(n=8, d=5, seed=0, dtype=torch.float64):
    """Per-example least squares: losses(indices) [B] at the current θ."""
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randn(n, d, generator=g, dtype=dtype), torch.randn(n, generator=g, dtype=dtype)
    theta = torch.zeros(d, dtype=dtype)
    return theta, lambda idx: (a[idx] @ theta - b[idx]) ** 2


# --- defect 1: a committed step missing from the History ------------------------------------------
class _RefusingSampler(UniformSampler):
    """Refuses its feedback at the ``fail_at``-th update (a sampler given diffs it cannot take)."""

    def __init__(self, n, fail_at):
        super().__init__(n, seed=0)
        self.calls, self.fail_at = 0, fail_at

    def update(self, indices, diffs):
        self.calls += 1
        if self.calls == self.fail_at:
            raise ValueError("Invalid diffs: refused")
        return super().update(indices, diffs)


def test_a_sampler_that_refuses_feedback_leaves_the_committed_step_in_the_history():
    """The step was appended after sampler.update: θ had moved, the update raised, and the step was
    missing from the record (nor was the History reachable once train raised)."""
    theta, losses = _problem()
    opt = MeZO([theta], lr=0.01, noise=None)
    history = History()
    with pytest.raises(ValueError, match="refused"):
        train(opt, _RefusingSampler(8, fail_at=3), losses, 10, batch_size=2, progress=False, history=history)
    assert opt.step_count == 3
    assert history.queries == [4, 8, 12] and len(history.loss) == len(history.lr) == 3


class _Raises:
    def __init__(self, error, at):
        self.error, self.at, self.seen = error, at, 0

    def __call__(self, optimizer, event):
        self.seen += 1
        if self.seen == self.at:
            raise self.error


@pytest.mark.parametrize("error", [RuntimeError("hook failed"), KeyboardInterrupt()])
def test_a_step_hook_that_raises_after_the_commit_leaves_the_step_in_the_history(error):
    """A hook error is raised from step() with the step committed (documented): train lost it."""
    theta, losses = _problem()
    opt = MeZO([theta], lr=0.01, noise=None)
    opt.register_step_hook(_Raises(error, at=2))
    history = History()
    with pytest.raises(type(error)):
        train(opt, UniformSampler(8, seed=0), losses, 10, batch_size=2, progress=False, history=history)
    assert opt.step_count == 2 and len(history.loss) == 2
    assert history.projected_grad[-1] == opt.last_step.projected_grad and history.queries == [4, 8]


class _InterruptedUpdate(PlainNoise):
    """Sends SIGINT while the n-th pass (an update pass: passes 3, 6, ...) is applied."""

    def __init__(self, at):
        super().__init__()
        self.passes, self.at = 0, at

    def apply(self, jobs, done=None):
        self.passes += 1
        if self.passes == self.at:
            signal.raise_signal(signal.SIGINT)
        return super().apply(jobs, done)


def test_ctrl_c_during_the_update_pass_keeps_the_committed_step_in_the_history():
    """The pass completes and the step commits, then KeyboardInterrupt leaves step(): the step's
    ZOStep was never returned, so the History lacked a step θ had taken."""
    theta, losses = _problem()
    opt = MeZO([theta], lr=0.01, noise=_InterruptedUpdate(at=6))
    history = History()
    with pytest.raises(KeyboardInterrupt):
        train(opt, UniformSampler(8, seed=0), losses, 10, batch_size=2, progress=False, history=history)
    assert opt.step_count == 2 and history.queries == [4, 8]
    assert opt.last_step is not None and history.loss[-1] == opt.last_step.loss


@pytest.mark.parametrize("bad", [History(queries=[4]), History(diverged=True), [], "history"])
def test_train_refuses_a_history_that_is_not_empty(bad):
    theta, losses = _problem()
    with pytest.raises(ValueError, match="Invalid history"):
        train(MeZO([theta], lr=0.01), UniformSampler(8), losses, 2, progress=False, history=bad)


# --- defect 2: parameters that do not reach the loss -----------------------------------------------
def _run(losses, params, steps=8, batch_size=2, **kw):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(MeZO(params, lr=0.01, eps=1e-3, noise=None), SAZOSampler(8, seed=0), losses, steps,
              batch_size=batch_size, progress=False, **kw)
    return [w for w in caught if issubclass(w.category, FlatLossWarning)]


@pytest.mark.parametrize("batch_size", [1, 4])
def test_a_run_whose_parameters_do_not_reach_the_loss_warns(batch_size):
    """An adapter merged or disabled, the wrong tensors given to the optimiser: every difference is
    exactly 0 and the run silently did nothing."""
    theta, losses = _problem()
    adapter = torch.zeros(3)   # tuned, but the loss never reads it
    flat = _run(losses, [adapter], steps=20, batch_size=batch_size)
    assert len(flat) == 1 and "moved nothing" in str(flat[0].message)
    assert adapter.abs().max() < 1e-8   # g = 0: only the rounding of the ±εz shifts


@pytest.mark.parametrize("dtype, offset", [(torch.float32, 0.0), (torch.float64, 0.0), (torch.float64, 1.0)])
def test_a_loss_that_changes_very_little_does_not_warn(dtype, offset):
    """No false alarm: losses of 1e-9 (float32 or 64), or 1 + 1e-9·(...) in float64 (a relative change
    of 1e-12 a step): tiny differences, but not 0, and the run does move."""
    g = torch.Generator().manual_seed(1)
    a = torch.randn(8, 5, generator=g, dtype=dtype)
    theta = torch.zeros(5, dtype=dtype)
    losses = lambda idx: offset + 1e-9 * (a[idx] @ theta - 1.0) ** 2
    assert _run(losses, [theta], steps=20) == []
    assert bool(theta.abs().max() > 0)


def test_a_dataset_with_some_constant_examples_does_not_warn():
    """Examples the parameters cannot change (a fully masked row: loss 0) beside ones they can: the
    first steps may draw only constant examples, the check needs more than a step or two."""
    theta, losses = _problem()
    constant = torch.tensor([True, False] * 4)
    masked = lambda idx: torch.where(constant[idx], torch.zeros(len(idx), dtype=theta.dtype), losses(idx))
    for seed in range(20):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            train(MeZO([theta], lr=0.001, noise=None, seed=seed), UniformSampler(8, seed=seed), masked, 20,
                  progress=False)
        assert not [w for w in caught if issubclass(w.category, FlatLossWarning)], seed


# --- the closure changes the optimiser under the step ----------------------------------------------
def _quadratic(*tensors):
    return lambda: torch.stack([((t.double() - 1.0) ** 2).sum() for t in tensors])


def test_a_step_inside_the_closure_is_refused_and_theta_restored():
    """A nested step ran its three passes while θ stood at θ+εz: θ drifted by lr·g·z and the count
    jumped by 2 for one outer step."""
    theta = torch.zeros(4, dtype=torch.float64)
    opt = MeZO([theta], lr=0.1, noise=None)

    def nested():
        opt.step(_quadratic(theta))
        return _quadratic(theta)()
    with pytest.raises(ValueError, match="Invalid call: step"):
        opt.step(nested)
    assert opt.step_count == 0 and theta.abs().max() < 1e-15
    opt.step(_quadratic(theta))   # the optimiser is usable again
    assert opt.step_count == 1


@pytest.mark.parametrize("call", ["add_param_group", "load_state_dict", "replay_step", "replay_failure"])
def test_changing_the_optimiser_inside_the_closure_is_refused_and_nothing_is_left_shifted(call):
    """add_param_group from the closure: the new tensor got −2εz then +εz and was left at −εz."""
    theta, extra = torch.zeros(4, dtype=torch.float64), torch.zeros(3, dtype=torch.float64)
    opt = MeZO([theta], lr=0.0, noise=None)
    state = opt.state_dict()
    actions = {"add_param_group": lambda: opt.add_param_group({"params": [extra]}),
               "load_state_dict": lambda: opt.load_state_dict(state),
               "replay_step": lambda: opt.replay_step(123, 1.0),
               "replay_failure": lambda: opt.replay_failure(123, 2)}

    def closure():
        actions[call]()
        return _quadratic(theta, extra)()
    with pytest.raises(ValueError, match=f"Invalid call: {call}"):
        opt.step(closure)
    assert len(opt.param_groups) == 1 and opt.step_count == 0
    assert extra.abs().max() == 0 and theta.abs().max() < 1e-15


def _edit(opt, theta, other, what):
    group = opt.param_groups[0]
    if what == "params":
        group["params"].append(other)
    elif what == "replace":
        group["params"] = [other]
    elif what == "new group":
        opt.param_groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": [other]})
    else:
        group[what] = {"eps": 0.5, "perturbation": "rademacher", "lr": 0.2, "weight_decay": 0.1}[what]


@pytest.mark.parametrize("what", ["eps", "perturbation", "lr", "weight_decay", "params", "replace", "new group"])
@pytest.mark.parametrize("at_call, then_raise", [(1, False), (2, False), (2, True)])
def test_param_groups_edited_inside_the_closure_are_refused_and_theta_and_groups_restored(what, at_call, then_raise):
    """The passes read ε, z's kind and the tensors from the groups as they are: an ε edited by the
    closure made the −2εz pass and the undo use another ε (θ left at 1.06 where it started at 0,
    also when the closure then raised), diffs were divided by the old ε."""
    theta, other = torch.zeros(4, dtype=torch.float64), torch.zeros(3, dtype=torch.float64)
    opt = MeZO([theta], lr=0.0, eps=1e-3, noise=None)
    before = [dict(g, params=list(g["params"])) for g in opt.param_groups]
    calls = []

    def closure():
        calls.append(1)
        if len(calls) == at_call:
            _edit(opt, theta, other, what)
            if then_raise:
                raise RuntimeError("closure failed")
        return _quadratic(theta)()
    with pytest.raises(RuntimeError if then_raise else ValueError, match="closure failed|Invalid param_groups"):
        opt.step(closure)
    assert theta.abs().max() < 1e-15 and other.abs().max() == 0 and opt.step_count == 0
    assert [dict(g, params=list(g["params"])) for g in opt.param_groups] == before


@pytest.mark.parametrize("scale", [1e200, 1e300])
def test_variance_helpers_on_norms_near_the_float_maximum_are_those_of_the_scaled_norms(scale):
    """uniform_gain and variance_ratio squared the raw norms (inf/inf = NaN at 1e200), oracle_probs
    summed them (inf: uniform at 1e308); all three are scale-free."""
    from sazo_lite import variance
    norms = torch.tensor([1.0, 1.0, 1e-8], dtype=torch.float64)
    uniform = torch.full((3,), 1 / 3, dtype=torch.float64)
    for fn in (variance.uniform_gain, variance.oracle_probs, lambda n: variance.variance_ratio(n, uniform)):
        assert torch.allclose(torch.as_tensor(fn(norms * scale)), torch.as_tensor(fn(norms)), rtol=1e-12, atol=0)


def test_an_oracle_with_norms_near_the_float_maximum_keeps_its_distribution():
    """Σ norms overflowed to inf and the oracle fell back to uniform: examples with norm 1 beside two
    of 1e308 were drawn a third of the time (p* gives them ~1e-308)."""
    from sazo_lite.samplers import OracleSampler
    norms = torch.tensor([1e308, 1e308, 1.0], dtype=torch.float64)
    probs = OracleSampler(3, lambda: norms).probs
    assert torch.allclose(probs, torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64))
    scaled = OracleSampler(3, lambda: norms * 1e-300, uniform_mix=0.3).probs
    assert torch.allclose(scaled, 0.7 * probs + 0.1)


# --- dtypes the helpers assumed away ---------------------------------------------------------------
def test_a_float64_tensor_under_a_master_copy_keeps_its_precision():
    """The master was float32 for every tensor: a float64 weight lost its low bits at the first sync
    (1 + 1e-12 became 1, and 1 − 6e-8 after a step with lr = 0)."""
    from sazo_lite.precision import Float32Master
    weight = torch.full((3,), 1.0 + 1e-12, dtype=torch.float64)
    half = torch.ones(2, dtype=torch.bfloat16)
    master = Float32Master([weight, half])
    assert [t.dtype for t in master.tensors] == [torch.float64, torch.float32]
    opt = MeZO(master.tensors, lr=0.0, noise=None)
    master.step(opt, lambda: torch.stack([((weight - 1) ** 2).sum(), ((half.double() - 1) ** 2).sum()]))
    assert torch.allclose(weight - 1, torch.full((3,), 1e-12, dtype=torch.float64), rtol=1e-3, atol=0)


def test_a_master_copy_of_an_integer_tensor_is_refused():
    """An integer buffer passed by mistake got a float master, was perturbed and truncated back
    ([1, 2, 3] became [248, -84, 172])."""
    from sazo_lite.precision import Float32Master
    with pytest.raises(ValueError, match="Invalid params"):
        Float32Master([torch.ones(2), torch.tensor([1, 2, 3])])


def test_a_state_dict_with_numpy_integers_loads_as_python_ints():
    """A step or seed saved as numpy ints (a checkpoint edited with numpy) was kept as numpy scalars, so
    every later state_dict() failed torch.load(weights_only=True) (the ZOTrainer's reader)."""
    import io
    import numpy as np
    theta = torch.zeros(3, dtype=torch.float64)
    opt = MeZO([theta], lr=0.1, noise=None)
    state = opt.state_dict()
    state["state"][0].update(step=np.int64(5), seed=np.int64(7))
    opt.load_state_dict(state)
    assert type(opt.step_count) is int and type(opt.state[theta]["seed"]) is int
    buffer = io.BytesIO()
    torch.save(opt.state_dict(), buffer)
    buffer.seek(0)
    assert torch.load(buffer, weights_only=True)["state"][0]["step"] == 5


@pytest.mark.parametrize("kw, name", [(dict(world_size=0), "world_size"), (dict(world_size=-2), "world_size"),
                                      (dict(world_size=True), "world_size"), (dict(batch_size=-8), "batch_size"),
                                      (dict(num_params=-1), "num_params"), (dict(bytes_per_value=0), "bytes_per_value")])
def test_communication_bytes_refuses_impossible_sizes(kw, name):
    """world_size 0 raised ZeroDivisionError; -1, a negative batch or True gave numbers."""
    from sazo_lite.distributed import communication_bytes
    args = {**dict(batch_size=8, num_params=100, world_size=2), **kw}
    with pytest.raises(ValueError, match=f"Invalid {name}"):
        communication_bytes(**args)


# --- SparseMeZO: masks keyed by tensor ids --------------------------------------------------------
def _sparse():
    from sazo_lite.sparse import SparseMeZO
    w = torch.zeros(10, dtype=torch.float64)
    return w, SparseMeZO([w], [torch.tensor([1, 3])], lr=0.1)


@pytest.mark.parametrize("how", ["add_param_group", "append", "replace"])
def test_a_tensor_without_a_mask_is_refused_before_any_pass(how):
    """add_param_group was accepted and every later step raised KeyError from the mask lookup."""
    w, opt = _sparse()
    other = torch.zeros(4, dtype=torch.float64)
    with pytest.raises(ValueError, match="Invalid param"):
        if how == "add_param_group":
            opt.add_param_group({"params": [other]})
        else:
            if how == "append":
                opt.param_groups[0]["params"].append(other)
            else:
                opt.param_groups[0]["params"][0] = other
            opt.step(lambda: torch.cat([(w - 1) ** 2, (other - 1) ** 2]))
    assert other.abs().max() == 0 and w.abs().max() == 0 and opt.state[w]["step"] == 0


@pytest.mark.parametrize("copier", ["deepcopy", "pickle"])
def test_a_copied_sparse_optimiser_steps_like_the_original(copier):
    """The copy's masks were keyed by the original tensors' ids: its first step raised KeyError."""
    import copy
    import pickle
    w, opt = _sparse()
    twin = copy.deepcopy(opt) if copier == "deepcopy" else pickle.loads(pickle.dumps(opt))
    w2 = twin.param_groups[0]["params"][0]
    for _ in range(3):
        opt.step(lambda: (w - 1) ** 2)
        twin.step(lambda: (w2 - 1) ** 2)
    assert torch.equal(w, w2) and int((w != 0).sum()) == 2


def test_sparse_masks_with_a_repeated_index_and_fractions_that_are_not_numbers_are_refused():
    """A repeated index is written twice in one pass (the last write wins; on CUDA any): refused.
    sparse_indices read '0.5' and True with float()."""
    from sazo_lite.sparse import SparseMeZO, sparse_indices
    with pytest.raises(ValueError, match="Invalid masks"):
        SparseMeZO([torch.zeros(5)], [torch.tensor([1, 1, 2])], lr=0.1)
    for bad in ("0.5", True):
        with pytest.raises(ValueError, match="Invalid fraction"):
            sparse_indices([torch.zeros(5)], bad)


# --- the step counter and a seed log started mid-step ---------------------------------------------
def test_reading_the_step_count_after_the_first_tensor_was_replaced_is_a_value_error():
    """step_count and next_seed raised KeyError('step'); step() already said why in a ValueError."""
    theta = torch.zeros(3)
    opt = MeZO([theta], lr=0.1)
    opt.param_groups[0]["params"][0] = torch.zeros(3)
    for read in (lambda: opt.step_count, opt.next_seed):
        with pytest.raises(ValueError, match="Invalid params: the first parameter was replaced"):
            read()


def test_a_seed_log_attached_inside_the_closure_is_refused_and_theta_restored():
    """attach() from the closure recorded θ+εz as the run's start and then logged the step, so replay
    from the saved weights could not rebuild the run."""
    from sazo_lite import SeedLog
    theta = torch.zeros(3, dtype=torch.float64)
    opt = MeZO([theta], lr=0.1, noise=None)
    logs = []

    def closure():
        logs.append(SeedLog.attach(opt))
        return _quadratic(theta)()
    with pytest.raises(ValueError, match="Invalid call: SeedLog.attach"):
        opt.step(closure)
    assert logs == [] and opt.step_count == 0 and theta.abs().max() < 1e-15 and not opt._step_hooks


# --- a sum tree whose sums overflow ---------------------------------------------------------------
def test_a_sum_tree_refuses_weights_whose_sum_overflows():
    """[1e308, 1e308, 1]: the root was inf and every draw went to leaf 0 (half of them belong to 1)."""
    import numpy as np
    from sazo_lite.sumtree import SumTree
    with pytest.raises(ValueError, match="Invalid weights"):
        SumTree(torch.tensor([1e308, 1e308, 1.0], dtype=torch.float64))
    tree = SumTree(torch.ones(3, dtype=torch.float64))
    with pytest.raises(ValueError, match="Invalid weights"):
        tree.update(torch.tensor([0, 1]), torch.tensor([1e308, 1e308], dtype=torch.float64))
    assert tree.total == 3.0
    leaves = np.array([1e38, 3e38, 1.0], dtype=np.float32)   # an owner's leaves, float32 sums
    with np.errstate(over="ignore"):   # numpy says so when the float32 root overflows
        over = SumTree.over(3, lambda idx: leaves[idx].astype(np.float64), dtype=np.float32)
    with pytest.raises(ValueError, match="Invalid weights"):
        over.sample(4)
    draws = SumTree(torch.tensor([1e307, 1e307, 1.0], dtype=torch.float64)).sample(400, torch.Generator().manual_seed(0))
    assert 100 < int((draws == 1).sum()) < 300


@pytest.mark.parametrize("share", ["same tensor", "overlapping views"])
def test_a_master_copy_refuses_tensors_that_share_entries(share):
    """Each got a master of its own; MeZO saw two distinct masters, and sync wrote both into the same
    entries: the last won, so the first master's perturbations never reached the model."""
    from sazo_lite.precision import Float32Master
    base = torch.zeros(6, dtype=torch.bfloat16)
    params = [base, base] if share == "same tensor" else [base[:4], base[2:]]
    with pytest.raises(ValueError, match="Invalid params"):
        Float32Master(params)
    Float32Master([base[:3], base[3:]])   # disjoint views are fine


# --- seed logs whose records left the seed stream ---------------------------------------------------
def _logged_run(steps=4):
    from sazo_lite import SeedLog
    theta = torch.linspace(-1, 1, 5, dtype=torch.float64)
    start = theta.clone()
    opt = MeZO([theta], lr=0.1, noise=None, seed=3)
    log = SeedLog.attach(opt)
    for _ in range(steps):
        opt.step(_quadratic(theta))
    return log, start


@pytest.mark.parametrize("edit", ["swap", "splice", "drop"])
def test_a_log_whose_seeds_left_the_stream_is_refused_before_replay(edit):
    """Replay took any seeds and then set the optimiser to (start + steps, base seed): reordered,
    spliced or thinned records rebuilt a θ the run never had and a stream that reused directions."""
    from sazo_lite import SeedLog
    log, start = _logged_run()
    other, _ = _logged_run()
    steps = [r for r in log.records if r[0] == 0]
    first = log.records.index(steps[0])
    if edit == "swap":
        log.records[first], log.records[first + 1] = log.records[first + 1], log.records[first]
    elif edit == "splice":
        log.records += [r for r in other.records if r[0] == 0]
    else:
        del log.records[first]
    for candidate in (log, SeedLog.from_bytes(log.to_bytes())):   # the file parses; replay refuses it
        target = start.clone()
        with pytest.raises(ValueError, match="Invalid seed log: record .* seed"):
            candidate.replay([target])
        assert torch.equal(target, start)


def test_a_noise_class_instead_of_an_instance_is_refused_at_construction():
    """noise=TorchNoise (the class) was accepted: its apply is unbound and every step raised TypeError."""
    from sazo_lite.noise import TorchNoise
    with pytest.raises(ValueError, match=r"Invalid noise: the class TorchNoise .*TorchNoise\(\)"):
        MeZO([torch.zeros(3)], lr=0.1, noise=TorchNoise)


@pytest.mark.parametrize("result", ["0.5", torch.ones(2), None, True])
def test_an_evaluate_callback_that_returns_no_number_is_a_value_error_naming_it(result):
    """float() read True as 1.0 and raised 'could not convert string to float' / TypeError for the rest,
    without naming the callback; the steps taken stay in the History."""
    theta, losses = _problem()
    history = History()
    with pytest.raises(ValueError, match="Invalid evaluate result"):
        train(MeZO([theta], lr=0.01), UniformSampler(8), losses, 3, log_every=2, evaluate=lambda: result,
              progress=False, history=history)
    assert len(history.loss) == 2 and history.metrics == history.logged_steps == []
    assert train(MeZO([theta], lr=0.01), UniformSampler(8), losses, 2, log_every=1, progress=False,
                 evaluate=lambda: torch.tensor([0.25])).metrics == [0.25, 0.25]


def test_inference_tensors_step_inside_inference_mode_and_are_refused_outside_it():
    """Outside torch.inference_mode the first pass raised torch's RuntimeError ('Inplace update to
    inference tensor outside InferenceMode'); inside it they step as any tensor."""
    with torch.inference_mode():
        theta = torch.zeros(3)
    opt = MeZO([theta], lr=0.1, noise=None)
    with pytest.raises(ValueError, match="Invalid params: inference tensors"):
        opt.step(lambda: (theta - 1) ** 2)
    assert opt.step_count == 0 and theta.abs().max() == 0
    with torch.inference_mode():
        opt.step(lambda: (theta - 1) ** 2)
    assert opt.step_count == 1 and theta.abs().max() > 0


def test_a_step_hook_may_still_replay_a_pass_after_the_commit():
    """The closure guard covers the closure only: a hook runs once θ is committed (llm.queries.StepCap
    takes part of a step back with replay_step from its hook)."""
    theta = torch.zeros(4, dtype=torch.float64)
    opt = MeZO([theta], lr=0.1, noise=None)
    seen = []

    def take_half_back(optimizer, event):
        if event.kind == "step":
            optimizer.replay_step(event.seed, -event.value / 2)   # θ ← θ + η·(g/2)·z
            seen.append(event.value)
    opt.register_step_hook(take_half_back)
    twin = theta.clone()
    plain = MeZO([twin], lr=0.05, noise=None)
    opt.step(_quadratic(theta))
    plain.step(_quadratic(twin))
    assert len(seen) == 1 and torch.allclose(theta, twin, atol=1e-12)


class _ShortSampler(UniformSampler):
    def sample(self, batch_size):
        indices, weights = super().sample(batch_size)
        return indices[:1], weights[:1]


def test_a_sampler_that_draws_fewer_examples_than_asked_is_refused_before_the_step():
    """train counted 2·B queries a step for a sampler that drew one example: the queries-to-target
    figures (the project's unit of cost) were silently inflated."""
    theta, losses = _problem()
    opt = MeZO([theta], lr=0.01)
    with pytest.raises(ValueError, match=r"Invalid sampler: sample\(4\) returned 1 indices"):
        train(opt, _ShortSampler(8), losses, 3, batch_size=4, progress=False)
    assert opt.step_count == 0


def test_a_state_dict_is_a_snapshot_that_later_steps_leave_alone():
    """state_dict() held the optimiser's live state entry: saved at step 0 and kept in memory, it said
    step 2 two steps later, and loading it did not go back."""
    theta = torch.zeros(3, dtype=torch.float64)
    opt = MeZO([theta], lr=0.1, noise=None)
    saved = opt.state_dict()
    opt.step(_quadratic(theta))
    opt.step(_quadratic(theta))
    assert saved["state"][0]["step"] == 0
    opt.load_state_dict(saved)
    assert opt.step_count == 0
    opt.step(_quadratic(theta))
    assert saved["state"][0]["step"] == 0 and opt.step_count == 1


def test_load_state_dict_into_a_folded_optimiser_leaves_the_same_theta_as_unfolded():
    """The pending update was dropped: θ stayed at θ − εz of the last step (neither its start nor its
    end), where the unfolded run held the updated θ; folding promises the same θ bit for bit."""
    def run(fold):
        theta = torch.linspace(-1, 1, 6, dtype=torch.float64)
        opt = MeZO([theta], lr=0.1, noise=None, fold_updates=fold)
        saved = opt.state_dict()
        opt.step(_quadratic(theta))
        opt.step(_quadratic(theta))
        opt.load_state_dict(saved)   # back to step 0's count and seed, θ as the caller left it
        opt.step(_quadratic(theta))
        opt.flush()
        return theta, opt.step_count
    (unfolded, n), (folded, m) = run(False), run(True)
    assert n == m == 1 and torch.equal(unfolded, folded)


@pytest.mark.parametrize("bad", [lambda idx: torch.ones(len(idx)).mean(), lambda idx: torch.ones(len(idx) - 1),
                                 lambda idx: [1.0] * len(idx)])
def test_a_distributed_closure_refuses_losses_that_are_not_one_per_local_example(bad):
    """A scalar or a short tensor went into the all-gather (with one process: passed through, so a mean
    loss trained as 'no per-example losses'; with several: parts of different sizes)."""
    from sazo_lite.distributed import distributed_closure
    with pytest.raises(ValueError, match="Invalid batch_losses result"):
        distributed_closure(bad, torch.arange(4))()
    assert torch.equal(distributed_closure(lambda idx: idx.double(), torch.arange(4))(), torch.arange(4.0, dtype=torch.float64))
