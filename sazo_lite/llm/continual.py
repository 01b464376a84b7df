"""Generated fine-tuning sets for the continual-tuning situation, where importance sampling pays.

SAZO gains when per-example gradient norms differ: V(u)/V(p*) = 1 + CV² of the norms. Out of the
box a small LM is unsure even on easy prompts, so its norms are alike and the gain is small. A
model that was already tuned on part of the data is different: the examples it has assimilated
barely move the weights, the new ones still do. These sets reproduce that, offline and seeded,
with no label noise:

* ``"continual"`` (heterogeneous): every prompt is a yes/no question with verbalisers " no" /
  " yes". A first round of tuning (``first_round``: a few Adam steps on the adapters, by backprop,
  as setup) teaches sentiment questions; the training set is then those *assimilated* sentiment
  examples plus a minority of *new* questions of other kinds (number comparisons and category
  membership). The held-out split holds new questions only.
* ``"homogeneous"`` (control): the same first round, then new questions only (number comparisons
  and category membership): every example is still to be learned. Their norms still differ
  somewhat (the model already answers some right); ``keep_alike`` keeps the N of a larger pool
  whose true norms at θ₀ are closest to the median, so all examples are alike by the measure that
  matters.
* ``"balanced"`` (where sampling matters at B > 1): the same kind of first round on many sentiment
  questions, then a small share of new examples of a new rule with *distinct answers*: a thing is
  named and the answer is its group (" animal", " fruit", " vehicle", " tool"; balanced), so the
  new gradients push different label words up and do not all point one way (in "continual" three
  of four new questions need " yes", and ‖∇F‖² ≈ ½·V(p*) kills the gain by B ≈ 4). The held-out
  split holds other things of the same groups (new instances of the rule).
* ``"opposed"`` (the other design for B > 1): the continual set's first round, then a small share of
  new questions of a new rule that the first round's habit gets wrong in *opposite directions*: the
  sentiment review asked the other way round ("Did the reviewer dislike it?"; balanced labels). A
  disliked review now needs " yes" where the habit says " no"; a liked one needs " no" where the habit
  leans to " yes". Under the two-word softmax their gradients with respect to the logit difference
  have opposite signs, so they cancel in ∇F, and what is left is what tells the two apart (how much
  each half is wrong is measured, not assumed: docs/llm.md). (New yes/no questions of other kinds, with
  balanced labels, do not do this: after the first round the model answers them " no" with
  confidence, so their no-labelled half is assimilated already and the rest all need " yes".)
* ``"flipped"``: ``make_task("sentiment", noise=0.15)``, the cautionary case (a flipped label keeps
  a large loss, so large-gradient examples are noise there).

``heterogeneity(norms)`` is V(u)/V(p*) = 1 + CV², measured from true per-example gradient norms
(``sazo_lite.llm.grad_norms``); benchmarks and notebook 06 print it at θ₀ for every set.

    cset = make_continual_set("continual", seed=0)
    start = first_round(model, params, cset, tokenizer)      # θ₀ after the first round (cached by callers)
    batch = cset.task.encode(tokenizer, "train")
"""
from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass

import torch

from ..atomic import atomic_write
from ..variance import _nonnegative, uniform_gain
from ..validation import check_count, check_fraction, check_int, check_number
from .losses import classification_losses, encode_classification
from .tasks import (ClassificationTask, Example, _CATEGORIES, _NEGATIVE, _NOUNS, _POSITIVE, check_distinct,
                    draw_distinct)

__all__ = ["ContinualSet", "make_continual_set", "keep_alike", "alike_indices", "predicted_gains", "GROUPS", "first_round", "cached_first_round", "heterogeneity",
           "SET_NAMES"]

