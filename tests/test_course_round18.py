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
