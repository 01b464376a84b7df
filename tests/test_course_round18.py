"""Round 18 (course, notebooks, memory model): the memory model's head against autograd, the figures the
docs and notebook 07 quote against what the code prints, and the widgets given hostile values."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from sazo_lite.course import memory
from sazo_lite.course.memory import ModelShape, TrainSetup
from sazo_lite.course.memory_measure import build_decoder, per_example_loss, saved_activation_bytes

ROOT = Path(__file__).resolve().parents[1]


# -- the memory model: the LM head's input is a saved activation ---------------------------------------------
class _Loss(torch.nn.Module):
    """The whole decoder and its loss as one module, for ``saved_activation_bytes``."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, tokens):
        return per_example_loss(self.model, tokens)


@pytest.mark.parametrize("chunked_loss", [True, False])
def test_final_norm_and_head_store_what_autograd_saves(chunked_loss):
    """The head's matmul keeps its input (D per token) for its weight's grad: the model counted the final
    norm's 2D + 1 only (193 saved elements per token against 129 counted at D = 64)."""
    shape, n, batch = ModelShape("t", 2, 64, 4, 2, 160, 50), 48, 2
    decoder = build_decoder(shape)
    head = torch.nn.Sequential(decoder.norm, decoder.head)
    saved = saved_activation_bytes(head, torch.randn(batch, n, shape.hidden, requires_grad=True))
    setup = TrainSetup(context=n, batch=batch, dtype="float32", chunked_loss=chunked_loss)
    stored, _ = memory._head_elements(shape, setup)
    log_softmax = 0 if chunked_loss else shape.vocab     # the loss's own saved tensor, outside this module
    assert saved == (stored - log_softmax) * n * batch * 4


def test_whole_decoder_stores_what_the_model_counts():
    """Every stored activation of a BP step, the loss included: autograd's saved tensors of the whole decoder
    equal the model's count but for the token ids (inputs and targets, int64), which it leaves out."""
    shape, n, batch = ModelShape("t", 3, 64, 4, 2, 160, 50), 64, 2
    tokens = torch.randint(shape.vocab, (batch, n + 1), generator=torch.Generator().manual_seed(0))
    saved = saved_activation_bytes(_Loss(build_decoder(shape)), tokens)
    setup = TrainSetup(context=n, batch=batch, dtype="float32", chunked_loss=False)
    token_ids = 2 * n * batch * 8
    assert saved == pytest.approx(memory._stored_activation_bytes(shape, setup) + token_ids, rel=1e-3)


# -- the figures quoted from the memory model are the ones it prints ----------------------------------------
def _markdown(notebook: str, contains: str) -> str:
    import json
    cells = json.loads((ROOT / "notebooks" / f"{notebook}.ipynb").read_text())["cells"]
    [text] = ["".join(c["source"]) for c in cells if c["cell_type"] == "markdown" and contains in "".join(c["source"])]
    return text


def test_docs_memory_table_is_the_headline_table():
    """docs/memory.md quoted 27.2× and 24.3× at N = 32768, and 2.8× with checkpointing: the model, counting the
    head's input, prints 27.3×, 24.4× and 2.9×."""
    table = (ROOT / "docs" / "memory.md").read_text()
    labels = ("| N = 512 |", "| N = 32768 |", "| N = 32768, checkpointing |")
    for label, row in zip(labels, memory.headline_table()):
        [line] = [line for line in table.splitlines() if line.startswith(label)]
        assert f"| {row['ours']:.1f}× | {row['memory_ratio']:.1f}× |" in line, line
    sparse = memory.headline_table()[-1]["ours"]
    assert f"saves {100 * sparse:.1f}%" in table


def test_07_calculator_answer_quotes_the_calculator():
    """07 §'The calculator': the answer's GB and ratios are bp_memory / zo_memory at its three settings."""
    text = _markdown("07_memory_on_device", "the calculator reads BP")
    shape = memory.HEADLINE_SHAPE
    short, long, ckpt = (TrainSetup(context=n, batch=2, checkpointing=c) for n, c in
                         ((512, False), (32768, False), (32768, True)))
    gb = {name: (memory.bp_memory(shape, s).total / 1e9, memory.zo_memory(shape, s).total / 1e9,
                 memory.memory_ratio(shape, s)) for name, s in (("short", short), ("long", long), ("ckpt", ckpt))}
    assert "BP {:.1f} GB against ZO {:.1f} GB ({:.1f}×)".format(*gb["short"]) in text
    assert "≈ {:.0f} GB against {:.1f} GB: {:.0f}×".format(*gb["long"]) in text
    assert "to ≈ {:.0f} GB: {:.1f}× in memory".format(gb["ckpt"][0], gb["ckpt"][2]) in text