SET_NAMES = ("continual", "homogeneous", "flipped", "balanced", "opposed")
WORDS, NAMES = [" no", " yes"], ["no", "yes"]
GROUPS = {" animal": ["dog", "cat", "horse", "cow", "lion", "tiger", "rabbit", "eagle", "sheep", "goat", "wolf",
                      "bear", "mouse", "duck", "fox", "deer"],
          " fruit": ["apple", "banana", "orange", "grape", "pear", "cherry", "lemon", "mango", "peach", "plum",
                     "melon", "kiwi", "lime", "apricot", "fig", "papaya"],
          " vehicle": ["car", "bus", "train", "bicycle", "truck", "boat", "plane", "tram", "van", "taxi", "ship",
                       "scooter", "tractor", "jeep", "subway", "rocket"],
          " tool": ["hammer", "saw", "drill", "wrench", "shovel", "rake", "chisel", "axe", "pliers", "screwdriver",
                    "spade", "file", "ladder", "knife", "needle", "broom"]}


@dataclass
class ContinualSet:
    """A training set for continual tuning.

    Attributes:
        name: one of ``SET_NAMES``.
        task: the ``ClassificationTask`` (train: what ZO tunes on; test: held-out new questions).
        setup: examples the first round tunes on (empty for "flipped": no first round).
        assimilated: train indices that the first round covered (the setup examples themselves).
    """

    name: str
    task: ClassificationTask
    setup: list[Example]
    assimilated: list[int]

    @property
    def new(self) -> list[int]:
        """Train indices of the examples the first round did not see."""
        seen = set(self.assimilated)
        return [i for i in range(len(self.task.train)) if i not in seen]


# distinct prompts of each question generator below (enumerated in tests/test_llm_round13.py)
SENTIMENT_QUESTIONS = len(_NOUNS) * (len(_POSITIVE) + len(_NEGATIVE))                   # 160
DISLIKE_QUESTIONS = len(_NOUNS) * len(_POSITIVE)                                        # 80 of each label
NUMBER_QUESTIONS = 99 * 98                                                              # ordered pairs a ≠ b
CATEGORY_QUESTIONS = len(_CATEGORIES) * sum(len(xs) for xs in _CATEGORIES.values())     # 72


def _sentiment_question(rng: random.Random) -> Example:
    noun, liked = rng.choice(_NOUNS), rng.randrange(2)
    adjective = rng.choice(_POSITIVE if liked else _NEGATIVE)
    return Example(f"Review: The {noun} was {adjective}.\nDid the reviewer like it?\nAnswer:", liked, liked,
                   "sentiment")


def _negated_sentiment_question(rng: random.Random, liked: int) -> Example:
    noun, adjective = rng.choice(_NOUNS), rng.choice(_POSITIVE if liked else _NEGATIVE)
    return Example(f"Review: The {noun} was {adjective}.\nDid the reviewer dislike it?\nAnswer:", 1 - liked,
                   1 - liked, "negated")


def _number_question(rng: random.Random) -> Example:
    a, b = rng.sample(range(1, 100), 2)
    return Example(f"Question: Is {a} larger than {b}?\nAnswer:", int(a > b), int(a > b), "numbers")


def _category_question(rng: random.Random) -> Example:
    category = rng.choice(list(_CATEGORIES))
    member = rng.random() < 0.5
    pool = _CATEGORIES[category] if member else [x for c, xs in _CATEGORIES.items() if c != category for x in xs]
    thing = rng.choice(pool)
    article = "an" if thing[0] in "aeiou" else "a"
    return Example(f"Question: Is {article} {thing} {category}?\nAnswer:", int(member), int(member), "category")


