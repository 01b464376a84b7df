"""Queries to a target training loss and held-out accuracy: MeZO (uniform) vs SAZO on a generated task.

For each seed, both methods start from the same weights and run ``zo_finetune`` with the same
lr, ε and B; the full training loss F(θ) (all N examples, noisy labels included) is evaluated
every ``--log-every`` steps. Reported per seed: queries (2·B per step) until F(θ) ≤ target,
and held-out accuracy after the full budget, with zero-shot accuracy for reference.

Models: ``--model tiny`` (a random-init 2-layer Llama with the offline MiniLM tokenizer, the
transformer blocks tuned in full: seconds per run) or ``--model smollm2`` (SmolLM2-135M with
rank-4 LoRA on q/v: minutes per run on 2 CPU cores).

Run: ``python -m benchmarks.llm_queries --model smollm2 --seeds 0 1 2 --num-train 32 --num-test 32 --batch 8
--lr 3e-3 --eps 1e-2 --steps 60 --log-every 5 --target-fraction 0.93``
"""
from __future__ import annotations

import argparse
import statistics

from sazo_lite.llm import (accuracy, add_lora, load_smollm2, make_task, minilm_dir, restore_snapshot, snapshot,
                           tiny_causal_lm, trainable_parameters, zo_finetune)


def setup(name: str, seed: int):
    if name == "smollm2":
        model, tokenizer = load_smollm2()
        model = add_lora(model, rank=4, init_seed=seed)
        return model, tokenizer, trainable_parameters(model)
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(minilm_dir())
    model = tiny_causal_lm("llama", vocab_size=tokenizer.vocab_size, seed=seed)
    return model, tokenizer, [p for n, p in model.named_parameters() if "layers." in n]


def one_seed(args, seed: int) -> dict:
    model, tokenizer, params = setup(args.model, seed)
    task = make_task(args.task, num_train=args.num_train, num_test=args.num_test, noise=args.noise, seed=seed)
    train_batch, test_batch = task.encode(tokenizer, "train"), task.encode(tokenizer, "test")
    start = snapshot(params)
    out = {"zero_shot": accuracy(model, test_batch)}
    for method in ("mezo", "sazo"):
        restore_snapshot(params, start)
        run = zo_finetune(model, params, train_batch, test_batch, method=method, steps=args.steps,
                          batch_size=args.batch, lr=args.lr, eps=args.eps, seed=seed, log_every=args.log_every,
                          progress=False)
        target = args.target if args.target is not None else args.target_fraction * run.train_loss[0]
        hit = next((q for q, loss in zip(run.queries, run.train_loss) if loss <= target), None)
        noisy_share = float(run.sample_counts[task.noisy_indices].sum() / run.sample_counts.sum())
        out[method] = dict(queries=hit, accuracy=run.test_accuracy[-1], final_loss=run.train_loss[-1],
                           start_loss=run.train_loss[0], noisy_share=noisy_share)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("tiny", "smollm2"), default="tiny")
    parser.add_argument("--task", default="sentiment")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--num-train", type=int, default=48)
    parser.add_argument("--num-test", type=int, default=48)
    parser.add_argument("--noise", type=float, default=0.15)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--eps", type=float, default=1e-3)
    parser.add_argument("--log-every", type=int, default=20)
    parser.add_argument("--target", type=float, default=None, help="absolute target for F(θ)")
    parser.add_argument("--target-fraction", type=float, default=0.95, help="else: target = this × F(θ₀)")
    args = parser.parse_args()
    print(f"model={args.model} task={args.task} N={args.num_train} noise={args.noise} B={args.batch} "
          f"lr={args.lr} eps={args.eps} steps={args.steps} "
          f"target F≤{args.target if args.target is not None else f'{args.target_fraction}·F(θ₀)'}")
    ratios = []
    for seed in args.seeds:
        r = one_seed(args, seed)
        m, s = r["mezo"], r["sazo"]
        print(f"seed {seed}: zero-shot acc {r['zero_shot']:.3f} | "
              f"MeZO queries {m['queries']} acc {m['accuracy']:.3f} F {m['start_loss']:.3f}→{m['final_loss']:.3f} "
              f"noisy share {m['noisy_share']:.2f} | "
              f"SAZO queries {s['queries']} acc {s['accuracy']:.3f} F {s['start_loss']:.3f}→{s['final_loss']:.3f} "
              f"noisy share {s['noisy_share']:.2f}", flush=True)
        if m["queries"] and s["queries"]:
            ratios.append(m["queries"] / s["queries"])
    if ratios:
        print(f"uniform/SAZO queries ratio: median {statistics.median(ratios):.2f} over {len(ratios)} seeds "
              f"(noise fraction of examples: {args.noise:.0%})")


if __name__ == "__main__":
    main()
