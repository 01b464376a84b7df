"""Round 16 of the library's red team on the optimiser core: one rule for bools and complex numbers among
numbers, the noise source a MeZO state records, and what the hunt in the engine and the noise sources found.

Each defect's test fails on the code before its fix.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from sazo_lite.engine import MeZO, NoiseSourceWarning, _booleans_or_complex
from sazo_lite.kernels import TritonNoise, triton_direction
from sazo_lite.noise import GaussianTable, Job, NoiseTable, PlainNoise, TorchNoise, describe, white_table
from sazo_lite.precision import Float32Master
from sazo_lite.validation import dense_tensor, non_real_kinds


# --- 1. one rule for bools and complex numbers among numbers ------------------------------------------------------
def _old_holds_bool(items) -> bool:
    """validation._holds_bool before round 16 (dense_tensor's rule), verbatim: the reference."""
    kinds = set(map(type, items))
    if any(issubclass(kind, (bool, np.bool_)) for kind in kinds):
        return True
    if not any(issubclass(kind, (list, tuple, np.ndarray, torch.Tensor)) for kind in kinds):
        return False
    return any(_old_holds_bool(item) if isinstance(item, (list, tuple))
               else (isinstance(item, np.ndarray) and item.dtype == np.bool_)
               or (isinstance(item, torch.Tensor) and item.dtype == torch.bool) for item in items)


def _old_booleans_or_complex(value) -> bool:
    """engine._booleans_or_complex before round 16 (MeZO's closure results and weights, train's numbers)."""
    items = value if isinstance(value, (list, tuple)) else [value]
    return any(isinstance(v, (bool, complex)) or (isinstance(v, np.ndarray) and v.dtype.kind in "bc")
               or (isinstance(v, np.generic) and v.dtype.kind in "bc")
               or (isinstance(v, torch.Tensor) and (v.dtype == torch.bool or v.is_complex())) for v in items)


REFUSED = {"True": True, "numpy bool": np.bool_(False), "complex": 1 + 2j, "numpy complex64": np.complex64(1j),
           "numpy complex128": np.complex128(2.0), "bool array": np.array([True]), "0-d bool array": np.array(True),
           "complex array": np.array([1 + 0j]), "bool tensor": torch.tensor([True]),
           "complex tensor": torch.tensor([1 + 1j]), "int and True": [1, True],
           "float and numpy bool": (0.5, np.bool_(1)),
           "float and complex": [0.5, 2j], "float and numpy complex": [0.5, np.complex64(1)],
           "0-d bool tensors": [torch.tensor(True)] * 2, "0-d complex tensor": [torch.tensor(1 + 0j), 1.0],
           "bool array in a list": [np.array([True]), 1.0], "nested True": [[1.0], [True]],
           "nested numpy bool": ([0.5, (np.bool_(True),)],), "nested complex": [[1.0], [1j]],
           "nested complex tensor": [[torch.tensor(2j)]], "deeply nested bool": [[[[[False]]]]]}
VALID = {"int": 3, "float": 0.5, "numpy float32": np.float32(0.25), "numpy float64": np.float64(-1.0),
         "numpy int": np.int64(7), "float array": np.arange(3.0), "int array": np.arange(3),
         "float tensor": torch.ones(3), "half tensor": torch.ones(2, dtype=torch.float16), "floats": [0.5, 1.5],
         "ints": (1, 2, 3), "numpy floats": [np.float64(1.0), np.float32(2.0)],
         "nested floats": [[1.0, 2.0], [3.0, 4.0]],
         "0-d float tensors": [torch.tensor(1.0), torch.tensor(2.0)], "float arrays": [np.ones(2), np.zeros(2)],
         "empty": [], "nested empty": [[], ()], "inf and nan": [float("inf"), float("nan")]}


@pytest.mark.parametrize("value", REFUSED.values(), ids=REFUSED.keys())
def test_the_one_rule_refuses_every_input_either_old_rule_refused(value):
    """Two near-twin rules (dense_tensor's nested bool search, the engine's one-level bool-or-complex test) are now
    validation.non_real_kinds: each caller refuses at least what it refused before (nested cases too)."""
    kinds = non_real_kinds(value)
    assert kinds and kinds <= {"bool", "complex"}
    assert _booleans_or_complex(value) >= _old_booleans_or_complex(value)
    assert _booleans_or_complex(value)   # the engine's name, kept for sazo_lite.train: it refuses every row
    if isinstance(value, (list, tuple)):
        assert ("bool" in kinds) >= _old_holds_bool(value)


@pytest.mark.parametrize("value", VALID.values(), ids=VALID.keys())
def test_the_one_rule_refuses_nothing_valid(value):
    assert non_real_kinds(value) == set() and not _booleans_or_complex(value)
    assert not _old_booleans_or_complex(value)   # the table's own check: the old rules took these too
    assert not (isinstance(value, (list, tuple)) and _old_holds_bool(value))


@pytest.mark.parametrize("value, kinds", [([1.0, True, 2j], {"bool", "complex"}), ([[True], [np.complex64(1)]],
                                                                                     {"bool", "complex"}),
                                          (np.array([[1 + 1j]]), {"complex"}), ([np.bool_(0), 1], {"bool"})])
def test_the_rule_names_every_kind_it_finds(value, kinds):
    assert non_real_kinds(value) == kinds


def test_dense_tensor_still_reads_complex_lists_as_complex_for_its_callers_to_name():
    """dense_tensor refuses bools among numbers (torch read them as 0/1); a complex list stays a complex tensor,
    which its callers refuse naming the dtype (their messages are unchanged)."""
    assert dense_tensor("x", [1.0, 2j]).is_complex()
    with pytest.raises(ValueError, match="Invalid x: .*holds a bool"):
        dense_tensor("x", [1j, True])
    with pytest.raises(ValueError, match="Invalid x: .*holds a bool"):
        dense_tensor("x", [[1.0], [np.bool_(True)]])


@pytest.mark.parametrize("bad", [[0.5, True], [np.bool_(1), 1.0], [1.0, 2j], np.array([1.0 + 0j, 2.0]),
                                 [torch.tensor(True), torch.tensor(1.0)]])
def test_mezo_refuses_bool_or_complex_losses_and_weights_with_theta_unchanged(bad):
    theta = torch.linspace(-1, 1, 2, dtype=torch.float64)
    start = theta.clone()
    opt = MeZO([theta], lr=0.1, eps=1e-3, seed=0)
    with pytest.raises(ValueError, match="closure result"):
        opt.step(lambda: bad)
    with pytest.raises(ValueError, match="Invalid weights"):
        opt.step(lambda: theta * 1.0, weights=bad)
    assert torch.allclose(theta, start, rtol=0, atol=1e-15) and opt.step_count == 0


@pytest.mark.parametrize("bad", [np.array([1.0 + 0j, 2.0]), [np.complex64(1), 1.0], np.complex128(1.0)],
                         ids=["complex array", "numpy complex in a list", "numpy complex"])
def test_a_complex_closure_result_is_refused_before_any_cast_warns(bad):
    """The closure's result was read in float64 before the rule looked at it: numpy complex numbers were cast with
    a warning (ComplexWarning or UserWarning: raised as an error under -W error) before the step refused them."""
    theta = torch.zeros(2, dtype=torch.float64)
    opt = MeZO([theta], lr=0.1, eps=1e-3, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="Invalid closure result: .*complex"):
            opt.step(lambda: bad)
    assert float(theta.abs().max()) <= 1e-15 and opt.step_count == 0   # restored (within rounding)


def test_a_list_that_holds_itself_is_refused_by_name():
    """The rule searched nested lists by recursion: a list holding itself raised RecursionError from the weights'
    check instead of 'Invalid weights'."""
    theta = torch.zeros(2, dtype=torch.float64)
    opt = MeZO([theta], lr=0.1, eps=1e-3, seed=0)
    looped = [1.0]
    looped.append(looped)
    assert non_real_kinds(looped) == set() and non_real_kinds([looped, [True]]) == {"bool"}
    with pytest.raises(ValueError, match="Invalid weights"):
        opt.step(lambda: theta + 1.0, weights=looped)
    with pytest.raises(ValueError, match="Invalid closure result"):
        opt.step(lambda: looped)
    assert float(theta.abs().max()) <= 1e-15 and opt.step_count == 0   # restored (within rounding)


# --- 2. the noise source a MeZO state records -------------------------------------------------------------------
def _quadratic_run(noise, steps=3, state=None, theta=None):
    """A MeZO on a 40-entry quadratic (float64), optionally loaded from ``state`` first; returns (θ, optimiser)."""
    theta = torch.linspace(-1, 1, 40, dtype=torch.float64) if theta is None else theta
    opt = MeZO([theta], lr=0.05, eps=1e-3, seed=3, noise=noise)
    if state is not None:
        opt.load_state_dict(state)
    for _ in range(steps):
        opt.step(lambda: ((theta - 0.5) ** 2).reshape(4, 10).sum(1))
    return theta, opt


SOURCES = {"plain": lambda: None, "torch": lambda: TorchNoise(workers=1, chunk=16),
           "table": lambda: GaussianTable(size=64, chunk=16), "other table": lambda: GaussianTable(size=64, chunk=16,
                                                                                                   seed=1),
           "noise table": lambda: NoiseTable(size=64, chunk=16)}


@pytest.mark.parametrize("saved", SOURCES, ids=SOURCES.keys())
@pytest.mark.parametrize("loaded", SOURCES, ids=SOURCES.keys())
def test_a_state_loaded_into_another_noise_source_warns_naming_both(saved, loaded):
    """MeZO's state did not record its noise source: a state saved with a GaussianTable, loaded into a MeZO with
    the plain loop (or another table), went on along other z without a word. It records describe(source) now, and
    loading warns (NoiseSourceWarning, a UserWarning) naming both when they differ; the same source, or another one
    drawing the same z (the plain loop and TorchNoise), loads silently and resumes bit for bit."""
    _, opt = _quadratic_run(SOURCES[saved]())
    state = opt.state_dict()
    assert state["noise"] == describe(opt.noise_source) and type(state["noise"]) is str
    same = describe(SOURCES[saved]() or PlainNoise()) == describe(SOURCES[loaded]() or PlainNoise())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed, _ = _quadratic_run(SOURCES[loaded](), state=state, theta=opt.param_groups[0]["params"][0].clone())
    told = [w for w in caught if issubclass(w.category, NoiseSourceWarning)]
    assert issubclass(NoiseSourceWarning, UserWarning)
    if same:
        assert not told
        reference, _ = _quadratic_run(SOURCES[saved](), steps=6)
        assert torch.equal(resumed, reference)   # bit for bit as the uninterrupted run
    else:
        assert len(told) == 1 and state["noise"] in str(told[0].message)
        assert describe(SOURCES[loaded]() or PlainNoise()) in str(told[0].message)


def test_a_state_without_the_record_loads_without_a_word():
    """A state written before round 16 (no 'noise') still loads, into any source, silently."""
    _, opt = _quadratic_run(GaussianTable(size=64, chunk=16))
    state = opt.state_dict()
    del state["noise"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        resumed, twin = _quadratic_run(None, steps=0, state=state)
    assert twin.step_count == 3


def test_the_description_ignores_the_device_and_the_threads():
    """A run resumed on another device (or with more worker threads) with the same family of source is not warned:
    the description holds what decides z, its kind and parameters."""
    assert describe(GaussianTable(size=64, chunk=16, workers=1)) == describe(GaussianTable(size=64, chunk=16,
                                                                                          workers=2))
    assert describe(TorchNoise(workers=2)) == describe(PlainNoise()) == "torch"
    table = GaussianTable(size=64, chunk=16)
    table.table("cpu", torch.float32)   # a table built on one device: the description does not name it
    assert describe(table) == describe(GaussianTable(size=64, chunk=16)) == table.directions
    assert describe(NoiseTable(size=64, chunk=16, seed=1)) != describe(NoiseTable(size=64, chunk=16))
    usable, with_table = TritonNoise(), TritonNoise(fallback=GaussianTable(size=64, chunk=16))
    usable.usable = with_table.usable = True   # round 18: where triton cannot run, the fallback's description
    assert describe(usable) == "triton:seed-bits=63,fallback=torch"
    assert describe(with_table) == f"triton:seed-bits=63,fallback={table.directions}"


@pytest.mark.parametrize("bad", [5, None, ["torch"], b"torch"])
def test_a_state_whose_noise_record_is_not_a_name_is_refused_unchanged(bad):
    _, opt = _quadratic_run(None)
    state = opt.state_dict()
    state["noise"] = bad
    theta = torch.zeros(40, dtype=torch.float64)
    other = MeZO([theta], lr=0.1, eps=1e-3, seed=9, noise=None)
    with pytest.raises(ValueError, match="Invalid state_dict: noise"):
        other.load_state_dict(state)
    assert other.step_count == 0 and other.state_dict()["state"][0]["seed"] == 9


def test_a_state_with_a_noise_record_loads_with_weights_only(tmp_path):
    _, opt = _quadratic_run(GaussianTable(size=64, chunk=16))
    torch.save(opt.state_dict(), tmp_path / "opt.pt")
    assert torch.load(tmp_path / "opt.pt", weights_only=True)["noise"] == opt.state_dict()["noise"]


# --- 3. noise sources named where they are given ----------------------------------------------------------------
@pytest.mark.parametrize("noise", [np.array([1, 2]), torch.ones(2), ["auto"], 5, int],
                         ids=["numpy array", "tensor", "list", "number", "a class without apply"])
def test_mezo_names_a_noise_that_is_not_a_source(noise):
    """noise != "auto" of a numpy array was an array: MeZO raised numpy's 'truth value of an array ... is
    ambiguous', naming nothing."""
    with pytest.raises(ValueError, match=r"Invalid noise: .*expected 'auto', None or an object with apply"):
        MeZO([torch.zeros(3)], lr=0.1, noise=noise)


@pytest.mark.parametrize("fallback, match", [("torch", "Invalid fallback: 'torch'"),
                                             (TorchNoise, r"Invalid fallback: the class TorchNoise .*TorchNoise\(\)"),
                                             (5, "Invalid fallback: 5")])
def test_triton_noise_refuses_a_fallback_that_is_not_a_source_when_built(fallback, match):
    """A fallback without apply(jobs) (a name, a class) was taken, and the first pass the kernel could not run
    raised AttributeError or TypeError from inside the step."""
    with pytest.raises(ValueError, match=match):
        TritonNoise(fallback=fallback)


def test_triton_noise_takes_a_numpy_int_block_as_an_int():
    """A numpy int block was refused ('expected a power of two'), unlike every other size the library takes."""
    source = TritonNoise(block=np.int64(1024))
    assert source.block == 1024 and type(source.block) is int
    with pytest.raises(ValueError, match="Invalid block"):
        TritonNoise(block=np.int64(1000))


# --- 4. a folded update flushed outside a step, through a source with a bare apply(jobs) -------------------------
class _BareSource:
    """A noise source as MeZO documents the minimum: any object with apply(jobs) (no NoiseSource base)."""

    def __init__(self):
        self.inner = PlainNoise()

    def apply(self, jobs):
        for job in jobs:
            self.inner._apply_one(job, 0)


def test_a_pending_update_is_flushed_through_a_bare_source_on_tensors_that_require_grad():
    """flush() ran outside no_grad: with fold_updates=True, state_dict(), load_state_dict() and flush() of an
    optimiser over nn.Parameters raised RuntimeError ('a leaf Variable that requires grad is being used in an
    in-place operation') through a source without NoiseSource's own no_grad, and the update stayed pending."""
    folded, plain = torch.nn.Parameter(torch.zeros(4)), torch.nn.Parameter(torch.zeros(4))
    opt = MeZO([folded], lr=0.1, eps=1e-3, seed=1, noise=_BareSource(), fold_updates=True)
    reference = MeZO([plain], lr=0.1, eps=1e-3, seed=1, noise=_BareSource())
    for _ in range(2):
        opt.step(lambda: (folded - 1).pow(2))
        reference.step(lambda: (plain - 1).pow(2))
    state = opt.state_dict()
    assert not opt.pending and torch.equal(folded, plain) and state["state"][0]["step"] == 2


# --- 5. a perturbation typo given to a noise source directly ------------------------------------------------------
TYPO_SOURCES = {"TorchNoise, chunked": lambda: TorchNoise(workers=1, chunk=16),
                "GaussianTable": lambda: GaussianTable(size=64, chunk=16),
                "NoiseTable": lambda: NoiseTable(size=256, chunk=16), "plain": PlainNoise,
                "TritonNoise": TritonNoise}


@pytest.mark.parametrize("make", TYPO_SOURCES.values(), ids=TYPO_SOURCES.keys())
@pytest.mark.parametrize("typo", ["gausian", "Gaussian", "RADEMACHER", None])
def test_a_source_refuses_a_perturbation_it_does_not_know_before_moving_anything(make, typo):
    """z was chosen by perturbation == "gaussian" in TorchNoise's chunks and NoiseTable's tables: a job (or a
    NoiseTable.direction) with "Gaussian" or "gausian" drew ±1 signs without a word (draw_direction, the plain
    loop's, refused it). MeZO checks its groups' perturbation; a source used directly now checks each job's."""
    theta = torch.zeros(64)
    with pytest.raises(ValueError, match="Invalid perturbation"):
        make().apply([Job(theta, 1, 1.0, 1.0, typo)])
    assert torch.equal(theta, torch.zeros(64))


def test_a_folded_job_with_a_typo_in_its_second_term_moves_nothing():
    theta = torch.zeros(64)
    for source in (TorchNoise(workers=1, chunk=16), NoiseTable(size=256, chunk=16)):
        with pytest.raises(ValueError, match="Invalid perturbation"):
            source.apply([Job(theta, 1, 1.0, 1.0, "gaussian", then=(2, 1.0, "gausian"))])
        assert torch.equal(theta, torch.zeros(64))


def test_noise_table_direction_refuses_a_typo():
    with pytest.raises(ValueError, match="Invalid perturbation: 'Gaussian'"):
        NoiseTable(size=64, chunk=16).direction(torch.empty(10), 7, "Gaussian")
    with pytest.raises(ValueError, match="Invalid perturbation: 'gausian'"):
        triton_direction(torch.empty(10), 7, "gausian")


# --- 6. Float32Master.step with an optimiser over the wrong tensors -------------------------------------------------
@pytest.mark.parametrize("tuned", ["model", "model and masters", "one master of two"])
def test_a_master_step_refuses_an_optimiser_that_does_not_tune_its_masters(tuned):
    """MeZO built on the model's half-precision tensors instead of master.tensors: each pass was overwritten by the
    sync before the forward, both losses were the master's, g = 0, and every step was lost without an error (a
    FlatLossWarning came after 4 to 16 steps). Refused now, with nothing moved."""
    model = [torch.ones(8, dtype=torch.float16), torch.full((3,), 2.0, dtype=torch.bfloat16)]
    master = Float32Master(model)
    params = {"model": model, "model and masters": model[:1] + master.tensors, "one master of two": master.tensors[:1]}
    opt = MeZO(params[tuned], lr=0.1, eps=1e-2, seed=0)
    before = [t.clone() for t in model + master.tensors]
    with pytest.raises(ValueError, match="Invalid optimizer: it must tune the master copies"):
        master.step(opt, lambda: torch.cat([(t.float() - 3).pow(2) for t in model]))
    assert all(torch.equal(a, b) for a, b in zip(before, model + master.tensors)) and opt.step_count == 0


def test_a_master_step_with_its_masters_moves_the_model():
    model = [torch.ones(8, dtype=torch.float16)]
    master = Float32Master(model)
    opt = MeZO(master.tensors, lr=0.1, eps=1e-2, seed=0)
    out = master.step(opt, lambda: (model[0].float() - 3).pow(2))
    assert out.projected_grad != 0.0 and not torch.equal(model[0], torch.ones(8, dtype=torch.float16))


# --- 7. Ctrl-C while a state loads -----------------------------------------------------------------------------------
def test_ctrl_c_while_a_state_loads_is_held_until_the_state_is_whole(monkeypatch):
    """load_state_dict wrote torch.optim's state, then its step and seed as Python ints, outside any held block: a
    Ctrl-C between them left numpy ints in the state, which torch.load(weights_only=True) then refused in every
    checkpoint saved from it. Ctrl-C is now delivered once the load is done."""
    import signal

    theta = torch.zeros(3)
    source = MeZO([theta], lr=0.1, eps=1e-3, seed=4)
    state = source.state_dict()
    state["state"][0].update(step=np.int64(5), seed=np.int64(9))
    original = torch.optim.Optimizer.load_state_dict
    original = getattr(original, "__wrapped__", original)

    def interrupted(self, state_dict):
        original(self, state_dict)
        signal.raise_signal(signal.SIGINT)   # arrives between torch's load and MeZO's own writes

    monkeypatch.setattr(torch.optim.Optimizer, "load_state_dict", interrupted)
    target = MeZO([torch.zeros(3)], lr=0.1, eps=1e-3, seed=0)
    with pytest.raises(KeyboardInterrupt):
        target.load_state_dict(state)
    entry = target.state_dict()["state"][0]
    assert type(entry["step"]) is int and type(entry["seed"]) is int and (entry["step"], entry["seed"]) == (5, 9)


# --- 8. white_table's arguments ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("size, seed, name", [(8.0, 0, "size"), (2 ** 31, 0, "size"), (True, 0, "size"),
                                              (8, 1.5, "seed"), (8, 2 ** 70, "seed"), (8, True, "seed")])
