"""Language models fine-tuned by forward passes alone: offline models, losses, tuning modes, tasks.

    from sazo_lite.llm import load_smollm2, make_task, add_lora, trainable_parameters, zo_finetune
    model, tok = load_smollm2()                           # offline, cached float32 copy
    task = make_task("sentiment", num_train=64, noise=0.15)
    model = add_lora(model, rank=4)
    run = zo_finetune(model, trainable_parameters(model), task.encode(tok, "train"),
                      task.encode(tok, "test"), method="sazo", steps=200)

Top-block tuning on cached activations (only the top k blocks run during tuning): ``TopBlocks``,
``top_layers`` (``add_lora(model, layers=top_layers(model, k))``), ``top_block_parameters``.

Continual-tuning sets, true per-example gradient norms and uniform/SAZO/oracle query runs:
``make_continual_set``, ``grad_norms``, ``query_run`` (notebook 06, ``benchmarks/llm_queries.py``).

Needs the ``llm`` extra (transformers, peft, gguf, accelerate).
"""
from .continual import ContinualSet, cached_first_round, first_round, heterogeneity, make_continual_set
from .finetune import FinetuneRun, METHODS, mean_loss, restore_snapshot, snapshot, zo_finetune
from .grad_norms import RefreshingNorms, grad_norms
from .losses import (TokenBatch, accuracy, answer_losses, batched_closure, classification_logits,
                     classification_losses, encode_answers, encode_classification, label_word_ids, predict)
from .models import (TINY_FAMILIES, cache_dir, default_device, load_causal_lm, load_minilm, load_smollm2,
                     minilm_dir, smollm2_gguf_path, tiny_causal_lm)
from .queries import QueryRun, queries_to, query_run
from .tasks import TASKS, ClassificationTask, Example, load_hf_task, make_task
from ..precision import Float32Master, restore_bound, unit_roundoff
from ..sparse import SparseMeZO, sparse_indices
from .tuning import add_lora, full_parameters, parameter_count, trainable_parameters
from .topblock import TopBlocks, decoder_layers, top_block_parameters, top_layers

__all__ = ["ContinualSet", "cached_first_round", "first_round", "heterogeneity", "make_continual_set",
           "RefreshingNorms", "grad_norms", "QueryRun", "queries_to", "query_run", "FinetuneRun", "METHODS", "mean_loss", "restore_snapshot", "snapshot", "zo_finetune",
           "TokenBatch", "accuracy", "answer_losses", "batched_closure", "classification_logits",
           "classification_losses", "encode_answers", "encode_classification", "label_word_ids", "predict",
           "TINY_FAMILIES", "cache_dir", "default_device", "load_causal_lm", "load_minilm", "load_smollm2",
           "minilm_dir", "smollm2_gguf_path", "tiny_causal_lm", "TASKS", "ClassificationTask", "Example",
           "load_hf_task", "make_task", "Float32Master", "SparseMeZO", "add_lora", "full_parameters",
           "parameter_count", "restore_bound", "sparse_indices", "trainable_parameters", "unit_roundoff",
           "TopBlocks", "decoder_layers", "top_block_parameters", "top_layers"]
