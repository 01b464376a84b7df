"""Round 13 review of the language-model part (sazo_lite.llm): generated tasks and continual sets hold distinct
prompts and a test split disjoint from train (drawn with replacement, the default yesno task held 53 distinct of
64 train prompts and 26 test examples also in train), the first-round cache is keyed by its setup, and hostile
inputs to top-block tuning, query races, the losses and the per-example norms. Each test of a fix failed on the
code before it."""
from __future__ import annotations

import itertools
import random

import pytest
import torch

pytest.importorskip("transformers")

from sazo_lite.llm import TINY_FAMILIES, add_lora, full_parameters, tiny_causal_lm, trainable_parameters
from sazo_lite.llm import continual, tasks
from sazo_lite.llm.continual import GROUPS, SET_NAMES, cached_first_round, make_continual_set
from sazo_lite.llm.finetune import mean_loss, snapshot
from sazo_lite.llm.grad_norms import directional_error, full_gradient_norm, grad_norms
from sazo_lite.llm.losses import TokenBatch, answer_losses, classification_losses
from sazo_lite.llm.queries import query_run
from sazo_lite.llm.tasks import DISTINCT_PROMPTS, TASKS, make_task
from sazo_lite.llm.topblock import TopBlocks, decoder_layers, top_block_parameters, top_layers

from test_llm_round9 import VOCAB, batch, jiggle    # the same tiny batches
from test_llm_round10 import word_tokenizer         # a tokenizer built in memory
from test_llm_topblock import lora_top              # LoRA on a tiny model's top block


def prompts(examples) -> list[str]:
    return [e.prompt for e in examples]


def assert_distinct_and_disjoint(train, test) -> None:
    assert len(set(prompts(train))) == len(train)
    assert len(set(prompts(test))) == len(test)
    assert not set(prompts(train)) & set(prompts(test))


# --- 1. generated tasks: distinct prompts, test disjoint from train -------------------------------------------------
@pytest.mark.parametrize("name", sorted(TASKS))
@pytest.mark.parametrize("seed", range(4))
def test_make_task_prompts_are_distinct_and_test_is_disjoint_from_train(name, seed):
    task = make_task(name, seed=seed)                       # the defaults: 64 + 64
    assert_distinct_and_disjoint(task.train, task.test)
    assert len(task.train) == len(task.test) == 64
    assert len(task.noisy_indices) == round(0.1 * 64) and not any(e.noisy for e in task.test)


def with_replacement(name, num_train, num_test, noise, seed):
    """What make_task drew before round 13: every draw kept, then the same flips."""
    generate = TASKS[name][0]
    rng = random.Random(seed)
    examples = [tasks.Example(p, y, y, k) for p, y, k in (generate(rng) for _ in range(num_train + num_test))]
    return tasks._flip(examples[:num_train], noise, rng), examples[num_train:]


def test_make_task_is_unchanged_where_the_draws_held_no_repeat():
    clean = 0
    for name, seed, (n, t) in itertools.product(sorted(TASKS), range(12), [(4, 2), (16, 4), (20, 5), (40, 10)]):
        train, test = with_replacement(name, n, t, 0.2, seed)
        if len(set(prompts(train + test))) == n + t:
            clean += 1
            task = make_task(name, num_train=n, num_test=t, noise=0.2, seed=seed)
            assert (task.train, task.test) == (train, test), (name, seed, n, t)
    assert clean > 50       # the comparison was made


def sentiment_prompts() -> set[str]:
    nouns, pos, neg = tasks._NOUNS, tasks._POSITIVE, tasks._NEGATIVE
    out = set()
    for noun, (good, bad) in itertools.product(nouns, [(pos, neg), (neg, pos)]):
        for a in good:
            out |= {f"The {noun} was {a}.", f"It is not true that the {noun} was not {a}."}
            out |= {f"The {noun} started {o}, but in the end it was {a}." for o in bad}
        out |= {f"The {noun} was not {o}." for o in bad}
    return {f"Review: {s}\nSentiment:" for s in out}