def test_white_table_names_a_size_or_seed_it_cannot_take(size, seed, name):
    """white_table (public) read a float size as a TypeError from '&', tried to build a table of any size (2**31 and
    up: the limit GaussianTable keeps, MAX_TABLE_SIZE), read True as seed 1, and raised torch's TypeError or
    RuntimeError for a fractional or too large seed. One size rule now serves white_table and GaussianTable."""
    with pytest.raises(ValueError, match=f"Invalid {name}"):
        white_table(size, seed)
    if name == "size":
        with pytest.raises(ValueError, match="Invalid size"):
            GaussianTable(size=size, chunk=4)


# --- 9. a NoiseTable copied or pickled ------------------------------------------------------------------------------
def test_a_noise_table_is_copied_without_its_tables_and_draws_the_same_z():
    """A deepcopy or pickle of a NoiseTable (or of a MeZO holding one) carried every table it had built, 4·size bytes
    each (64 MiB at the default size), while GaussianTable's rebuilds them from the seed. Now both rebuild."""
    import copy
    import pickle

    source = NoiseTable(size=2 ** 16, chunk=2 ** 8)
    like = torch.empty(1000)
    z = source.direction(like, 7, "gaussian")
    assert len(pickle.dumps(source)) < 10_000 and source.nbytes > 0
    for twin in (copy.deepcopy(source), pickle.loads(pickle.dumps(source))):
        assert twin.nbytes == 0 and torch.equal(twin.direction(like, 7, "gaussian"), z)