def _class_run_errors() -> tuple[str, dict[str, list[float]]]:
    """(date, {mode: relative errors in %}) of notebook 07's stored class-mode run."""
    text = (ROOT / "benchmarks" / "reference" / "class_runs" / "07_memory_on_device.txt").read_text()
    date = re.search(r"^date: (\S+)", text, re.M).group(1)
    errors: dict[str, list[float]] = {}
    for mode, error in re.findall(r"n_ctx=\s*\d+ (\w+)\s+measured .* error\s+([+-][\d.]+)%", text):
        errors.setdefault(mode, []).append(float(error))
    return date, errors


def _signed(value: float) -> str:
    return f"{value:+.1f}".replace("-", "−")


def test_docs_memory_validation_ranges_are_the_stored_class_run():
    """docs/memory.md quoted the 2026-12-03 run (−0.2…+13.1%, −4.6…−14.6%), made before the shared causal mask
    and the head's input: the stored class-mode run is the one it quotes, date and ranges."""
    date, errors = _class_run_errors()
    assert len(errors["bp"]) == 6 and len(errors["inference"]) == len(errors["zo"]) == 6
    forward = errors["inference"] + errors["zo"]
    bp = sorted(errors["bp"], key=abs)
    doc = (ROOT / "docs" / "memory.md").read_text()
    assert f"class-mode run of {date}" in doc
    assert f"inference and ZO within {_signed(min(forward))}…{_signed(max(forward))}%" in doc
    assert f"BP within {_signed(bp[0])}…{_signed(bp[-1])}%" in doc
    assert f"({_signed(bp[0])} to {_signed(bp[-1])}% in the class-mode run)" in doc


def test_07_class_mode_errors_are_the_stored_class_run():
    """07's summary and its 'Predict first' answer quote the stored class-mode run's errors per context."""
    _, errors = _class_run_errors()
    text = (ROOT / "benchmarks" / "reference" / "class_runs" / "07_memory_on_device.txt").read_text()
    rows = re.findall(r"n_ctx=\s*(\d+) (inference|zo)\s+measured .* error\s+([+-][\d.]+)%", text)
    summary = _markdown("07_memory_on_device", "## Summary")
    for context in (256, 512, 1024):
        values = sorted(float(e) for n, _, e in rows if int(n) == context)
        assert f"{_signed(values[0])} to {_signed(values[-1])}% at {context}" in summary
    bp = sorted((abs(e) for e in errors["bp"]))
    assert f"BP is measured {bp[0]:.1f}–{bp[-1]:.1f}% *below* the model" in summary
    answer = _markdown("07_memory_on_device", "will the measurement be above or below")
    assert f"by {bp[0]:.1f}–{bp[-1]:.1f}% in the class-mode run" in answer


@pytest.mark.parametrize("attention", ["fused", "materialised"])
def test_07_activation_formula_is_the_models_count(attention):
    """07 §'The maths' wrote a_layer = 6D + 2D + 2D_kv + 4D_ff [+ H·n_ctx materialised] as the count the tests
    check against autograd: the count has the norms' two 1/rms and the log-sum-exp per head (+ H + 2), and the
    materialised attention term is 4D + H·n_ctx instead of 2D + 2D_kv + H, as the text now writes."""
    text = _markdown("07_memory_on_device", "Activations stored by backprop")
    assert "\\underbrace{6D + 2}" in text and "\\underbrace{2D + 2D_{kv} + H}" in text
    assert "materialised the attention term is $4D + Hn_\\text{ctx}$ instead" in text
    for shape in (ModelShape("a", 1, 64, 4, 2, 160, 50), ModelShape("b", 1, 96, 6, 3, 200, 50, gated=True)):
        d, kv, f, h, n = shape.hidden, shape.kv_dim, shape.ffn, shape.heads, 128
        attention_term = 2 * d + 2 * kv + h if attention == "fused" else 4 * d + h * n
        count = memory.activation_elements_per_token(shape, TrainSetup(context=n, attention=attention))
        assert count == 6 * d + 2 + attention_term + 4 * f


# -- hostile values: a clear message, never NaN or a torch TypeError ----------------------------------------
@pytest.mark.parametrize("eps, why", [(1e-300, "rounds to 0"), (1e300, "not finite")])
def test_two_point_estimate_refuses_an_eps_its_dtype_cannot_hold(eps, why):
    """ε = 1e-300 is 0 in float32: every g was 0/0 = NaN (notebook 01 says a too-small ε gives ĝ = 0); ε = 1e300
    overflowed f(θ ± εz) to inf and g to inf − inf = NaN. Both are a ValueError naming ε now."""
    from sazo_lite.course import two_point

    theta = torch.tensor([1.0, 0.5])                         # float32
    bowl = lambda x: two_point.bowl_loss(x, [1.0, 4.0])     # noqa: E731
    with pytest.raises(ValueError, match=f"Invalid eps: .*{why}"):
        two_point.zo_gradient(bowl, theta, eps, 4)
    grad = two_point.bowl_grad(theta.double(), [1.0, 4.0])
    with pytest.raises(ValueError, match=f"Invalid eps: .*{why}"):
        two_point.error_vs_eps(bowl, grad, theta, [1e-3, eps])
    tiny = two_point.zo_gradient(bowl, theta, 1e-12, 4)      # representable, below float32's rounding step: ĝ = 0
    assert torch.equal(tiny, torch.zeros(2))


