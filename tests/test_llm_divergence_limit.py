"""The language-model runs draw their divergence limit from the library's one rule (``train.divergence_limit``):
a run whose F(θ₀) is exactly 0 with ``diverge_factor=inf`` (never diverge) used to compute inf × 0 = NaN as its
limit, which ``train`` refuses, so the run raised before its first step."""
from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("transformers")

import sazo_lite.llm.queries as queries
from sazo_lite.llm.queries import query_run
from sazo_lite.llm.topblock import TopBlocks

from test_llm_round9 import batch
from test_llm_topblock import lora_top


def zero_objective(model, train_batch, loss):
    """Every example's loss 0 whatever θ: F(θ₀) = 0 exactly (a model that already fits its set)."""
    losses = lambda indices: torch.zeros(len(list(indices)))
    return losses, lambda: 0.0, lambda params: torch.ones(len(train_batch))


@pytest.mark.parametrize("sampler", ["uniform", "sazo"])
def test_a_run_from_a_zero_loss_never_diverges_with_an_infinite_factor(monkeypatch, sampler):
    monkeypatch.setattr(queries, "_objective", zero_objective)
    model, params = lora_top("llama")
    run = query_run(model, params, TopBlocks(model, batch(6)), sampler, lr=1e-2, steps=6, log_every=2,
                    diverge_factor=math.inf)
    assert not run.diverged and run.steps_run == 6 and run.train_loss == [0.0] * 4
