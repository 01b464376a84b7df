"""Small prompt-classification tasks generated offline, with known difficulty and label noise.

Every task is a ``ClassificationTask``: prompts that end where the answer goes, one label
word per class (the verbaliser, e.g. " negative"/" positive"), a train split with a known
fraction of flipped labels, and a clean test split. Each example records its ``kind``
(easy / hard templates) and whether its label was flipped, so a notebook can show which
examples SAZO samples most: mislabelled ones keep a large loss, hence a large per-example
gradient norm, hence a large d², hence a large sampling probability.

    task = make_task("sentiment", num_train=64, num_test=64, noise=0.15, seed=0)
    batch = task.encode(tokenizer, "train")        # a losses.TokenBatch

Generators: ``sentiment`` (templated reviews with negation and contrast), ``numbers``
(is a > b, with close and far pairs), ``yesno`` (category questions, some negated).
``load_hf_task`` reads SST-2 / BoolQ / MultiRC through ``datasets`` when online (never in tests).
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

from .losses import TokenBatch, encode_classification
from ..validation import check_choice, check_count, check_fraction, check_int

__all__ = ["Example", "ClassificationTask", "make_task", "TASKS", "DISTINCT_PROMPTS", "load_hf_task"]


@dataclass(frozen=True)
class Example:
    """One prompt. ``label`` is what training sees; ``true_label`` is the clean one."""

    prompt: str
    label: int
    true_label: int
    kind: str

    @property
    def noisy(self) -> bool:
        return self.label != self.true_label


@dataclass
class ClassificationTask:
    """A prompt-classification task: splits of ``Example`` and the verbalisers."""

    name: str
    label_words: list[str]
    train: list[Example]
    test: list[Example]
    label_names: list[str] = field(default_factory=list)

    def split(self, name: str) -> list[Example]:
        if name not in ("train", "test"):
            raise ValueError(f"Invalid split: {name!r} (expected 'train' or 'test')")
        return self.train if name == "train" else self.test

    def encode(self, tokenizer, split: str = "train", *, max_length: int = 128) -> TokenBatch:
        """Tokenise a split for ``classification_losses`` (labels as training sees them)."""
        examples = self.split(split)
        return encode_classification(tokenizer, [e.prompt for e in examples], [e.label for e in examples],
                                     self.label_words, max_length=max_length)

    @property
    def noisy_indices(self) -> list[int]:
        """Train indices whose label was flipped."""
        return [i for i, e in enumerate(self.train) if e.noisy]


# -- sentiment with negation -------------------------------------------------------------
_NOUNS = ["film", "meal", "hotel", "concert", "book", "service", "game", "trip", "show", "cafe"]
_POSITIVE = ["good", "great", "wonderful", "excellent", "delightful", "fantastic", "lovely", "superb"]
_NEGATIVE = ["bad", "awful", "terrible", "boring", "dull", "horrible", "disappointing", "poor"]


def _sentiment(rng: random.Random) -> tuple[str, int, str]:
    noun, polarity = rng.choice(_NOUNS), rng.randrange(2)      # 1 = positive
    adjective = rng.choice(_POSITIVE if polarity else _NEGATIVE)
    other = rng.choice(_NEGATIVE if polarity else _POSITIVE)
    kind = rng.choices(["plain", "negated", "double negation", "contrast"], weights=[4, 3, 1, 2])[0]
    sentence = {"plain": f"The {noun} was {adjective}.",
                "negated": f"The {noun} was not {other}.",
                "double negation": f"It is not true that the {noun} was not {adjective}.",
                "contrast": f"The {noun} started {other}, but in the end it was {adjective}."}[kind]
    return f"Review: {sentence}\nSentiment:", polarity, kind


# -- numeric comparisons -------------------------------------------------------------------
def _numbers(rng: random.Random) -> tuple[str, int, str]:
    kind = rng.choices(["far", "close", "three digits"], weights=[4, 3, 2])[0]
    if kind == "far":
        a, b = rng.sample(range(1, 100), 2)
        while abs(a - b) < 30:
            a, b = rng.sample(range(1, 100), 2)
    elif kind == "close":
        a = rng.randrange(10, 99)
        b = a + rng.choice([-2, -1, 1, 2])
    else:
        a = rng.randrange(100, 999)
        b = a + rng.choice([-1, 1]) * rng.randrange(1, 50)
    return f"Question: Is {a} larger than {b}?\nAnswer:", int(a > b), kind


# -- yes/no category questions ---------------------------------------------------------------
_CATEGORIES = {"an animal": ["dog", "cat", "horse", "cow", "lion", "tiger", "rabbit", "eagle"],
               "a fruit": ["apple", "banana", "orange", "grape", "pear", "cherry", "lemon", "mango"],
               "a vehicle": ["car", "bus", "train", "bicycle", "truck", "boat", "plane", "tram"]}


def _yesno(rng: random.Random) -> tuple[str, int, str]:
    category = rng.choice(list(_CATEGORIES))
    member = rng.random() < 0.5
    pool = _CATEGORIES[category] if member else [x for c, xs in _CATEGORIES.items() if c != category for x in xs]
    thing = rng.choice(pool)
    article = "an" if thing[0] in "aeiou" else "a"
    if rng.random() < 0.3:
        return f"Question: Is {article} {thing} not {category}?\nAnswer:", int(not member), "negated"
    return f"Question: Is {article} {thing} {category}?\nAnswer:", int(member), "plain"


TASKS = {"sentiment": (_sentiment, [" negative", " positive"], ["negative", "positive"]),
         "numbers": (_numbers, [" no", " yes"], ["no", "yes"]),
         "yesno": (_yesno, [" no", " yes"], ["no", "yes"])}
# how many distinct prompts each generator can produce: sentiment 10 nouns × 2 polarities × (8 + 8 + 8 + 8·8)
# adjectives; numbers 4,830 far pairs + 89·4 close + 899·98 three-digit; yesno 3 categories × 24 things × 2 forms
# (counted by enumerating the templates in tests/test_llm_round13.py)
DISTINCT_PROMPTS = {"sentiment": 1760, "numbers": 93288, "yesno": 144}


def check_distinct(argument: str, needed: int, capacity: int, what: str) -> None:
    """Refuse asking ``what`` for more distinct prompts than it can make (``draw_distinct`` would never finish)."""
    if needed > capacity:
        raise ValueError(f"Invalid {argument}: {needed} distinct prompts asked for, {what} can make {capacity}")


def draw_distinct(draw, count: int, seen: set, *, what: str, argument: str) -> list[Example]:
    """``[draw(0), …, draw(count − 1)]`` with every prompt new: a draw whose prompt is in ``seen`` is skipped
    and ``draw(k)`` called again; ``seen`` gains the prompts kept. Without repeats this is the plain list, drawn
    from the same random stream. ``ValueError`` after ``max(1000, 100·count)`` draws (check the capacity first)."""
    examples, draws = [], 0
    for k in range(count):
        while True:
            if draws >= max(1000, 100 * count):
                raise ValueError(f"Invalid {argument}: {draws} draws from {what} gave {len(examples)} of {count} "
                                 "distinct prompts (ask for fewer)")
            example, draws = draw(k), draws + 1
            if example.prompt not in seen:
                break
        seen.add(example.prompt)
        examples.append(example)
    return examples


def _flip(examples: list[Example], noise: float, rng: random.Random) -> list[Example]:
    """Flip exactly round(noise·N) labels (binary tasks), chosen at random."""
    flipped = set(rng.sample(range(len(examples)), round(noise * len(examples))))
    return [Example(e.prompt, 1 - e.label, e.true_label, e.kind) if i in flipped else e
            for i, e in enumerate(examples)]


def make_task(name: str = "sentiment", *, num_train: int = 64, num_test: int = 64, noise: float = 0.1,
              seed: int = 0) -> ClassificationTask:
    """Generate a task; train labels have exactly round(noise·num_train) flips, test is clean.

    Every prompt is distinct (test shares none with train); ``DISTINCT_PROMPTS[name]`` bounds
    num_train + num_test (ValueError beyond it).

    Example:
        >>> task = make_task("numbers", num_train=20, num_test=5, noise=0.1, seed=1)
        >>> len(task.train), len(task.noisy_indices), task.label_words
        (20, 2, [' no', ' yes'])
    """
    check_choice("name", name, sorted(TASKS))
    noise = check_fraction("noise", noise, 0.0, 0.5, closed_low=True, closed_high=False)
    num_train, num_test = check_count("num_train", num_train), check_count("num_test", num_test)
    seed = check_int("seed", seed)
    generate, words, names = TASKS[name]
    what = f"the {name!r} generator"
    check_distinct("num_train + num_test", num_train + num_test, DISTINCT_PROMPTS[name], what)
    rng = random.Random(seed)

    def draw(_) -> Example:
        prompt, label, kind = generate(rng)
        return Example(prompt, label, label, kind)

    # distinct prompts, test disjoint from train: drawn with replacement, a split held repeats and test
    # prompts also in train (the default yesno task: 53 distinct of 64, 26 test examples in train)
    examples = draw_distinct(draw, num_train + num_test, set(), what=what, argument="num_train + num_test")
    train = _flip(examples[:num_train], noise, rng)
    return ClassificationTask(name, list(words), train, examples[num_train:], list(names))


# -- optional real data (needs `datasets` and the network; never used by tests) ------------
def _hf_rows(name: str):
    from datasets import load_dataset

    if name == "sst2":
        return load_dataset("glue", "sst2"), (" negative", " positive"), \
            lambda r: (f"Review: {r['sentence'].strip()}\nSentiment:", r["label"])
    if name == "boolq":
        return load_dataset("super_glue", "boolq"), (" no", " yes"), \
            lambda r: (f"{r['passage']}\nQuestion: {r['question']}?\nAnswer:", r["label"])
    if name == "multirc":
        return load_dataset("super_glue", "multirc"), (" no", " yes"), \
            lambda r: (f"{r['paragraph']}\nQuestion: {r['question']}\nIs the answer \"{r['answer']}\" "
                       f"correct?\nAnswer:", r["label"])
    raise ValueError(f"Invalid name: {name!r} (expected 'sst2', 'boolq' or 'multirc')")


def load_hf_task(name: str, *, num_train: int = 1000, num_test: int = 500, noise: float = 0.0,
                 seed: int = 0) -> ClassificationTask:
    """SST-2, BoolQ or MultiRC through ``datasets`` (online), behind the same interface.

    Train comes from the train split, test from the validation split (GLUE test labels are hidden).
    """
    # checked before the download: noise 0.7 flipped most labels (a task of inverted labels), and
    # 1.5 or num_train = 0 surfaced as random.sample's errors once the data had come
    check_choice("name", name, ["boolq", "multirc", "sst2"])
    noise = check_fraction("noise", noise, 0.0, 0.5, closed_low=True, closed_high=False)
    num_train, num_test = check_count("num_train", num_train), check_count("num_test", num_test)
    seed = check_int("seed", seed)
    data, words, row = _hf_rows(name)
    rng = random.Random(seed)

    def take(split: str, n: int) -> list[Example]:
        picked = rng.sample(range(len(data[split])), min(n, len(data[split])))
        return [Example(p, int(y), int(y), name) for p, y in (row(data[split][i]) for i in picked)]

    train = _flip(take("train", num_train), noise, rng)
    return ClassificationTask(name, list(words), train, take("validation", num_test), [w.strip() for w in words])