# --- 10. a field of packed numpy records ----------------------------------------------------------------------------
def _packed_column() -> np.ndarray:
    records = np.zeros(4, dtype=[("loss", "<f8"), ("label", "<i4")])   # 12-byte records: 'loss' every 12 bytes
    records["loss"] = [0.5, 1.5, 2.5, 3.5]
    return records["loss"]


def test_a_field_of_packed_records_is_read_as_its_values():
    """torch.as_tensor refuses strides that are not whole items ('strides not a multiple of the element byte size'):
    a column of a numpy structured array (records read from a binary file) was refused as 'expected a tensor of
    numbers' by dense_tensor and as 'expected a 1-D tensor [B]' by MeZO's weights. numpy_readable copies it, as it
    copies reversed and byte-swapped arrays."""
    column = _packed_column()
    assert column.strides == (12,)
    assert dense_tensor("x", column).tolist() == column.tolist()
    theta, twin = torch.zeros(4, dtype=torch.float64), torch.zeros(4, dtype=torch.float64)
    out = MeZO([theta], lr=0.1, eps=1e-3, seed=0).step(lambda: (theta - 1) ** 2, weights=column)
    ref = MeZO([twin], lr=0.1, eps=1e-3, seed=0).step(lambda: (twin - 1) ** 2, weights=column.copy())
    assert out.projected_grad == ref.projected_grad and torch.equal(theta, twin)
    with pytest.raises(ValueError, match="masked"):   # the masked-array rule still holds on such a column
        dense_tensor("x", np.ma.masked_array(column, mask=[0, 1, 0, 0]))


