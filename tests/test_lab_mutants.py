"""Plausible wrong answers lose points: each mutant, planted into a lab's solutions, fails its question.

For every graded question, at least three mistakes students make (a missing term, a wrong
normalisation, a sign, the wrong dtype or seed, delegating to the library) are planted one at a
time into the master's solution code. The master's cells run in this process up to the question,
then the question's tests (public and hidden) run exactly as the grader runs them
(``worker.run_case``): a case passes only if it raises nothing and records the solutions' values.
Each mutant must fail at least one case of its question; the unmutated solutions pass every case.
"""
from __future__ import annotations

import os

import nbformat
import pytest

pytest.importorskip("otter")

from sazo_lite.course import labs  # noqa: E402
from sazo_lite.course.labs.values import ATOL, RTOL, compare  # noqa: E402
from sazo_lite.course.labs.worker import run_case  # noqa: E402

# lab -> question -> [(mutant name, [(old, new), ...])]: text replacements in that question's solution cells
MUTANTS = {
    "lab1": {
        "q1": [("divides by eps", [("/ (2 * eps))", "/ eps)")]),
               ("sign flipped", [("(plus - minus) / (2 * eps)", "(minus - plus) / (2 * eps)")]),
               ("forward difference", [("minus = f(theta - eps * z)", "minus = f(theta)"), ("/ (2 * eps))", "/ eps)")]),
               ("returns a tensor", [("return float((plus - minus) / (2 * eps))", "return (plus - minus) / (2 * eps)")]),
               ("moves theta in place", [("plus = f(theta + eps * z)", "plus = f(theta.add_(eps * z))"),
                                         ("minus = f(theta - eps * z)", "minus = f(theta.sub_(2 * eps * z))")])],
        "q2": [("no average", [("return total / num_directions", "return total")]),
               ("float32 directions", [("generator=generator, dtype=theta.dtype)", "generator=generator)")]),
               ("own seed", [("generator=generator, dtype", "generator=torch.Generator().manual_seed(0), dtype")]),
               ("forgets z", [("lab1_projected_grad(f, theta, z, eps) * z", "lab1_projected_grad(f, theta, z, eps)")])],
        "q3": [("no float32 cast", [("z.to(theta.dtype)", "z")]),
               ("variance without subtracting the gradient", [("* z - grad).norm()", "* z).norm()")]),
               ("signed error", [("errors = [abs(", "errors = [(")]),
               ("variance not squared", [(".norm() ** 2)", ".norm())")]),
               ("curve in float64", [("lab1_f, lab1_grad, lab1_theta, eps", "lab1_f, lab1_grad, lab1_theta64, eps")])],
        "q4": [("argmax", [("return eps_grid[min(range(len(errors))", "return eps_grid[max(range(len(errors))")]),
               ("smallest eps", [("return eps_grid[min(range(len(errors)), key=errors.__getitem__)]", "return min(eps_grid)")]),
               ("largest eps", [("return eps_grid[min(range(len(errors)), key=errors.__getitem__)]", "return max(eps_grid)")]),
               ("last on a tie", [("return eps_grid[min(range(len(errors)), key=errors.__getitem__)]",
                                   "return eps_grid[max(range(len(errors)), key=lambda k: (-errors[k], k))]")]),
               ("errors in float64", [("errors = [lab1_fd_error(f, grad, theta, eps, directions) for eps in eps_grid]",
                                        "errors = [lab1_fd_error(f, grad, theta.double(), eps, directions) for eps in eps_grid]")])],
    },
    "lab2": {
        "q1": [("forgets N", [("return 1.0 / (len(probs) * probs[indices])", "return 1.0 / probs[indices]")]),
               ("inverted", [("return 1.0 / (len(probs) * probs[indices])", "return len(probs) * probs[indices]")]),
               ("float32", [("probs = torch.as_tensor(probs, dtype=torch.float64)", "probs = torch.as_tensor(probs, dtype=torch.float32)")]),
               ("every weight", [("return 1.0 / (len(probs) * probs[indices])", "return 1.0 / (len(probs) * probs)")])],
        "q2": [("no weights", [("(lab2_weights(probs, indices) * values[indices]).mean()", "values[indices].mean()")]),
               ("weights inline instead of lab2_weights", [("lab2_weights(probs, indices) * values", "(1.0 / (len(probs) * probs[indices])) * values")]),
               ("own generator", [("replacement=True, generator=generator)", "replacement=True, generator=torch.Generator().manual_seed(0))")]),
               ("sum not mean", [("* values[indices]).mean())", "* values[indices]).sum())")])],
        "q3": [("divides by N", [("/ len(norms) ** 2", "/ len(norms)")]),
               ("norms not squared", [("(norms ** 2 / probs).sum()", "(norms / probs).sum()")]),
               ("oracle from squared norms", [("return norms / total if total > 0", "return norms ** 2 / (norms ** 2).sum() if total > 0")]),
               ("no all-zero case", [("if total > 0 else", "if True else")])],
        "q4": [("the library's gain", [("return lab2_sampling_variance(norms, uniform) / lab2_sampling_variance(norms, lab2_oracle_probs(norms))",
                                        "return sazo_lite.variance.uniform_gain(norms)")]),
               ("inverted ratio", [("return lab2_sampling_variance(norms, uniform) / lab2_sampling_variance(norms, lab2_oracle_probs(norms))",
                                    "return lab2_sampling_variance(norms, lab2_oracle_probs(norms)) / lab2_sampling_variance(norms, uniform)")]),
               ("sample CV", [("var(unbiased=False)", "var()")]),
               ("CV not squared", [("/ lab2_norms.mean() ** 2)", "/ lab2_norms.mean())")])],
    },
    "lab3": {
        "q1": [("probs without sqrt", [("roots = estimates.double().clamp_min(0).sqrt()", "roots = estimates.double().clamp_min(0)")]),
               ("mix not normalised", [("return (1.0 - uniform_mix) * adaptive + uniform_mix * uniform\n    # END SOLUTION\n\n\ndef lab3_plain_update",
                                        "return adaptive + uniform_mix * uniform\n    # END SOLUTION\n\n\ndef lab3_plain_update")]),
               ("EMA weights swapped", [("ema_decay * estimates[unique] + (1.0 - ema_decay) * squares", "(1.0 - ema_decay) * estimates[unique] + ema_decay * squares")]),
               ("|d| instead of d²", [("diffs.double() ** 2)", "diffs.double().abs())")]),
               ("duplicates summed", [("    squares /= torch.bincount(inverse, minlength=len(unique)).double()\n", "")]),
               ("modifies its input", [("estimates = estimates.double().clone()\n    unique", "estimates = estimates.double()\n    unique")]),
               ("delegates to PlainSAZOSampler", [
                   ("return lab3_plain_probs(self.estimates, self.uniform_mix)",
                    "if not hasattr(self, '_lib'):\n            self._lib = sazo_lite.PlainSAZOSampler(self.num_examples, ema_decay=self.ema_decay, "
                    "uniform_mix=self.uniform_mix, initial_estimate=float(self.estimates[0]))\n        return self._lib.probs"),
                   ("self.estimates = lab3_plain_update(self.estimates, indices, diffs, self.ema_decay)",
                    "self.probs\n        self._lib.update(indices, diffs)")])],
        "q2": [("prior is the mean", [("return float((estimates[seen] ** 2).mean().sqrt())", "return float(estimates[seen].mean())")]),
               ("unseen score 0", [("torch.where(seen, estimates, torch.full_like(estimates, prior))", "estimates")]),
               ("no sqrt for square", [("scores = scores.sqrt()", "scores = scores")]),
               ("mix not normalised", [("(1.0 - uniform_mix) * adaptive + uniform_mix * uniform", "adaptive + uniform_mix * uniform")])],
        "q3": [("no weights", [("float((weights * stats).mean())", "float(stats.mean())")]),
               ("fixed rate", [("rate = max(1.0 / steps, 1.0 - level_decay)", "rate = 1.0 - level_decay")]),
               ("decay swapped", [("(1.0 - rate) * level + rate *", "rate * level + (1.0 - rate) *")]),
               ("float steps", [("steps += 1", "steps += 1.0")])],
        "q4": [("duplicates summed", [("    observed /= torch.bincount(inverse, minlength=len(unique)).double()\n", "")]),
               ("not relative to the level", [("relative = stats.double() / level if level > 0", "relative = stats.double() if level > 0")]),
               ("squares the mean, not the mean of squares", [("relative = relative ** 2", "relative = relative"), ("observed /= torch.bincount(inverse, minlength=len(unique)).double()\n", "observed /= torch.bincount(inverse, minlength=len(unique)).double()\n    observed = observed ** 2 if statistic == \"square\" else observed\n")]),
               ("no prior for unseen", [("torch.where(n > 0, estimates[unique], torch.full_like(observed, prior))", "estimates[unique]")]),
               ("modifies its inputs", [("estimates, counts = estimates.double().clone(), counts.clone()", "estimates, counts = estimates.double(), counts")]),
               ("decay not capped", [(".clamp_max(ema_decay)", "")])],
        "q5": [("delegates to SAZOSampler", [
                   ("return lab3_probs(self.estimates, self.counts, self.uniform_mix, self.statistic)",
                    "if not hasattr(self, '_lib'):\n            self._lib = sazo_lite.SAZOSampler(self.num_examples, ema_decay=self.ema_decay, "
                    "uniform_mix=self.uniform_mix, prior_strength=self.prior_strength, statistic=self.statistic, "
                    "level_decay=self.level_decay)\n        return self._lib.probs"),
                   ("sizes = diffs.abs()", "self.probs\n        self._lib.update(indices, diffs)\n        return\n        sizes = diffs.abs()")]),
               ("no importance weights", [("weights = 1.0 / (self.num_examples * self.probs[indices])", "weights = torch.ones_like(sizes)")]),
               ("level from d² for \"square\"", [("sizes = diffs.abs()", "sizes = diffs.abs() if self.statistic == \"abs\" else diffs ** 2")]),
               ("level never updated", [("self.level, self.level_steps = lab3_level(self.level, self.level_steps, sizes, weights, self.level_decay)",
                                         "self.level, self.level_steps = 1.0, self.level_steps + 1")])],
        "q6": [("no uniform mix", [("Lab3Sampler(problem.num_examples, uniform_mix=0.1, seed=seed)",
                                    "Lab3Sampler(problem.num_examples, uniform_mix=0.0, seed=seed)")]),
               ("distance to the unmixed oracle", [("target = 0.9 * norms / norms.sum() + 0.1 / len(norms)", "target = norms / norms.sum()")]),
               ("feeds exact norms", [("grads[indices] @ z", "grads[indices].norm(dim=1)")]),
               ("one z for every step", [("        z = torch.randn(problem.dim, generator=generator, dtype=torch.float64)\n", ""),
                                          ("    start = tv_distance(", "    z = torch.randn(problem.dim, generator=generator, dtype=torch.float64)\n    start = tv_distance(")]),
               ("its own seed", [("seed=seed)", "seed=0)")])],
    },
    "lab4": {
        "q1": [("target not relative to the gap", [("target = target_fraction * problem.gap(theta)", "target = target_fraction")]),
               ("MeZO seed ignored", [("MeZO([theta], lr=lr, eps=1e-3, seed=seed)", "MeZO([theta], lr=lr, eps=1e-3, seed=0)")]),
               ("evaluates the loss, not the gap", [("evaluate=lambda: problem.gap(theta)", "evaluate=lambda: float(problem.losses(theta).mean())")]),
               ("logs every step", [("log_every=10,", "log_every=1,")])],
        "q2": [("every run on seed 0", [("lambda theta: make(theta, seed), lr, lab4_steps, lab4_batch, lab4_fraction, seed)",
                                         "lambda theta: make(theta, 0), lr, lab4_steps, lab4_batch, lab4_fraction, 0)")]),
               ("sampler seed 0", [("lambda theta: make(theta, seed)", "lambda theta: make(theta, 0)")]),
               ("worst step size", [("lab4_best = {name: min(", "lab4_best = {name: max(")]),
               ("oracle speed-up inverted", [('lab4_speedup_oracle = lab4_best["uniform"] / lab4_best["oracle"]',
                                              'lab4_speedup_oracle = lab4_best["oracle"] / lab4_best["uniform"]')])],
        "q3": [("no shift", [(".logits[:, :-1]", ".logits"), ("targets = tokens[:, 1:]", "targets = tokens")]),
               ("one loss for the batch", [("return ce.view(len(tokens), -1).mean(dim=1)", "return ce.mean().expand(len(tokens))")]),
               ("sum over positions", [("return ce.view(len(tokens), -1).mean(dim=1)", "return ce.view(len(tokens), -1).sum(dim=1)")])],
        "q4": [("MeZO seed 0", [("eps=1e-3, seed=lab_seed)", "eps=1e-3, seed=0)")]),
               ("initial loss on a batch", [("lab4_lm_initial_loss = full_loss()", "lab4_lm_initial_loss = float(lab4_lm_losses(model, lab4_tokens[:4]).mean())")]),
               ("target 0.9", [("lab4_lm_target = 0.95 * lab4_lm_initial_loss", "lab4_lm_target = 0.9 * lab4_lm_initial_loss")]),
               ("ten times the step size", [("lr=lab4_lm_lr,", "lr=10 * lab4_lm_lr,")])],
    },
}
# expensive solution cells that a later question does not need (its own setup cells always run)
NOT_NEEDED = {("lab4", "q3"): {"q2"}, ("lab4", "q4"): {"q2"}}


