"""One target rule: ``train``'s ``stop_below`` stops at a metric ``queries_to_target`` counts as reached (≤),
not only below it; before, a run whose logged metric equalled its target went on past a point the race had
already counted."""
from __future__ import annotations

import torch

import sazo_lite as sz
from sazo_lite.train import queries_to_target, reached


def run_with_metrics(values, stop_below):
    theta = torch.zeros(3, dtype=torch.float64)
    opt = sz.MeZO([theta], lr=0.0, eps=1e-3, seed=0)
    sampler = sz.UniformSampler(4, seed=0)
    metrics = iter(values)
    return sz.train(opt, sampler, lambda idx: (theta ** 2).sum() + 0.0 * idx.double(), steps=10 * len(values),
                    batch_size=2, evaluate=lambda: next(metrics), log_every=10, progress=False,
                    stop_below=stop_below)


def test_a_metric_equal_to_the_target_stops_the_run_where_queries_to_target_counts_it():
    history = run_with_metrics([1.0, 0.5, 0.4, 0.3], stop_below=0.5)
    reached_at = queries_to_target(history, 0.5)
    assert reached_at is not None
    assert history.logged_queries[-1] == reached_at, (history.logged_queries, reached_at)


def test_reached_is_at_or_below_and_never_for_nan():
    assert reached(0.5, 0.5) and reached(-1.0, 0.5)
    assert not reached(0.5000001, 0.5) and not reached(float("nan"), 0.5)