def make_continual_set(name: str = "continual", *, num_train: int = 32, new_fraction: float = 0.25,
                       num_test: int = 32, seed: int = 0, pool: int | None = None) -> ContinualSet:
    """Generate one of ``SET_NAMES`` (seeded; labels are clean except in "flipped").

    Args:
        name: "continual" (assimilated sentiment + a ``new_fraction`` of new questions),
            "homogeneous" (the continual set's first round, then new questions only; see ``pool``),
            "flipped" (15% flipped sentiment labels), "balanced" (new group questions) or "opposed" (new
            negated sentiment questions, labels alternating, train and test).
        num_train: N.
        new_fraction: share of new examples in "continual" (V(u)/V(p*) ≈ 1/new_fraction when the
            assimilated norms are ≈ 0 and the new ones alike).
        num_test: held-out new questions (clean).
        seed: the generator's seed.
        pool: "homogeneous" only (ValueError for the others): how many new questions to generate (default
            ``num_train``); with ``keep_alike`` a pool of 2N becomes a set of N whose norms are alike. The setup
            is the continual set's for the same ``num_train``, ``new_fraction`` and seed (one cached first round
            serves both).

    Every prompt is distinct and the test split shares none with train. Sizes needing more distinct
    questions than a generator makes are refused (ValueError): 160 setup questions (N − new ones), 80
    per label of "opposed", 72 category questions (every other new question of "continual" and
    "homogeneous", train and test), 16 things per group of "balanced" (train's and test's).

    Example:
        >>> s = make_continual_set("continual", num_train=8, new_fraction=0.25, num_test=4, seed=0)
        >>> len(s.task.train), len(s.assimilated), len(s.new), {e.kind for e in s.setup}
        (8, 6, 2, {'sentiment'})
    """
    if name not in SET_NAMES:
        raise ValueError(f"Invalid name: {name!r} (expected one of {SET_NAMES})")
    # "0.5" passed float() and then raised a TypeError from round(); seed 1.5 or "x" seeded a set, and a
    # pool of 0 or less made an empty training set, without a word
    new_fraction = check_fraction("new_fraction", new_fraction, 0.0, 1.0, closed_low=False, closed_high=True)
    num_train, num_test = check_count("num_train", num_train), check_count("num_test", num_test)
    seed = check_int("seed", seed)
    if pool is not None:
        pool = check_count("pool", pool)
        if name != "homogeneous":       # it was ignored: a "continual" set of num_train, not of the pool asked for
            raise ValueError(f"Invalid pool: {pool} (only the homogeneous set draws a pool; {name!r} takes None)")
    if name == "flipped":
        from .tasks import make_task
        task = make_task("sentiment", num_train=num_train, num_test=num_test, noise=0.15, seed=seed)
        return ContinualSet(name, task, [], [])
    rng = random.Random(seed)
    if name == "balanced":
        return _balanced_set(rng, num_train, new_fraction, num_test)
    new_kinds = [_number_question, _category_question]

    def new_example(k: int) -> Example:
        if name == "opposed":
            return _negated_sentiment_question(rng, liked=k % 2)   # alternating: balanced labels
        return new_kinds[k % len(new_kinds)](rng)

    num_new = min(num_train, max(1, round(new_fraction * num_train)))
    num_drawn = (num_train if pool is None else pool) if name == "homogeneous" else num_new
    _check_new_questions(name, num_drawn, num_test)
    # every prompt distinct, test disjoint from train (drawn with replacement, the opposed set at N = 64 held
    # 54 distinct of 64 and a test question from train); the setup is drawn first, as the continual set's
    seen: set[str] = set()
    setup = _setup(rng, num_train - num_new, seen)
    what = f"the {name} set's new questions"
    new = draw_distinct(new_example, num_drawn, seen, what=what, argument="num_train" if pool is None else "pool")
    test = draw_distinct(new_example, num_test, seen, what=what, argument="num_test")
    if name == "homogeneous":   # the same first round; then only new questions, ``pool`` of them
        return ContinualSet(name, ClassificationTask(name, list(WORDS), new, test, list(NAMES)), setup, [])
    task = ClassificationTask(name, list(WORDS), setup + new, test, list(NAMES))
    return ContinualSet(name, task, setup, list(range(len(setup))))


def _setup(rng: random.Random, count: int, seen: set) -> list[Example]:
    """``count`` distinct sentiment questions not in ``seen``: what the first round tunes on."""
    what = "the setup's sentiment questions"
    check_distinct("num_train", count, SENTIMENT_QUESTIONS, what)
    return draw_distinct(lambda _: _sentiment_question(rng), count, seen, what=what, argument="num_train")