def parse_master(path):
    """(program cells [(question or None, source)], tests {question: [source]}) of an otter master."""
    nb = nbformat.read(path, as_version=4)
    program, tests, question, in_tests = [], {}, None, False
    for cell in nb.cells:
        text = cell.source.strip()
        if cell.cell_type == "raw":
            if text.startswith("# BEGIN QUESTION"):
                question = next(line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("name:"))
            elif text.startswith("# END QUESTION"):
                question = None
            elif text.startswith(("# BEGIN TESTS", "# END TESTS")):
                in_tests = text.startswith("# BEGIN")
        elif cell.cell_type == "code" and "otter_ignore" not in cell.metadata.get("tags", []):
            if in_tests:
                tests.setdefault(question, []).append(cell.source)
            else:
                program.append((question, cell.source))
    return program, tests


def run_question(lab, question, replacements=(), until_failed=None):
    """Run the master's cells up to `question` (with replacements in its cells), then its cases.

    ``until_failed``: the reference results; the cases stop after the first that fails against it
    (a mutant needs one failed case, and later cases of a long question cost seconds each).
    """
    program, tests = parse_master(labs.resolve_master(lab))
    order = list(tests)
    upto, skip = order.index(question), NOT_NEEDED.get((lab, question), set())
    namespace = {"__name__": "__main__"}
    applied = set()
    for owner, source in program:
        if owner is not None and (order.index(owner) > upto or owner in skip):
            continue
        if owner == question:
            for old, new in replacements:
                if old in source:
                    source = source.replace(old, new)
                    applied.add(old)
        exec(compile(source, f"<{lab} {owner}>", "exec"), namespace)
    missing = [old for old, _ in replacements if old not in applied]
    assert not missing, f"mutant text not found in {lab} {question}: {missing}"
    results = []
    for k, source in enumerate(tests[question]):
        results.append(run_case(source, namespace, f"<{question} case {k}>"))
        if until_failed is not None and failed_cases(until_failed, results):
            break
    return results


