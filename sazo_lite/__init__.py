"""sazo-lite: fine-tuning without backpropagation, from toy quadratics to language models.

MeZO (two forward passes per step, seeded in-place perturbations) and SAZO (sample-adaptive
importance sampling driven by the per-example directional differences MeZO already computes).

The library is this package (engine, noise, samplers, train, seed log, distributed, ``hf``,
``llm``); the course built on it (teaching maths, toy problems, dashboards, labs) is
``sazo_lite.course``, which nothing here imports.
"""
from .directions import derive_seed, draw_direction
from .engine import MeZO, NoiseSourceWarning, StepEvent, ZOStep
from .samplers import OracleSampler, PlainSAZOSampler, SAZOSampler, Sampler, UniformSampler
from .train import FlatLossWarning, History, queries_to_target, train
from .seedlog import SeedLog
from . import variance

__version__ = "0.1.0"

__all__ = ["MeZO", "ZOStep", "StepEvent", "derive_seed", "draw_direction", "Sampler", "UniformSampler",
           "SAZOSampler", "PlainSAZOSampler", "OracleSampler", "History", "FlatLossWarning", "NoiseSourceWarning",
           "train",
           "queries_to_target",
           "variance", "SeedLog"]