def _check_new_questions(name: str, num_drawn: int, num_test: int) -> None:
    """New questions alternate by k (opposed: labels; others: numbers, categories), train and test each from
    k = 0: refuse sizes needing more distinct questions of one alternative than it has."""
    kinds = ([("disliked-review", DISLIKE_QUESTIONS), ("liked-review", DISLIKE_QUESTIONS)] if name == "opposed"
             else [("number", NUMBER_QUESTIONS), ("category", CATEGORY_QUESTIONS)])
    for j, (kind, capacity) in enumerate(kinds):
        needed = (num_drawn + 1 - j) // 2 + (num_test + 1 - j) // 2
        check_distinct("num_test", needed, capacity, f"the {name} set's {kind} questions "
                       f"({num_drawn} train and {num_test} test questions alternate between two kinds)")


def _balanced_set(rng: random.Random, num_train: int, new_fraction: float, num_test: int) -> ContinualSet:
    """Assimilated sentiment (" no"/" yes") + new "group" questions, labels cycling through the groups."""
    groups = list(GROUPS)
    words, names = list(WORDS) + groups, list(NAMES) + [g.strip() for g in groups]
    num_new = min(num_train, max(len(groups), round(new_fraction * num_train)))
    per_group, size = -(-num_new // len(groups)), min(len(things) for things in GROUPS.values())
    # group 0 holds the most of both splits: past ``size`` things its test questions wrapped round onto the
    # train's things (at N = 192, 41 test questions or more)
    check_distinct("num_test", per_group + -(-num_test // len(groups)), size,
                   f"the balanced set's things of one group ({num_new} train and {num_test} test questions)")
    setup = _setup(rng, num_train - num_new, set())
    members = {g: rng.sample(GROUPS[g], len(GROUPS[g])) for g in groups}   # train things first, test after

    def group_question(k: int, offset: int) -> Example:
        g = k % len(groups)
        thing = members[groups[g]][(offset + k // len(groups)) % len(GROUPS[groups[g]])]
        return Example(f"Item: {thing}\nWhich group is it in?\nAnswer:", 2 + g, 2 + g, "group")

    new = [group_question(k, 0) for k in range(num_new)]
    test = [group_question(k, per_group) for k in range(num_test)]
    task = ClassificationTask("balanced", words, setup + new, test, names)
    return ContinualSet("balanced", task, setup, list(range(len(setup))))


def predicted_gains(norms, full_grad_norm: float, batch_sizes=(1, 2, 4, 8, 16)) -> dict:
    """What a set lets importance sampling gain, from true norms at θ₀ (linear theory, Gaussian z).

    With V(p) = (1/N²) Σ ‖∇f_i‖²/p_i, B draws give E[ĝ²] = V(p)/B + (1 − 1/B)·‖∇F‖²; if a run's usable
    rate is ∝ 1/E[ĝ²] (the walk limit), its queries are ∝ B·E[ĝ²] = V(p) + (B − 1)‖∇F‖², so the gain of
    the oracle over uniform at B is [V(u) + (B−1)‖∇F‖²] / [V(p*) + (B−1)‖∇F‖²]: V(u)/V(p*) at B = 1,
    falling to 1 as B grows, the faster the larger ‖∇F‖²/V(p*) (gradients that point one way).

    Returns ``{"v_uniform", "v_oracle", "v_uniform_ratio", "grad_sq", "grad_sq_ratio", "gain": {B: gain}}``.

    Example:
        >>> out = predicted_gains(torch.tensor([1.0, 1.0, 1.0, 5.0]), 0.0)
        >>> round(out["v_uniform_ratio"], 3), round(out["gain"][4], 3)
        (1.75, 1.75)
    """
    norms = torch.as_tensor(norms, dtype=torch.float64)
    if norms.dim() != 1 or len(norms) == 0 or not bool(torch.isfinite(norms).all()) or bool((norms < 0).any()):
        raise ValueError(f"Invalid norms: expected a non-empty 1-D tensor of finite norms >= 0, got {norms.tolist()}")
    full_grad_norm = check_number("full_grad_norm", full_grad_norm, 0.0)      # a sign or nan went into ‖∇F‖²
    batch_sizes = [check_int("batch_sizes", b, 1) for b in batch_sizes]     # B = 0 "gained" (v_u − g²)/(v_o − g²)
    v_u, v_o, g2 = float((norms ** 2).mean()), float(norms.mean()) ** 2, float(full_grad_norm) ** 2
    return {"v_uniform": v_u, "v_oracle": v_o, "v_uniform_ratio": v_u / v_o if v_o > 0 else 1.0, "grad_sq": g2,
            "grad_sq_ratio": g2 / v_o if v_o > 0 else 0.0,
            "gain": {int(b): (v_u + (b - 1) * g2) / (v_o + (b - 1) * g2) if v_o + (b - 1) * g2 > 0 else 1.0
                     for b in batch_sizes}}


def alike_indices(norms, keep: int) -> list[int]:
    """The ``keep`` indices whose norms are closest to their median on a log scale, in index order.

    Example:
        >>> alike_indices(torch.tensor([1.0, 1.1, 9.0, 0.9, 0.01, 1.2]), 4)
        [0, 1, 3, 5]
    """
    # a NaN norm made the median NaN and every distance NaN (the first ``keep`` indices were kept, the NaN
    # among them), a negative one was read as 1e-30, and a [2, 2] tensor gave nested lists
    norms = _nonnegative("norms", norms)
    keep = check_int("keep", keep, 1, len(norms))      # a numpy int is an int too (it was refused)
    logs = norms.clamp_min(1e-30).log()
    return sorted(torch.argsort((logs - logs.median()).abs(), stable=True)[:keep].tolist())


def keep_alike(cset: ContinualSet, norms, keep: int) -> ContinualSet:
    """The ``keep`` training examples whose gradient norms are closest to their median, log scale.

    For the homogeneous control: generate a pool (say 2N), measure its true norms at θ₀, keep N.
    The held-out split is unchanged; assimilated indices are remapped.

    Example:
        >>> s = make_continual_set("homogeneous", num_train=6, num_test=2)
        >>> small = keep_alike(s, torch.tensor([1.0, 1.1, 9.0, 0.9, 0.01, 1.2]), 4)
        >>> [e.prompt for e in small.task.train] == [s.task.train[i].prompt for i in (0, 1, 3, 5)]
        True
    """
    norms = torch.as_tensor(norms, dtype=torch.float64)
    if norms.shape != (len(cset.task.train),):
        raise ValueError(f"Invalid norms: expected shape ({len(cset.task.train)},), got {tuple(norms.shape)}")
    chosen = alike_indices(norms, keep)
    position = {old: new for new, old in enumerate(chosen)}
    task = cset.task
    train = [task.train[i] for i in chosen]
    subset = type(task)(task.name, list(task.label_words), train, list(task.test), list(task.label_names))
    return ContinualSet(cset.name, subset, list(cset.setup), [position[i] for i in cset.assimilated if i in position])


def first_round(model, params, cset: ContinualSet, tokenizer, *, steps: int = 10, lr: float = 3e-3,
                progress: bool = False) -> list[float]:
    """The setup before ZO: ``steps`` full-batch Adam steps (backprop) on ``cset.setup``.

    This stands for an earlier round of fine-tuning; it is not part of any ZO comparison. Returns
    the setup loss after each step. Does nothing (returns []) when there is no setup. ``params`` must be
    the model's and each must get a gradient (ValueError before any step otherwise).
    """
    from tqdm.auto import tqdm

    from .finetune import check_params_in

    steps = check_int("steps", steps, 0)
    lr = check_number("lr", lr, 0.0, closed_low=False)    # 0 tuned nothing, inf made every tensor nan, silently
    if not cset.setup:
        return []
    params = check_params_in(model, params)     # another copy's tensors got no gradient: Adam skipped them
    # the set's own verbalisers (" no"/" yes", plus the groups of "balanced"): the setup is assimilated
    # under the same softmax the ZO runs score it with
    batch = encode_classification(tokenizer, [e.prompt for e in cset.setup], [e.label for e in cset.setup],
                                  cset.task.label_words)
    optimizer = torch.optim.Adam(params, lr=lr)
    history = []
    for _ in tqdm(range(steps), desc="first round (Adam, setup)", disable=not progress):
        optimizer.zero_grad(set_to_none=True)
        loss = classification_losses(model, batch, grad=True).mean()
        loss.backward()
        _check_grads(params)
        optimizer.step()
        history.append(float(loss.detach()))
    for p in params:
        p.grad = None
    return history


def _check_grads(params) -> None:
    """Every tuned tensor got a gradient (else Adam leaves it as it is: a first round that taught nothing)."""
    missing = [k for k, p in enumerate(params) if p.grad is None]
    if missing:
        for p in params:
            p.grad = None
        raise ValueError(f"Invalid params: {len(missing)} of {len(params)} tensors (e.g. params[{missing[0]}]) got no "
                         "gradient from the setup loss (requires_grad False, or not used by the model's forward)")


def cached_first_round(model, params, cset: ContinualSet, tokenizer, *, key: str, steps: int = 10,
                       lr: float = 3e-3, progress: bool = True) -> bool:
    """``first_round`` once, then reuse: the tuned tensors are saved under the user cache by ``key``.

    The key must name the model and the adapters (model, adapter rank); the file name adds the steps, the
    rate (every digit) and a digest of the setup (prompts, labels, label words), so another setup never reads
    this one's round. Returns True when the cached copy was used.
    """
    from .finetune import check_params_in, restore_snapshot, snapshot
    from .models import cache_dir

    if not cset.setup:
        return False
    # a cached copy went into another copy's tensors and was reported used, the model left as it was
    params = check_params_in(model, params)
    steps, lr = check_int("steps", steps, 0), check_number("lr", lr, 0.0, closed_low=False)   # before the name
    # one file name under the cache: "../../x" wrote the round outside it, "a/b" into a folder of its own
    if not isinstance(key, str) or not key or any(c in key for c in "/\\\0"):
        raise ValueError(f"Invalid key: {key!r} (expected a non-empty string without '/', '\\' or NUL: one file "
                         "name under the cache)")
    # the setup's digest: a key names the set by its sizes, and the sets of one size changed when their repeated
    # prompts were drawn again (a round tuned on the old setup was read as the new one's)
    # the rate in full (repr: 0.003 is "0.003"): ":g" kept 6 digits, so 3.0000001e-3 read the round of 3e-3
    path = cache_dir() / "first_round" / f"{key}-steps{steps}-lr{lr!r}-{_setup_digest(cset)}.pt"
    saved = _cached_tensors(path, params) if path.exists() else None
    if saved is not None:
        with torch.no_grad():
            restore_snapshot(params, saved)
        return True
    first_round(model, params, cset, tokenizer, steps=steps, lr=lr, progress=progress)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda handle: torch.save(snapshot(params), handle))   # parallel workers may race here
    return False


def _setup_digest(cset: ContinualSet) -> str:
    """12 hex digits of SHA-256 over what the first round reads of ``cset``: setup prompts, labels, label words."""
    text = json.dumps([[[e.prompt, e.label] for e in cset.setup], list(cset.task.label_words)])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _cached_tensors(path, params):
    """The cached tensors if ``path`` holds exactly one per parameter, of its shape and dtype, else
    None (a corrupt or foreign cache is recomputed and rewritten). Read with ``weights_only=True``:
    a file that holds anything but tensors and containers is refused without running anything."""
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # noqa: BLE001 - any unreadable cache is recomputed
        return None
    if (not isinstance(saved, (list, tuple)) or len(saved) != len(params)
            or any(not isinstance(s, torch.Tensor) or s.shape != p.shape or s.dtype != p.dtype
                   for s, p in zip(saved, params))):
        return None
    return saved


def heterogeneity(norms) -> float:
    """V(u)/V(p*) = 1 + CV² of per-example gradient norms (≥ 1; 1 when all are equal).

    Example:
        >>> heterogeneity(torch.tensor([1.0, 1.0, 1.0, 1.0])), heterogeneity(torch.tensor([0.0, 0.0, 0.0, 1.0]))
        (1.0, 4.0)
    """
    return uniform_gain(norms)