def failed_cases(reference, results):
    """Indices of cases that raised or recorded other values than the reference."""
    failed = []
    for k, ((_, want), (error, got)) in enumerate(zip(reference, results)):
        bad = error is not None or len(got) != len(want) or any(
            compare(w["value"], g["value"], RTOL if w["rtol"] is None else w["rtol"],
                    ATOL if w["atol"] is None else w["atol"]) for w, g in zip(want, got))
        if bad:
            failed.append(k)
    return failed


@pytest.fixture(scope="module", autouse=True)
def fast_and_single_threaded():
    import torch

    old_fast, threads = os.environ.get("SAZO_FAST"), torch.get_num_threads()
    os.environ["SAZO_FAST"] = "1"
    yield
    torch.set_num_threads(threads)
    if old_fast is None:
        os.environ.pop("SAZO_FAST", None)
    else:
        os.environ["SAZO_FAST"] = old_fast


_REFERENCES = {}


def assert_mutant_loses_points(mutants, lab, question, name):
    """The mutant ``name`` of ``mutants[(lab, question)]`` (a list of (name, replacements)) fails a case of the
    question: the later rounds' mutant tables are checked by this one rule."""
    replacements = dict(mutants[(lab, question)])[name]
    want = reference(lab, question)
    assert failed_cases(want, run_question(lab, question, replacements, until_failed=want)), f"{lab} {question}: {name}"


