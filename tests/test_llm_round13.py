"""Round 13 review of the language-model part (sazo_lite.llm): generated tasks and continual sets hold distinct
prompts and a test split disjoint from train (drawn with replacement, the default yesno task held 53 distinct of
64 train prompts and 26 test examples also in train), and the first-round cache is keyed by its setup. Each test
of a fix failed on the code before it."""
from __future__ import annotations

import itertools
import random

import pytest
import torch

pytest.importorskip("transformers")

from sazo_lite.llm import full_parameters, tiny_causal_lm
from sazo_lite.llm import continual, tasks
from sazo_lite.llm.continual import GROUPS, SET_NAMES, cached_first_round, make_continual_set
from sazo_lite.llm.tasks import DISTINCT_PROMPTS, TASKS, make_task

from test_llm_round9 import VOCAB                   # the same tiny vocabulary
from test_llm_round10 import word_tokenizer         # a tokenizer built in memory


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