def numbers_prompts() -> set[tuple[int, int]]:
    far = {(a, b) for a in range(1, 100) for b in range(1, 100) if abs(a - b) >= 30}
    close = {(a, a + d) for a in range(10, 99) for d in (-2, -1, 1, 2)}
    three = {(a, a + s * d) for a in range(100, 999) for s in (-1, 1) for d in range(1, 50)}
    return far | close | three


def yesno_prompts() -> set[str]:
    things = [x for xs in tasks._CATEGORIES.values() for x in xs]
    out = set()
    for category, thing in itertools.product(tasks._CATEGORIES, things):
        article = "an" if thing[0] in "aeiou" else "a"
        out |= {f"Question: Is {article} {thing} {category}?\nAnswer:",
                f"Question: Is {article} {thing} not {category}?\nAnswer:"}
    return out


def test_distinct_prompts_counts_what_each_generator_can_draw():
    sentiment, yesno = sentiment_prompts(), yesno_prompts()
    numbers = {f"Question: Is {a} larger than {b}?\nAnswer:" for a, b in numbers_prompts()}
    assert {name: len(s) for name, s in [("sentiment", sentiment), ("numbers", numbers), ("yesno", yesno)]} \
        == DISTINCT_PROMPTS
    rng = random.Random(0)
    for name, every in [("sentiment", sentiment), ("numbers", numbers), ("yesno", yesno)]:
        drawn = {TASKS[name][0](rng)[0] for _ in range(150_000 if name == "sentiment" else 20_000)}
        assert drawn <= every, name                  # nothing outside the enumeration
        if name != "numbers":
            assert drawn == every, name              # and all of it is reachable


def test_make_task_takes_every_distinct_prompt_and_refuses_one_more():
    task = make_task("yesno", num_train=100, num_test=44, seed=3)       # all 144, by drawing on
    assert set(prompts(task.train + task.test)) == yesno_prompts()
    with pytest.raises(ValueError, match=r"Invalid num_train \+ num_test: 145 .* can make 144"):
        make_task("yesno", num_train=100, num_test=45)
    with pytest.raises(ValueError, match="can make 1760"):
        make_task("sentiment", num_train=1000, num_test=761)


def test_draw_distinct_gives_up_with_a_value_error_rather_than_looping():
    rng = random.Random(0)
    draw = lambda _: tasks.Example(f"p{rng.randrange(3)}", 0, 0, "x")    # noqa: E731 - three prompts only
    with pytest.raises(ValueError, match="Invalid num_train: 1000 draws .* gave 3 of 4"):
        tasks.draw_distinct(draw, 4, set(), what="three prompts", argument="num_train")


# --- 2. continual sets -----------------------------------------------------------------------------------------
SIZES = [dict(num_train=32, new_fraction=0.125, num_test=32), dict(num_train=64, new_fraction=0.125, num_test=32),
         dict(num_train=24, new_fraction=1 / 6, num_test=32), dict(num_train=96, new_fraction=0.125, num_test=32)]


@pytest.mark.parametrize("name", SET_NAMES)
@pytest.mark.parametrize("sizes", SIZES)
def test_continual_sets_hold_distinct_prompts_and_a_disjoint_test_split(name, sizes):
    pool = 2 * sizes["num_train"] if name == "homogeneous" and sizes["num_train"] < 64 else None
    cset = make_continual_set(name, seed=0, pool=pool, **sizes)   # the benchmarks' sizes (opposed N = 64: 54 of 64)
    assert_distinct_and_disjoint(cset.task.train, cset.task.test)
    assert len(set(prompts(cset.setup))) == len(cset.setup)
    if name == "opposed":
        labels = [e.label for e in cset.task.test]
        assert labels == [1 - k % 2 for k in range(len(labels))]   # still alternating


def old_continual(name, num_train, new_fraction, num_test, seed, pool=None):
    """What make_continual_set drew before round 13 (the continual, homogeneous and opposed sets)."""
    rng = random.Random(seed)
    kinds = [continual._number_question, continual._category_question]
    new = ((lambda k: continual._negated_sentiment_question(rng, liked=k % 2)) if name == "opposed"
           else (lambda k: kinds[k % 2](rng)))
    num_new = min(num_train, max(1, round(new_fraction * num_train)))
    setup = [continual._sentiment_question(rng) for _ in range(num_train - num_new)]
    drawn = [new(k) for k in range((num_train if pool is None else pool) if name == "homogeneous" else num_new)]
    return setup, drawn, [new(k) for k in range(num_test)]