# --- 11. the one rule against a plain recursive reference (hypothesis) ---------------------------------------------
_LEAVES = {float: st.floats(allow_nan=True), int: st.integers(-10, 10), bool: st.booleans(),
           complex: st.complex_numbers(max_magnitude=10), np.float32: st.floats(-1, 1).map(np.float32),
           np.bool_: st.booleans().map(np.bool_), np.complex64: st.floats(-1, 1).map(np.complex64),
           "bool tensor": st.booleans().map(torch.tensor), "float tensor": st.floats(-1, 1).map(torch.tensor),
           "complex array": st.floats(-1, 1).map(lambda x: np.array([x + 1j])),
           "float array": st.floats(-1, 1).map(lambda x: np.array([x]))}
_NESTED = st.recursive(st.one_of(*_LEAVES.values()),
                       lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner), max_leaves=12)


def _reference_kinds(value) -> set:
    """Plain recursion, one value at a time."""
    if isinstance(value, (list, tuple)):
        return set().union(*map(_reference_kinds, value)) if value else set()
    if isinstance(value, (bool, np.bool_)):
        return {"bool"}
    if isinstance(value, (complex, np.complexfloating)):
        return {"complex"}
    dtype = getattr(value, "dtype", None)
    if isinstance(value, torch.Tensor):
        return {"bool"} if dtype == torch.bool else {"complex"} if value.is_complex() else set()
    if isinstance(value, np.ndarray):
        return {"bool"} if dtype.kind == "b" else {"complex"} if dtype.kind == "c" else set()
    return set()


