"""F under random displacements (sazo_lite.llm.landscape): the ± pairs against exact curvature."""
import pytest
import torch

from sazo_lite.llm.landscape import displaced_losses, random_walk_descent


def quadratic(matrix, vector, theta):
    return lambda: float(0.5 * theta.detach().double() @ matrix @ theta.detach().double() + vector @ theta.detach().double())


def test_the_pairs_cancel_the_gradient_and_the_mean_curvature_estimates_the_trace_per_dimension():
    g = torch.Generator().manual_seed(0)
    d = 40
    root = torch.randn(d, d, generator=g, dtype=torch.float64)
    matrix = root @ root.T / d - 1.5 * torch.eye(d, dtype=torch.float64)      # indefinite, tr A/d ≈ −0.5
    theta = torch.nn.Parameter(torch.randn(d, generator=g, dtype=torch.float64))
    linear = random_walk_descent(quadratic(torch.zeros(d, d, dtype=torch.float64), torch.randn(d, generator=g,
                                 dtype=torch.float64), theta), [theta], radii=[0.1, 3.0], draws=5)
    assert max(abs(c) for changes in linear["changes"] for c in changes) < 1e-12      # ±u: the slope cancels
    walk = random_walk_descent(quadratic(matrix, torch.randn(d, generator=g, dtype=torch.float64), theta), [theta],
                               radii=[2.0], draws=2000, seed=1)
    per_draw = torch.tensor(walk["changes"][0]) * 2 / 4.0          # uᵀAu of each draw
    standard_error = float(per_draw.std()) / 2000 ** 0.5
    assert abs(walk["curvature"][0] - float(matrix.trace()) / d) < 4 * standard_error
    assert walk["curvature"][0] < 0 and walk["mean_change"][0] == pytest.approx(
        sum(walk["changes"][0]) / 2000 / walk["F"])


def test_the_curvature_of_a_tiny_language_model_matches_autograd_draw_by_draw_and_theta_is_restored():
    pytest.importorskip("transformers")
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from sazo_lite.llm.finetune import mean_loss
    from sazo_lite.llm.losses import classification_losses
    from test_llm_norms import lora_model, random_batch

    model, params = lora_model("llama", seed=0)
    model.double()
    params = [p for p in params]
    batch, before = random_batch(n=6, seed=2), [p.detach().clone() for p in params]
    radius, draws = 0.05, 3      # F is float32 by design: r large for its round-off, small for 3rd order
    pairs = displaced_losses(lambda: mean_loss(model, batch), params, radius=radius, draws=draws, seed=7)
    assert all(torch.equal(p, b) for p, b in zip(params, before))               # θ exactly as it was
    start = mean_loss(model, batch)
    g = torch.Generator().manual_seed(7)                                         # the same directions, by hand
    exacts = []
    for k in range(draws):
        u = [torch.randn(p.shape, generator=g, dtype=torch.float64) for p in params]
        norm = sum(float(x.pow(2).sum()) for x in u) ** 0.5
        u = [x / norm for x in u]
        with sdpa_kernel(SDPBackend.MATH):              # the fused kernels have no double backward
            loss = classification_losses(model, batch, list(range(len(batch))), grad=True).mean()
            grads = torch.autograd.grad(loss, params, create_graph=True)
            hvp = torch.autograd.grad(sum((gr * x).sum() for gr, x in zip(grads, u)), params)
        exact = sum(float((h * x).sum()) for h, x in zip(hvp, u))                # uᵀHu
        measured = (float(pairs[k].sum()) - 2 * start) / radius ** 2
        # round-off: four float32 losses ≈ 1.1 each, ± a few 1e-7, over r² = 2.5e-3
        assert measured == pytest.approx(exact, rel=0.02, abs=3e-4)
        exacts.append(abs(exact))
    assert max(exacts) > 30 * 3e-4         # one draw at least is checked to 2%, not to the round-off


def test_theta_is_restored_when_the_loss_fails_and_bad_sizes_are_refused():
    theta = torch.nn.Parameter(torch.arange(4.0))
    calls = []

    def failing():
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("out of memory")
        return 0.0
    with pytest.raises(RuntimeError):
        displaced_losses(failing, [theta], radius=1.0)
    assert torch.equal(theta.detach(), torch.arange(4.0))
    for radius, draws in ((0.0, 2), (-1.0, 2), (float("nan"), 2), (1.0, 0)):
        with pytest.raises(ValueError, match="Invalid radius or draws"):
            displaced_losses(lambda: 0.0, [theta], radius=radius, draws=draws)
