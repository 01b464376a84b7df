"""ZO step time ÷ (2 × forward time) for SmolLM2-135M-Instruct on this machine, B=8, seq=64.

A MeZO step is two forwards plus three passes over the parameters (+εz, −2εz, restore+update),
each regenerating z from a seed (two with ``fold_updates=True``: the update rides on the next +εz). The ratio says how much the passes cost on top of the two
forwards (1.0 = free). Measured back to back in one process (which runs first alternates), median of ``--repeats``:

    forward        answer-token CE (``answer_losses``) on B random 64-token rows, float32
    full step      ``MeZO`` over all 134.5M parameters: the plain loop, ``noise=TorchNoise()`` (the
                   plain loop's z), the default (``noise="auto"``: ``GaussianTable`` for this CPU
                   model) and the default folded
    LoRA step      ``MeZO`` over rank-8 q/v adapters only (peft)
    sparse step    ``SparseMeZO`` over a fixed 1% of every tensor

Run: ``python -m benchmarks.llm_step_ratio [--repeats 3] [--batch 8] [--seq 64]`` (the bound on the
default step, with its breakdown, is ``python -m benchmarks.engine_speed speed smollm2 --bound 1.15``,
``make bench-step``)
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from sazo_lite import MeZO
from sazo_lite.noise import TorchNoise
from sazo_lite.sparse import SparseMeZO, sparse_indices
from sazo_lite.llm import (TokenBatch, add_lora, answer_losses, full_parameters, load_smollm2, trainable_parameters)


def random_rows(batch: int, seq: int, vocab: int, seed: int = 0) -> TokenBatch:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(100, vocab, (batch, seq), generator=g).tolist()
    return TokenBatch(ids=ids, prompt_lengths=[seq // 2] * batch, pad_id=0)


def seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def paired_ratio(forward, step, repeats: int) -> tuple[float, float, float]:
    """Median over repeats of step / (2 × forward), each pair timed back to back (load drifts); which of the two
    runs first alternates from pair to pair, so that warm caches or a drifting load favour neither side."""
    pairs = []
    for k in range(repeats):
        if k % 2:
            s = seconds(step)
            pairs.append((seconds(forward), s))
        else:
            pairs.append((seconds(forward), seconds(step)))
    ratios = [s / (2 * f) for f, s in pairs]
    return (statistics.median(f for f, _ in pairs), statistics.median(s for _, s in pairs),
            statistics.median(ratios))


def main(argv=None) -> None:
    from benchmarks.cli import count, machine, measured_line

    parser = argparse.ArgumentParser(prog="python -m benchmarks.llm_step_ratio", description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=count, default=3, help="back-to-back (forward, step) pairs per row (default 3)")
    parser.add_argument("--batch", type=count, default=8, help="B, sequences per batch (default 8)")
    parser.add_argument("--seq", type=count, default=64, help="tokens per sequence (default 64)")
    args = parser.parse_args(argv)
    model, tokenizer = load_smollm2()
    rows = random_rows(args.batch, args.seq, tokenizer.vocab_size)
    closure = lambda: answer_losses(model, rows)  # noqa: E731
    closure()  # warm-up
    params = full_parameters(model)
    full_opt = MeZO(params, lr=0.0, eps=1e-3, noise=None)  # the plain loop
    sparse_opt = SparseMeZO(params, sparse_indices(params, 0.01), lr=0.0, eps=1e-3)
    fast_opt = MeZO(params, lr=0.0, eps=1e-3, noise=TorchNoise())  # same z, chunked + 2 threads
    default_opt = MeZO(params, lr=0.0, eps=1e-3)  # noise="auto"
    folded_opt = MeZO(params, lr=0.0, eps=1e-3, fold_updates=True)  # 2 passes a step
    folded_opt.step(closure)  # steady state: every later step folds the previous update in
    default = f"full, {type(default_opt.noise).__name__}"
    results = {"full, plain loop": paired_ratio(closure, lambda: full_opt.step(closure), args.repeats),
               "full, TorchNoise": paired_ratio(closure, lambda: fast_opt.step(closure), args.repeats),
               default: paired_ratio(closure, lambda: default_opt.step(closure), args.repeats),
               f"{default}, folded": paired_ratio(closure, lambda: folded_opt.step(closure), args.repeats),
               "sparse 1%": paired_ratio(closure, lambda: sparse_opt.step(closure), args.repeats)}
    peft_model = add_lora(model, rank=8)
    lora_closure = lambda: answer_losses(peft_model, rows)  # noqa: E731
    lora_opt = MeZO(trainable_parameters(peft_model), lr=0.0, eps=1e-3)
    folded_opt.flush()
    results["LoRA r=8"] = paired_ratio(lora_closure, lambda: lora_opt.step(lora_closure), args.repeats)
    print(f"SmolLM2-135M, B={args.batch}, seq={args.seq}, float32, median of {args.repeats} back-to-back pairs, "
          f"{measured_line(machine())}")
    for name, (forward, step, ratio) in results.items():
        print(f"{name:28s} forward {forward:.3f} s  step {step:.3f} s  step / (2 × forward) = {ratio:.2f}")


if __name__ == "__main__":
    main()