@settings(max_examples=300, deadline=None)
@given(_NESTED)
def test_the_rule_finds_what_a_plain_recursion_finds(value):
    assert non_real_kinds(value) == _reference_kinds(value)


# --- 12. one noise source shared by optimisers stepping in two threads ----------------------------------------------
def _threaded_runs(make_source, shared: bool) -> list[torch.Tensor]:
    """Two MeZOs on 4096-entry quadratics, 30 steps each, in two threads; one source for both when ``shared``."""
    import threading

    one = make_source()
    results = [None, None]

    def run(k):
        theta = torch.zeros(4096)
        opt = MeZO([theta], lr=1e-3, eps=1e-3, seed=k + 1, noise=one if shared else make_source())
        for _ in range(30):
            opt.step(lambda: ((theta - 1) ** 2).reshape(8, -1).mean(1))
        results[k] = theta

    threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


@pytest.mark.parametrize("make", [lambda: TorchNoise(workers=1, chunk=16), lambda: TorchNoise(workers=2, chunk=16),
                                  PlainNoise], ids=["TorchNoise", "TorchNoise, 2 workers", "PlainNoise"])
def test_a_source_shared_by_two_threads_draws_each_step_its_own_z(make):
    """A TorchNoise (or PlainNoise) given to two optimisers stepping in two threads kept one generator and one z
    buffer per worker slot (per device): each thread re-seeded and overwrote the other's, so both drew wrong z and
    their restores missed (θ 0.05 off after 40 steps of lr 1e-3, without a word). Each thread has its own now."""
    import threading

    alone = _threaded_runs(make, shared=False)
    together = _threaded_runs(make, shared=True)
    assert all(torch.equal(a, b) for a, b in zip(alone, together))
    source, seen = make(), []
    workers = [threading.Thread(target=lambda: seen.append(
        source._generator(torch.device("cpu")) if isinstance(source, PlainNoise)
        else (source._generator(0, torch.device("cpu")), source._buffer(0, torch.float32)))) for _ in range(2)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    assert seen[0] is not seen[1] and (isinstance(source, PlainNoise) or seen[0][1] is not seen[1][1])


def test_a_source_copied_or_pickled_draws_the_same_z():
    import copy
    import pickle

    for source in (TorchNoise(workers=2, chunk=16), PlainNoise(), GaussianTable(size=64, chunk=16)):
        theta = torch.zeros(100)
        source.apply([Job(theta, 5, 1.0, 1.0, "gaussian")])
        for twin in (copy.deepcopy(source), pickle.loads(pickle.dumps(source))):
            other = torch.zeros(100)
            twin.apply([Job(other, 5, 1.0, 1.0, "gaussian")])
            assert torch.equal(other, theta)


# --- 13. a folded SparseMeZO copied or pickled with its update pending ----------------------------------------------
@pytest.mark.parametrize("copier", ["deepcopy", "pickle"])
def test_a_folded_sparse_mezo_copied_with_a_pending_update_applies_it(copier):
    """The pending update's source (a MaskedNoise) was copied with its masks keyed by the original tensors' ids: the
    copy's flush(), state_dict() and every later step raised KeyError, for good. The copy now applies it with its own
    masks, and goes on bit for bit as the original."""
    import copy
    import pickle

    from sazo_lite.sparse import SparseMeZO, sparse_indices

    params = [torch.zeros(50), torch.zeros(4, 6)]
    opt = SparseMeZO(params, sparse_indices(params, 0.3, seed=2), lr=0.1, eps=1e-3, seed=4, fold_updates=True)

    def closure(tensors):
        return lambda: torch.stack([(tensors[0] - 1).pow(2).sum(), (tensors[1] + 1).pow(2).sum()])

    opt.step(closure(params))
    twin = copy.deepcopy(opt) if copier == "deepcopy" else pickle.loads(pickle.dumps(opt))
    twins = twin._params()
    assert twin.pending and twin.state_dict()["state"][0]["step"] == 1 and not twin.pending
    for optimiser, tensors in ((opt, params), (twin, twins)):
        optimiser.step(closure(tensors))
        optimiser.flush()
    assert all(torch.equal(a, b) for a, b in zip(params, twins))


def test_the_noise_source_warning_is_exported_beside_the_flat_loss_warning():
    """Users filter it as they filter FlatLossWarning: from the package itself."""
    import sazo_lite
    assert sazo_lite.NoiseSourceWarning is NoiseSourceWarning and "NoiseSourceWarning" in sazo_lite.__all__
