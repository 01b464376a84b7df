"""Peak resident memory of inference, a ZO step and a backprop SGD step on a real causal LM.

Each measurement runs in a fresh Python process (peak RSS only ever grows inside one):

    child: load the model (SmolLM2 from the cache, or a tiny family), encode B training
           prompts; run the step once at a small batch (warm-up), note peak RSS = baseline;
           run ONE step on the real batch; report peak RSS and peak − baseline

Full-parameter tuning in all three modes, so the bars compare like with like: ZO needs
no activations kept for backward and no gradients, backprop SGD needs both.

    python -m sazo_lite.course.memory_probe '{"mode": "zo", "model": "smollm2", "batch": 8}'

Example:
    >>> measure_step("zo", model="tiny-llama", batch=4)["peak_rss"] > 0   # doctest: +SKIP
    True
"""
from __future__ import annotations

import json
import sys

from .memory_measure import run_child
from ..validation import check_choice, check_count

__all__ = ["MODES", "measure_step", "measure_all"]

MODES = ("inference", "zo", "bp")


def _load(name: str):
    from ..llm.models import load_smollm2, tiny_causal_lm
    from transformers import AutoTokenizer
    from ..llm.models import minilm_dir

    if name == "smollm2":
        return load_smollm2(verbose=False)
    if name.startswith("tiny-"):
        tokenizer = AutoTokenizer.from_pretrained(minilm_dir())
        return tiny_causal_lm(name[5:], vocab_size=tokenizer.vocab_size), tokenizer
    raise ValueError(f"Invalid model: {name!r} (expected 'smollm2' or 'tiny-<family>')")


def _one_step(mode: str, model, batch, indices, optimiser) -> None:
    import torch
    from ..llm.losses import classification_losses

    if mode == "inference":
        classification_losses(model, batch, indices)
    elif mode == "zo":
        optimiser.step(lambda: classification_losses(model, batch, indices))
    else:  # backprop: the same loss with autograd on (no inference_mode)
        optimiser.zero_grad(set_to_none=True)
        inputs = batch.select(indices, next(model.parameters()).device)
        logits = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]).logits
        last = logits[torch.arange(len(indices)), inputs["lengths"] - 1][:, batch.label_ids]
        torch.nn.functional.cross_entropy(last.float(), batch.labels[indices]).backward()
        optimiser.step()


def _child(spec: dict) -> dict:
    import torch
    from ..engine import MeZO
    from .memory_measure import peak_rss_bytes
    from ..llm.tasks import make_task

    torch.manual_seed(0)
    model, tokenizer = _load(spec["model"])
    task = make_task(spec.get("task", "sentiment"), num_train=spec["batch"], num_test=1, noise=0.0)
    batch = task.encode(tokenizer, "train")
    params = [p for p in model.parameters()]
    mode = spec["mode"]
    if mode == "bp":
        model.train(False)  # no dropout; autograd still records
        optimiser = torch.optim.SGD(params, lr=1e-6)
    else:
        optimiser = MeZO(params, lr=1e-6, eps=1e-3)
    _one_step(mode, model, batch, [0], optimiser)           # warm-up at B=1
    model.zero_grad(set_to_none=True)
    baseline = peak_rss_bytes()
    _one_step(mode, model, batch, list(range(spec["batch"])), optimiser)
    peak = peak_rss_bytes()
    return dict(peak_rss=peak, extra=peak - baseline, baseline=baseline)


def measure_step(mode: str, *, model: str = "smollm2", batch: int = 8, task: str = "sentiment",
                 timeout: float = 600.0) -> dict:
    """One measurement in a fresh process: {"peak_rss", "extra", "baseline"} in bytes."""
    mode = check_choice("mode", mode, MODES)
    # batch=True was sent as JSON true and measured B = 1; a numpy int made json.dumps raise TypeError
    batch = check_count("batch", batch)
    for name, value in (("model", model), ("task", task)):
        if not isinstance(value, str):
            raise ValueError(f"Invalid {name}: {value!r} (expected a name, a str)")
    spec = json.dumps(dict(mode=mode, model=str(model), batch=batch, task=str(task)))
    return run_child("sazo_lite.course.memory_probe", [spec], timeout=timeout,
                     env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})


def measure_all(*, model: str = "smollm2", batch: int = 8, modes=MODES) -> dict[str, dict]:
    """``measure_step`` for each mode: {"inference": {...}, "zo": {...}, "bp": {...}}."""
    from tqdm.auto import tqdm

    return {mode: measure_step(mode, model=model, batch=batch) for mode in tqdm(modes, desc="memory probes")}


if __name__ == "__main__":
    print(json.dumps(_child(json.loads(sys.argv[1]))))
