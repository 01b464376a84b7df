"""SAZO samplers at scale: state bytes per example and sample + update time (part of ``make bench``).

    python -m benchmarks.sampler_state            # N = 1e5 and 1e6, B = 32
    python -m benchmarks.sampler_state --quick    # N = 1e4 and 1e5

For each N: ``state_bytes / N`` of ``SAZOSampler`` and ``PlainSAZOSampler`` (per-example arrays
and sum trees, as ``state_bytes`` counts them), the median time of one ``sample(B)`` +
``update(B)`` after a warm-up that has seen part of the data, and how far the tree's float32
sums move the distribution from a float64 reference (max relative difference of p_i over all
N examples and of Σp − 1).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch

from benchmarks.cli import machine, measured_line
from sazo_lite.samplers import PlainSAZOSampler, SAZOSampler, UniformSampler


def _round_trip_seconds(sampler, batch: int, gen: torch.Generator, repeats: int) -> float:
    def once():
        started = time.perf_counter()
        idx, _ = sampler.sample(batch)
        sampler.update(idx, torch.randn(batch, generator=gen, dtype=torch.float64))
        return time.perf_counter() - started
    for _ in range(10):
        once()
    return statistics.median(once() for _ in range(repeats))


def _reference_error(sampler) -> dict:
    """Relative error of the tree-based p_i against float64 sums of the same scores."""
    scores = sampler.scores().numpy()
    total = float(np.sum(scores, dtype=np.float64))
    reference = (1 - sampler.uniform_mix) * scores / total + sampler.uniform_mix / sampler.num_examples
    probs = sampler.probs.numpy()
    return {"max_rel_error_p": float(np.max(np.abs(probs / reference - 1))), "sum_p_minus_1": float(probs.sum() - 1)}


def measure(num_examples: int, batch: int = 32, warm_steps: int = 2000, repeats: int = 200) -> dict:
    """One N: bytes per example, seconds per sample + update, float32 error, for each sampler."""
    out = {"num_examples": num_examples, "batch": batch}
    gen = torch.Generator().manual_seed(0)
    for name, make in (("sazo", lambda: SAZOSampler(num_examples, seed=0)),
                       ("sazo-plain", lambda: PlainSAZOSampler(num_examples, seed=0)),
                       ("uniform", lambda: UniformSampler(num_examples, seed=0))):
        sampler = make()
        for _ in range(warm_steps):  # part of the data seen, the rest unseen: both stores in play
            idx, _ = sampler.sample(batch)
            sampler.update(idx, torch.randn(batch, generator=gen, dtype=torch.float64).exp())
        row = {"seconds": _round_trip_seconds(sampler, batch, gen, repeats)}
        if hasattr(sampler, "state_bytes"):
            row.update(state_bytes=sampler.state_bytes, bytes_per_example=sampler.state_bytes / num_examples,
                       sum_tree=sampler.sum_tree, **_reference_error(sampler))
        out[name] = row
    return out


def run(quick: bool = False) -> dict:
    sizes = (10 ** 4, 10 ** 5) if quick else (10 ** 5, 10 ** 6)
    return {"sizes": [measure(n, repeats=50 if quick else 200) for n in sizes]}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sampler_state", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N = 10⁴ and 10⁵, 50 repeats (default: N = 10⁵ and 10⁶, 200)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    result = run(args.quick)
    result["machine"] = machine()
    print(f"sampler state and speed, {measured_line(result['machine'])}")
    for row in result["sizes"]:
        for name in ("sazo", "sazo-plain", "uniform"):
            r = row[name]
            extra = (f", {r['bytes_per_example']:.2f} bytes/example, max |p/p64 − 1| = {r['max_rel_error_p']:.1e}"
                     if "state_bytes" in r else "")
            print(f"N={row['num_examples']:.0e} B={row['batch']} {name}: sample+update {r['seconds'] * 1e3:.3f} ms{extra}")
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