def test_continual_sets_are_unchanged_where_the_draws_held_no_repeat():
    clean = 0
    for name, seed, (n, f, t) in itertools.product(["continual", "homogeneous", "opposed"], range(20),
                                                  [(8, 0.25, 4), (12, 0.25, 2), (16, 0.5, 8), (24, 1 / 3, 2)]):
        setup, drawn, test = old_continual(name, n, f, t, seed)
        if len(set(prompts(setup + drawn + test))) == len(setup + drawn + test):
            clean += 1
            cset = make_continual_set(name, num_train=n, new_fraction=f, num_test=t, seed=seed)
            assert cset.setup == setup and cset.task.test == test
            assert cset.task.train == (drawn if name == "homogeneous" else setup + drawn)
    assert clean > 30


@pytest.mark.parametrize("name, sizes, argument", [
    ("opposed", dict(num_train=192, new_fraction=0.125), "num_train"),          # 168 setup questions of 160
    ("balanced", dict(num_train=192, new_fraction=0.125), "num_train"),
    ("homogeneous", dict(num_train=64, new_fraction=0.125, pool=128), "num_test"),   # 80 category questions of 72
    ("opposed", dict(num_train=64, new_fraction=0.5, num_test=140), "num_test"),     # 86 of one label of 80
])
def test_continual_sets_refuse_sizes_past_their_distinct_questions(name, sizes, argument):
    with pytest.raises(ValueError, match=f"Invalid {argument}: .*can make"):
        make_continual_set(name, **{"num_test": 32, **sizes})


def test_the_balanced_sets_test_things_never_wrap_onto_the_train_things():
    per_group = len(next(iter(GROUPS.values())))
    ok = make_continual_set("balanced", num_train=96, new_fraction=0.125, num_test=4 * (per_group - 3))
    assert_distinct_and_disjoint(ok.task.train, ok.task.test)         # 3 + 13 things of each group
    with pytest.raises(ValueError, match="Invalid num_test"):        # was a test split asking about train's things
        make_continual_set("balanced", num_train=96, new_fraction=0.125, num_test=4 * (per_group - 3) + 1)


def test_a_first_round_cached_for_one_setup_is_not_read_for_another(tmp_path, monkeypatch):
    monkeypatch.setenv("SAZO_CACHE", str(tmp_path))
    tokenizer = word_tokenizer(eos_token="c")
    one = make_continual_set("continual", num_train=4, num_test=2, seed=0)
    other = make_continual_set("continual", num_train=4, num_test=2, seed=1)
    assert prompts(one.setup) != prompts(other.setup)
    model = tiny_causal_lm("llama", vocab_size=VOCAB)
    assert cached_first_round(model, full_parameters(model), one, tokenizer, key="k", steps=1, progress=False) is False
    fresh = tiny_causal_lm("llama", vocab_size=VOCAB)
    # the same key (model and sizes): was True, the round tuned on the other setup loaded as this one's
    used = cached_first_round(fresh, full_parameters(fresh), other, tokenizer, key="k", steps=1, progress=False)
    assert used is False
    again = tiny_causal_lm("llama", vocab_size=VOCAB)
    assert cached_first_round(again, full_parameters(again), one, tokenizer, key="k", steps=1, progress=False) is True
    assert all(torch.equal(a, b) for a, b in zip(full_parameters(again), full_parameters(model)))


# --- 3. per-example norms: the loss asked for, tensors autograd can differentiate, non-empty batches -------------
def equal_length_batch(n: int = 4, seed: int = 0) -> TokenBatch:
    """n examples of 5 tokens (no padding: vmap applies), prompts of 3, 2 classes."""
    g = torch.Generator().manual_seed(seed)
    ids = [torch.randint(3, VOCAB, (5,), generator=g).tolist() for _ in range(n)]
    return TokenBatch(ids, [3] * n, 0, torch.randint(0, 2, (n,), generator=g), torch.tensor([5, 9]))


