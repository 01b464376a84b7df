"""GPU check of the Triton pass (run on a CUDA machine in a few minutes; no downloads):

    python -m benchmarks.gpu_check            # writes benchmarks/results/gpu_check.json (or $OUT/)

1. correctness: for float32 and bfloat16 tensors, the kernel's pass equals shrink·θ + c·z with
   z = ``triton_direction`` (relative error ≤ 2e-7 / 1e-2), z has mean ≈ 0 and variance ≈ 1,
   and a MeZO step whose closure fails restores θ within the rounding of its shifts (``precision.restore_bound``);
2. timing: one pass over SmolLM2-135M-shaped parameters (134.5M floats, synthetic values) with
   the plain torch loop (``noise=None``) and with ``TritonNoise``, plus a bare θ.add_(θ) pass
   (the memory-bandwidth floor), each the median of 10 after warm-up.

It exits 1, after writing and printing the JSON, when a check of 1. fails.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

from benchmarks.cli import check_folder, machine
from sazo_lite.atomic import write_text
from sazo_lite.engine import MeZO
from sazo_lite.kernels import TritonNoise, triton_available, triton_direction
from sazo_lite.noise import Job
from sazo_lite.precision import restore_bound

# SmolLM2-135M's distinct tensors: embedding, 30 × (7 matrices + 2 norms), final norm
SMOLLM2_SHAPES = [(49152, 576)] + [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576),
                                  (1536, 576), (576, 1536), (576,), (576,)] * 30 + [(576,)]


def check_correctness(device) -> dict:
    g = torch.Generator(device=device).manual_seed(0)
    out, noise = {}, TritonNoise()
    for dtype, tol in [(torch.float32, 2e-7), (torch.bfloat16, 1e-2)]:
        for perturbation in ("gaussian", "rademacher"):
            theta = torch.randn(3_000_001, generator=g, device=device).to(dtype)
            old = theta.clone()
            z = triton_direction(theta, 99, perturbation)
            noise.apply([Job(theta, 99, 0.25, 0.5, perturbation)])
            expected = 0.5 * old.float() + 0.25 * z
            err = float(((theta.float() - expected).abs() / (old.float().abs() + 0.25 * z.abs())).max())
            key = f"{dtype}/{perturbation}"
            out[key] = dict(rel_err=err, ok=err <= tol, z_mean=float(z.mean()), z_var=float(z.var()))
    theta = torch.randn(1_000_000, generator=g, device=device)
    before = theta.clone()
    try:
        MeZO([theta], lr=0.1, eps=1e-3, noise=noise).step(lambda: 1 / 0)
    except ZeroDivisionError:
        pass
    gap = (theta - before).abs()
    out["restore_max_abs"] = float(gap.max())
    # a failed step restores θ within the rounding of its shifts (engine's contract, ``precision.restore_bound``);
    # |z| ≤ 10 bounds the kernel's normals (tl.randn's Box–Muller of 32-bit uniforms: below 7) and its ±1 signs
    bound = restore_bound(before, 1e-3, torch.full_like(before, 10.0))
    out["restore"] = dict(max_abs=out["restore_max_abs"], ok=bool((gap.double() <= bound).all()))
    return out


def time_pass(apply, repeats=10) -> float:
    apply()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        apply()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def check_timing(device) -> dict:
    params = [torch.randn(s, device=device) for s in SMOLLM2_SHAPES]
    plain = MeZO(params, lr=1e-6)
    fast = MeZO(params, lr=1e-6, noise=TritonNoise())
    out = {"params": sum(p.numel() for p in params)}
    out["plain_s"] = time_pass(lambda: plain._shift(7, 1.0))
    out["triton_s"] = time_pass(lambda: fast._shift(7, 1.0))
    out["add_only_s"] = time_pass(lambda: [p.add_(p, alpha=1e-9) for p in params])
    out["speedup"] = out["plain_s"] / out["triton_s"]
    return out


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__.splitlines()[0],
                                     epilog="Writes benchmarks/results/gpu_check.json, or $OUT/gpu_check.json when "
                                            "OUT is set.")
    parser.parse_args(argv)      # no options: --help answers, a stray argument is refused, before any CUDA work
    target = Path(os.environ.get("OUT") or Path(__file__).parent / "results")
    check_folder(parser, "$OUT", target)     # a file, or a place where nothing can be written: before the GPU work
    usable, reason = triton_available()
    if not torch.cuda.is_available() or not usable:
        raise SystemExit(f"gpu_check needs a CUDA device and triton ({reason})")
    device = torch.device("cuda")
    result = {"device": torch.cuda.get_device_name(), "correctness": check_correctness(device),
              "timing": check_timing(device), "machine": machine()}
    target.mkdir(parents=True, exist_ok=True)
    write_text(target / "gpu_check.json", json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    failed = [key for key, check in result["correctness"].items() if isinstance(check, dict) and not check["ok"]]
    if failed:      # the JSON is written and printed first: a failed check exits 1, not 0 beside an "ok": false
        raise SystemExit(f"gpu_check: FAILED {', '.join(failed)} (a kernel pass off shrink·θ + c·z past its tolerance, "
                         f"or θ not restored after a failed step; {target / 'gpu_check.json'})")
    return result


if __name__ == "__main__":
    main()
