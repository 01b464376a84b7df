"""The language-model losses keep a float64 model's precision, as ZOTrainer's default loss does.

Before, classification_losses, answer_losses and TopBlocks cast the logits to float32 whatever the model's dtype,
so a float64 model's ZO difference f(θ+εz) − f(θ−εz) at a small ε was float32 rounding."""
import torch

from sazo_lite.llm import tiny_causal_lm
from sazo_lite.llm.losses import TokenBatch, answer_losses, at_least_float32, classification_losses
from sazo_lite.llm.topblock import TopBlocks, top_block_parameters


def _batch(model) -> TokenBatch:
    generator = torch.Generator().manual_seed(0)
    ids = [torch.randint(3, model.config.vocab_size, (length,), generator=generator).tolist()
           for length in (4, 7, 5, 6)]
    return TokenBatch(ids, [len(row) - 1 for row in ids], 0, torch.tensor([0, 1, 1, 0]), torch.tensor([5, 9]))


def _difference(losses, params, eps: float) -> torch.Tensor:
    """(f(θ+εz) − f(θ−εz)) / 2ε per example, z fixed, in float64."""
    z = [torch.randn(p.shape, generator=torch.Generator().manual_seed(1), dtype=p.dtype) for p in params]
    with torch.no_grad():
        for p, d in zip(params, z):
            p.add_(d, alpha=eps)
        plus = losses().double()
        for p, d in zip(params, z):
            p.add_(d, alpha=-2 * eps)
        minus = losses().double()
        for p, d in zip(params, z):
            p.add_(d, alpha=eps)
    return (plus - minus) / (2 * eps)


def test_the_rule_upcasts_half_precision_and_keeps_float64():
    for dtype, wanted in ((torch.float16, torch.float32), (torch.bfloat16, torch.float32),
                          (torch.float32, torch.float32), (torch.float64, torch.float64)):
        assert at_least_float32(torch.zeros(2, dtype=dtype)).dtype == wanted


def test_a_float64_models_losses_and_differences_keep_float64():
    model = tiny_causal_lm("gpt2", dtype=torch.float64).eval()
    data = _batch(model)
    indices = [0, 1, 2, 3]
    assert classification_losses(model, data, indices).dtype == torch.float64
    assert answer_losses(model, data, indices).dtype == torch.float64
    params = top_block_parameters(model, 1)   # freezes the rest, as the cache needs
    top = TopBlocks(model, data, blocks=1)
    assert top(indices).dtype == torch.float64
    coarse = _difference(lambda: top(indices), params, 1e-5)
    fine = _difference(lambda: top(indices), params, 1e-7)
    # smooth losses: the two radii agree to O(ε²); rounded to float32 the fine one was rounding noise
    assert torch.allclose(fine, coarse, rtol=1e-4, atol=1e-6), (fine, coarse)
    full = _difference(lambda: classification_losses(model, data, indices), params, 1e-7)
    assert torch.allclose(full, coarse, rtol=1e-4, atol=1e-6), (full, coarse)