def test_vmap_norms_refuse_the_answer_loss_they_returned_the_classification_losss():
    model = tiny_causal_lm("llama", vocab_size=VOCAB, seed=1)
    params, data = full_parameters(model), equal_length_batch()
    answer = grad_norms(model, data, params, loss="answer", method="loop")
    assert not torch.allclose(answer, grad_norms(model, data, params, method="loop"))   # two different losses
    with pytest.raises(ValueError, match="Invalid method: 'vmap' .*classification"):
        grad_norms(model, data, params, loss="answer", method="vmap")
    assert torch.allclose(grad_norms(model, data, params, loss="answer"), answer, rtol=1e-5)   # "auto"


def frozen_one(params):
    params[3].requires_grad_(False)
    return params


@pytest.mark.parametrize("method", ["auto", "linear", "vmap", "loop"])
@pytest.mark.parametrize("tensors, why", [(lambda ps: [], "no tensors"), (frozen_one, r"params\[3\]")],
                         ids=["none", "frozen"])
def test_norms_refuse_no_tensors_or_a_frozen_one_with_a_value_error(method, tensors, why):
    model = tiny_causal_lm("llama", vocab_size=VOCAB, seed=1)
    params, data = tensors(full_parameters(model)), equal_length_batch()
    with pytest.raises(ValueError, match=f"Invalid params: .*{why}"):      # torch's RuntimeError from inside
        grad_norms(model, data, params, method=method)
    if method == "auto":
        with pytest.raises(ValueError, match=f"Invalid params: .*{why}"):
            full_gradient_norm(model, data, params)
        with pytest.raises(ValueError, match=f"Invalid params: .*{why}"):
            directional_error(model, data, params, eps=1e-3, draws=1)


def test_top_block_norms_refuse_no_tensors_and_a_frozen_adapter():
    model, params = lora_top("llama")
    top = TopBlocks(model, equal_length_batch())
    with pytest.raises(ValueError, match="Invalid params: no tensors"):
        top.grad_norms([])
    params[0].requires_grad_(False)
    with pytest.raises(ValueError, match=r"Invalid params: .*params\[0\]"):
        top.grad_norms(params, method="loop")


def test_norms_check_chunk_whichever_way_runs():
    model = tiny_causal_lm("llama", vocab_size=VOCAB, seed=1)
    with pytest.raises(ValueError, match="Invalid chunk: 0"):           # the loop ignored it
        grad_norms(model, equal_length_batch(), full_parameters(model), method="loop", chunk=0)


def test_a_mean_over_no_examples_is_refused():
    model = tiny_causal_lm("llama", vocab_size=VOCAB, seed=1)
    empty = TokenBatch([], [], 0, torch.zeros(0, dtype=torch.long), torch.tensor([5, 9]))
    with pytest.raises(ValueError, match="Invalid batch: no examples"):     # was 0.0
        full_gradient_norm(model, empty, full_parameters(model))
    with pytest.raises(ValueError, match="Invalid batch: no examples"):     # was a ZeroDivisionError
        mean_loss(model, empty)
    assert grad_norms(model, empty, full_parameters(model)).shape == (0,)   # the norms of no examples: none


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_norms_equal_autograd_per_example_on_random_inputs_with_repeated_unsorted_indices(family):
    model = add_lora(tiny_causal_lm(family, vocab_size=VOCAB, seed=2), rank=2)
    params = trainable_parameters(model)
    jiggle(params, 0.2)
    plain = batch(6, seed=5)              # 3 … 7 tokens, padded; the answer: the last two tokens
    data = TokenBatch(plain.ids, [len(r) - 2 for r in plain.ids], 0, plain.labels, plain.label_ids)
    order = [5, 0, 0, 3, 1]
    for loss, fn in [("classification", classification_losses), ("answer", answer_losses)]:
        exact = torch.tensor([sum(float(g.double().pow(2).sum()) for g in torch.autograd.grad(
            fn(model, data, [i], grad=True).sum(), params, allow_unused=True) if g is not None) ** 0.5
            for i in order], dtype=torch.float64)
        for method in ("auto", "linear", "loop"):
            assert torch.allclose(grad_norms(model, data, params, loss=loss, indices=order, method=method), exact,
                                  rtol=1e-5, atol=1e-7), (loss, method)


