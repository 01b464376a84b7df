"""The course built on the library: what the notebooks, labs, book and benchmarks import.

    two_point     the two-point estimator and its error (notebook 01)
    instruments   pass counters, peak-tensor memory, a textbook MeZO step (notebook 02)
    minibatches   weighted minibatch estimates and the gain against B (notebooks 03, 05)
    problems      toy finite sums with exact per-example gradients
    mezo_vs_sgd   the MeZO-vs-SGD race (notebook 02)
    sazo_runs     SAZO traces and the uniform/SAZO/oracle races (notebooks 04, 05)
    memory, memory_measure, memory_probe   the memory model and its measurement (notebook 07)
    widgets       the dashboards (needs the ``notebooks`` extra)
    labs          graded labs (needs the ``labs`` extra)

Nothing in the library (``sazo_lite`` outside this package) imports from here.
"""
from .config import benchmark_report, fast_mode, one_thread, pick
from . import instruments, mezo_vs_sgd, minibatches, problems, two_point

__all__ = ["benchmark_report", "fast_mode", "one_thread", "pick", "instruments", "mezo_vs_sgd", "minibatches", "problems",
           "two_point"]