@pytest.mark.parametrize("dtype", ["float32", torch.int64, 0])
def test_a_problem_refuses_a_dtype_that_is_not_a_float_dtype(dtype):
    """race(dtype="float32") raised torch's "zeros(): argument 'dtype' must be torch.dtype, not str"."""
    from sazo_lite.course import problems, sazo_runs

    problem = problems.LeastSquares(num_examples=8, dim=3, seed=0)
    with pytest.raises(ValueError, match="Invalid dtype"):
        problem.initial_theta(dtype)
    with pytest.raises(ValueError, match="Invalid dtype"):
        sazo_runs.race(problem, seeds=(0,), steps=2, dtype=dtype)


@pytest.mark.parametrize("lrs", [-1, 0.01])
def test_race_dashboard_refuses_rates_that_are_not_a_dict(lrs):
    """lrs=-1 raised "'int' object is not iterable"; lrs=0.0 was read as no rates at all."""
    pytest.importorskip("ipywidgets")
    from sazo_lite.course.widgets import race_dashboard

    with pytest.raises(ValueError, match="Invalid lrs"):
        race_dashboard(seeds=1, steps=10, lrs=lrs)


def test_memory_footnote_states_the_counts_the_model_uses():
    """The printed footnote gave 8D + 2D_kv + 4F + H per layer (the count has + 2: the norms' 1/rms), '+H·N' for
    materialised scores (the attention term is 4D + H·N instead) and nothing for the final norm and head."""
    flat = " ".join(memory.FOOTNOTE.split())
    formulas = {"fused": "8D + 2D_kv + 4F + H + 2", "materialised": "10D + 4F + H·N + 2", "head": "3D + 1"}
    for formula in formulas.values():
        assert formula in flat, formula
    shape, n = memory.HEADLINE_SHAPE, 4096
    names = dict(D=shape.hidden, D_kv=shape.kv_dim, F=shape.ffn, H=shape.heads, N=n)

    def evaluate(formula: str) -> int:
        terms = [re.fullmatch(r"(\d*)([A-Z_kv]+)(?:·(\w))?|(\d+)", t.strip()).groups() for t in formula.split("+")]
        return sum(int(c) if c else (int(k or 1) * names[a] * (names[b] if b else 1)) for k, a, b, c in terms)

    for attention in ("fused", "materialised"):
        count = memory.activation_elements_per_token(shape, TrainSetup(context=n, attention=attention))
        assert evaluate(formulas[attention]) == count
    assert evaluate(formulas["head"]) == memory._head_elements(shape, TrainSetup(context=n))[0]


def test_07_solution_4_extra_elements_are_the_models():
    """Solution 4 put the materialised point at H·n_ctx on top of the fused count (8192); the model adds 8316: the
    attention term is 4D + H·n_ctx in place of 2D + 2D_kv + H."""
    from sazo_lite.course.memory_measure import TINY

    text = " ".join((ROOT / "notebooks" / "solutions" / "07_memory_on_device.md").read_text().split())
    fused, materialised = (memory.activation_elements_per_token(TINY, TrainSetup(context=2048, attention=a))
                           for a in ("fused", "materialised"))
    d, kv, h = TINY.hidden, TINY.kv_dim, TINY.heads
    assert f"H·n_ctx = {h}·2048 = {h * 2048}" in text and f"2D − 2D_kv − H = {2 * d - 2 * kv - h}" in text
    assert f"{materialised - fused:.0f} on top of the fused count" in text


def test_07_solution_5_ratio_at_every_layer_buffered_is_the_models():
    """Solution 5 said ZO's advantage with L' = L shrinks to a_layer/t ≈ 2–3×: the model gives 1.6–1.9× (BP/ZO memory
    at n_ctx = 32768, B = 2, over the ladders), a_layer/t ≈ 1.6 for Qwen2.5-3B."""
    text = " ".join((ROOT / "notebooks" / "solutions" / "07_memory_on_device.md").read_text().split())
    ratios = [memory.memory_ratio(s, TrainSetup(context=32768, batch=2, zo_buffered_layers=s.layers))
              for ladder in memory.LADDERS.values() for s in ladder]
    assert f"gives {min(ratios):.1f}–{max(ratios):.1f}× across the ladders' models" in text
    setup = TrainSetup(context=32768, batch=2)
    per_token = (memory.activation_elements_per_token(memory.HEADLINE_SHAPE, setup)
                 / memory.transient_elements_per_token(memory.HEADLINE_SHAPE, setup))
    assert f"a_layer/t ≈ {per_token:.1f} for Qwen2.5-3B" in text
