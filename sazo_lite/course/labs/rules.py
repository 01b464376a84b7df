"""Each lab's rule: what its graded cells may use from ``sazo_lite``, and which names each question grades.

The labs ask students to build a piece of the library themselves, so the library may not be the
answer. Per lab (keyed by the master's name):

- ``modules``: the library modules graded cells may import (``sazo_lite`` itself always);
- ``names``: the library objects graded cells may use (functions, classes with their bases'
  methods, or whole modules); everything else in ``sazo_lite`` is forbidden in every cell the
  grader runs (cells tagged ``otter_ignore``, the *check* and *explore* cells, are not run);
- ``graded``: per question, the functions, classes and variables the student defines; before
  each test case the grader checks that those functions and classes are defined in the notebook
  and do not reach a forbidden object (``guard.Guard.check``).

A question whose cells or graded code use a forbidden object scores 0, with the object named in
the feedback. Each student notebook states its lab's rule at the top (``rule_text``); the tests
check that it lists every allowed name.
"""
from __future__ import annotations

__all__ = ["RULES", "rule_for", "rule_text"]

_COMMON = ("sazo_lite.course.fast_mode", "sazo_lite.course.pick", "sazo_lite.course.problems")
_COMMON_MODULES = ("sazo_lite.course", "sazo_lite.course.config", "sazo_lite.course.problems")

RULES = {
    "lab1_two_point_estimator": {
        "modules": _COMMON_MODULES,
        "names": _COMMON,
        "graded": {"q1": ["lab1_projected_grad"], "q2": ["lab1_zo_gradient"],
                   "q3": ["lab1_fd_error", "lab1_estimator_variance", "lab1_errors", "lab1_variances"],
                   "q4": ["lab1_best_eps_for", "lab1_best_eps"]},
    },
    "lab2_importance_weights": {
        "modules": _COMMON_MODULES,
        "names": _COMMON,
        "graded": {"q1": ["lab2_weights"], "q2": ["lab2_is_estimate", "lab2_average_estimate"],
                   "q3": ["lab2_sampling_variance", "lab2_oracle_probs"],
                   "q4": ["lab2_uniform_gain", "lab2_norms", "lab2_gain", "lab2_one_plus_cv2"]},
    },
    "lab3_sazo_sampler": {
        "modules": (*_COMMON_MODULES, "sazo_lite.variance", "sazo_lite.samplers"),
        "names": (*_COMMON, "sazo_lite.Sampler", "sazo_lite.variance.tv_distance"),
        "graded": {"q1": ["lab3_plain_probs", "lab3_plain_update", "Lab3PlainSampler"],
                   "q2": ["lab3_prior", "lab3_probs"], "q3": ["lab3_level"], "q4": ["lab3_blend"],
                   "q5": ["Lab3Sampler", "lab3_probs", "lab3_level", "lab3_blend"],
                   "q6": ["Lab3Sampler", "lab3_track", "lab3_tv_start", "lab3_tv_end"]},
    },
    "lab4_beat_uniform": {
        "modules": (*_COMMON_MODULES, "sazo_lite.engine", "sazo_lite.train", "sazo_lite.samplers", "sazo_lite.llm",
                    "sazo_lite.llm.models"),
        "names": (*_COMMON, "sazo_lite.MeZO", "sazo_lite.train", "sazo_lite.queries_to_target", "sazo_lite.History",
                  "sazo_lite.UniformSampler", "sazo_lite.SAZOSampler", "sazo_lite.OracleSampler",
                  "sazo_lite.llm.tiny_causal_lm"),
        "graded": {"q1": ["lab4_queries_to_target"], "q2": ["lab4_runs", "lab4_best", "lab4_speedup_oracle"],
                   "q3": ["lab4_lm_losses"], "q4": ["lab4_lm_initial_loss", "lab4_lm_final",
                                                    "lab4_lm_queries"]},
    },
}


def rule_for(assignment: str) -> dict | None:
    """The rule of a lab by its master's name (``lab1_two_point_estimator``) or short name (``lab1``)."""
    if assignment in RULES:
        return RULES[assignment]
    matches = [r for name, r in RULES.items() if name.split("_")[0] == assignment]
    return matches[0] if len(matches) == 1 else None


def rule_text(assignment: str) -> str:
    """The rule as the student notebook states it (markdown)."""
    rule = rule_for(assignment)
    names = ", ".join(f"`{n}`" for n in rule["names"])
    return ("**The rule: the library is not the answer.** In the cells the grader runs, your code may use "
            f"PyTorch, NumPy, the standard library and, from `sazo_lite`, only: {names}. Importing or calling "
            "anything else from `sazo_lite` there (directly, through `importlib`, through an attribute of an "
            "allowed module, or by wrapping or subclassing a library object) scores 0 for that question. "
            "Compare with the library only in the cells marked *check* or *explore* (the grader skips them).")
