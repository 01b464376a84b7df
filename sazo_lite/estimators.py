"""The old home of notebooks 01–03's maths and instruments, kept so existing imports work.

Everything moved to modules named for what they hold:

    two_point      bowl_loss, bowl_grad, random_directions, two_point_estimates, zo_gradient,
                   directional_error, error_vs_eps, relative_error_theory, relative_error_monte_carlo
    instruments    peak_tensor_bytes, DirectionCounter, mezo_step_reference, count_passes, step_memory
    race           RACE_METHODS, race_mezo_sgd
    minibatches    path_point, sample_minibatches, minibatch_zo_estimates, weighted_loss_estimates,
                   gain_vs_batch

Example:
    >>> from sazo_lite import estimators, two_point
    >>> estimators.zo_gradient is two_point.zo_gradient
    True
"""
from __future__ import annotations

from .instruments import DirectionCounter, StepMemory, count_passes, mezo_step_reference, peak_tensor_bytes, step_memory
from .minibatches import gain_vs_batch, minibatch_zo_estimates, path_point, sample_minibatches, weighted_loss_estimates
from .race import RACE_METHODS, race_mezo_sgd
from .two_point import (bowl_grad, bowl_loss, directional_error, error_vs_eps, random_directions,
                        relative_error_monte_carlo, relative_error_theory, two_point_estimates, zo_gradient)

__all__ = ["bowl_loss", "bowl_grad", "random_directions", "two_point_estimates", "zo_gradient",
           "directional_error", "error_vs_eps", "relative_error_theory", "relative_error_monte_carlo",
           "peak_tensor_bytes", "step_memory", "StepMemory", "DirectionCounter", "mezo_step_reference",
           "count_passes", "RACE_METHODS", "race_mezo_sgd", "path_point", "sample_minibatches",
           "minibatch_zo_estimates", "weighted_loss_estimates", "gain_vs_batch"]