# --- 4. query races: settings named as query_run names them, a test split that can be scored ----------------------
@pytest.fixture
def tiny_race():
    model, params = lora_top("llama")
    return model, params, TopBlocks(model, batch(6))


@pytest.mark.parametrize("settings, name", [(dict(sampler="oracle", oracle_every=0), "oracle_every"),
                                            (dict(sampler="oracle", oracle_mix=1.5), "oracle_mix"),
                                            (dict(walk_bound=0.0), "walk_bound"), (dict(step_cap=-1.0), "step_cap")])
def test_query_run_names_its_own_arguments_before_moving_anything(tiny_race, settings, name):
    model, params, top = tiny_race
    saved = snapshot(params)
    settings = {"sampler": "uniform", **settings}
    with pytest.raises(ValueError, match=f"Invalid {name}:"):    # was "every", "mix", "radius", "kappa"
        query_run(model, params, top, settings.pop("sampler"), lr=1e-2, steps=2, log_every=1, **settings)
    assert all(torch.equal(p, s) for p, s in zip(params, saved))


def test_query_run_refuses_an_empty_test_split_before_the_run_not_after_it(tiny_race):
    model, params, top = tiny_race
    empty = TokenBatch([], [], 0, torch.zeros(0, dtype=torch.long), torch.tensor([5, 9]))
    saved = snapshot(params)
    with pytest.raises(ValueError, match="Invalid test_batch: no examples"):
        query_run(model, params, top, "uniform", lr=1e-2, steps=3, log_every=1, test_batch=empty)
    assert all(torch.equal(p, s) for p, s in zip(params, saved))        # the whole run had been made


# --- 5. top-block tuning: every block, one-token prompts, three label words ---------------------------------------
@pytest.mark.parametrize("family", TINY_FAMILIES)
@pytest.mark.parametrize("mode", ["lora", "all"])
def test_every_block_tuned_on_one_token_prompts_equals_the_full_model(family, mode):
    base = tiny_causal_lm(family, vocab_size=VOCAB, seed=1)
    every = len(decoder_layers(base))
    model = add_lora(base, rank=2, layers=top_layers(base, every)) if mode == "lora" else base
    params = trainable_parameters(model) if mode == "lora" else top_block_parameters(model, every)
    jiggle(params, 0.3)
    g = torch.Generator().manual_seed(4)
    ids = [torch.randint(3, VOCAB, (length,), generator=g).tolist() for length in (1, 1, 4, 1, 6)]
    data = TokenBatch(ids, [len(r) for r in ids], 0, torch.tensor([0, 2, 1, 1, 2]), torch.tensor([5, 9, 11]))
    top = TopBlocks(model, data, blocks=every)
    order = [3, 0, 0, 4, 1]
    assert torch.allclose(top(order), classification_losses(model, data, order), atol=1e-5, rtol=0)
    assert torch.allclose(top.grad_norms(params), grad_norms(model, data, params), rtol=1e-4)
    for bad in (0, every + 1):
        with pytest.raises(ValueError, match=f"Invalid blocks: {bad} .*\\[1, {every}\\]"):
            TopBlocks(model, data, blocks=bad)


@pytest.mark.parametrize("settings, name", [(dict(vocab_size=0), "vocab_size"), (dict(vocab_size=2), "vocab_size"),
                                            (dict(vocab_size=1.5), "vocab_size"), (dict(seed=2 ** 70), "seed"),
                                            (dict(seed=1.5), "seed")])
def test_tiny_models_refuse_a_vocabulary_without_their_special_ids_and_a_seed_torch_cannot_take(settings, name):
    # 0 was an IndexError from inside the model's init, 2 a model whose EOS id 2 was past its vocabulary,
    # 2**70 torch's bare "Overflow when unpacking long long"
    with pytest.raises(ValueError, match=f"Invalid {name}:"):
        tiny_causal_lm("llama", **settings)
    assert tiny_causal_lm("llama", vocab_size=3).get_input_embeddings().num_embeddings == 3
