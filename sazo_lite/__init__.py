"""sazo-lite: fine-tuning without backpropagation, from toy quadratics to language models.

MeZO (two forward passes per step, seeded in-place perturbations) and SAZO (sample-adaptive
importance sampling driven by the per-example directional differences MeZO already computes).
"""
from .directions import derive_seed, draw_direction
from .engine import MeZO, StepEvent, ZOStep
from .samplers import OracleSampler, PlainSAZOSampler, SAZOSampler, Sampler, UniformSampler
from .train import History, queries_to_target, train
from .seedlog import SeedLog
from . import problems, variance
from .config import fast_mode, one_thread, pick

__version__ = "0.1.0"

__all__ = ["MeZO", "ZOStep", "StepEvent", "derive_seed", "draw_direction", "Sampler", "UniformSampler",
           "SAZOSampler", "PlainSAZOSampler", "OracleSampler", "History", "train", "queries_to_target",
           "problems", "variance", "fast_mode", "pick", "one_thread", "SeedLog"]