def reference(lab, question):
    if (lab, question) not in _REFERENCES:
        _REFERENCES[(lab, question)] = run_question(lab, question)
    return _REFERENCES[(lab, question)]


QUESTIONS = [(lab, q) for lab, questions in MUTANTS.items() for q in questions]


@pytest.mark.parametrize("lab,question", QUESTIONS, ids=lambda x: x)
def test_solutions_pass_and_every_case_records_a_value(lab, question):
    results = reference(lab, question)
    errors = {k: error for k, (error, _) in enumerate(results) if error}
    assert not errors, f"the solutions fail {lab} {question}: {errors}"
    assert all(records for _, records in results), "every case records what the student's code produced"


@pytest.mark.parametrize("lab,question", QUESTIONS, ids=lambda x: x)
def test_every_mutant_loses_points_on_its_question(lab, question):
    mutants = MUTANTS[lab][question]
    assert len(mutants) >= 3
    survivors = []
    for name, replacements in mutants:
        want = reference(lab, question)
        if not failed_cases(want, run_question(lab, question, replacements, until_failed=want)):
            survivors.append(name)
    assert not survivors, f"{lab} {question}: wrong answers that keep full marks: {survivors}"


def test_every_graded_question_has_mutants():
    for master in labs.find_masters():
        _, tests = parse_master(master)
        lab = master.stem.split("_")[0]
        assert set(tests) == set(MUTANTS[lab]), f"{lab}: questions without mutants"
