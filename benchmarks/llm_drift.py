"""Restore drift of MeZO in bfloat16 / float16 on SmolLM2-135M, and the float32-master fix.

A closure that raises on its second call leaves MeZO to shift θ back (+εz, −2εz, +εz: three
rounded in-place adds). We report, per dtype: the fraction of entries that did not come back
bit for bit, the largest drift in ulps of |θ|+ε (the size of the intermediates), whether every entry stays inside
``restore_bound``, and the fraction of entries where an update of size lr·|g·z| (lr=1e-6, g=1,
|z|=1) is below half an ulp, i.e. would be lost entirely. Then the same with ``Float32Master``.
No forward passes are needed (the closure returns a dummy loss).

Run: ``python -m benchmarks.llm_drift [--eps 1e-3]``
"""
from __future__ import annotations

import argparse

import torch

from sazo_lite import MeZO, derive_seed, draw_direction
from sazo_lite.precision import Float32Master, restore_bound, unit_roundoff
from sazo_lite.llm import full_parameters, load_smollm2


def raise_on_second_call():
    calls = []

    def closure():
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("simulated loss explosion")
        return torch.zeros(1)
    return closure


def ulp(x: torch.Tensor) -> torch.Tensor:
    """Spacing of the dtype's numbers at |x| (float64)."""
    exponent = torch.floor(torch.log2(x.double().abs().clamp_min(float(torch.finfo(x.dtype).tiny))))
    return torch.exp2(exponent) * 2 * unit_roundoff(x.dtype)


def drift_report(params, before, eps: float, seed: int) -> dict:
    changed = total = 0
    worst_ulps, inside = 0.0, True
    for index, (p, b) in enumerate(zip(params, before)):
        delta = (p.detach().double() - b.double()).abs()
        z = draw_direction(b, derive_seed(seed, index), "gaussian", torch.Generator())
        inside &= bool((delta <= restore_bound(b, eps, z)).all())
        scale = b.double().abs() + eps  # intermediates are |θ ± εz| in size: ulps at that scale
        worst_ulps = max(worst_ulps, float((delta / ulp(scale.to(b.dtype))).max()))
        changed += int((delta > 0).sum())
        total += p.numel()
    return dict(changed=changed / total, worst_ulps=worst_ulps, inside_bound=inside)


def lost_update_fraction(params, lr: float = 1e-6) -> float:
    lost = sum(int((lr < ulp(p.detach()) / 2).sum()) for p in params)
    return lost / sum(p.numel() for p in params)


def main(argv=None) -> None:
    from benchmarks.cli import machine, measured_line, positive

    parser = argparse.ArgumentParser(prog="python -m benchmarks.llm_drift", description=__doc__.splitlines()[0])
    parser.add_argument("--eps", type=positive, default=1e-3, help="ε of the perturbation (default 1e-3)")
    args = parser.parse_args(argv)
    print(f"measured {measured_line(machine())}")     # rounding depends on torch's kernels: say which ran
    model, _ = load_smollm2()
    weights = {name: t.detach().clone() for name, t in model.state_dict().items()}    # float32, as loaded
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        model.to(dtype)
        # each dtype rounds the loaded weights once: moved from the previous dtype, the float16 row measured
        # SmolLM2 rounded to bfloat16 first (8 significant bits where float16 keeps 11)
        model.load_state_dict(weights)
        params = full_parameters(model)
        before = [p.detach().clone() for p in params]
        opt = MeZO(params, lr=1e-6, eps=args.eps, seed=0)
        seed = opt.next_seed()
        try:
            opt.step(raise_on_second_call())
        except RuntimeError:
            pass
        report = drift_report(params, before, args.eps, seed)
        print(f"{str(dtype):15s} plain : entries changed {report['changed']:.2%}, worst {report['worst_ulps']:.1f} ulp, "
              f"inside restore_bound: {report['inside_bound']}, updates lost at lr=1e-6: "
              f"{lost_update_fraction(before):.1%}")
        with torch.no_grad():
            for p, b in zip(params, before):
                p.copy_(b)
        master = Float32Master(params)
        try:
            MeZO(master.tensors, lr=1e-6, eps=args.eps, seed=0).step(master.wrap(raise_on_second_call()))
        except RuntimeError:
            pass
        master.sync()
        report = drift_report(params, before, args.eps, seed)
        print(f"{str(dtype):15s} master: entries changed {report['changed']:.2%}, worst {report['worst_ulps']:.1f} ulp, "
              f"updates lost: 0% (they accumulate in float32)")
        del master
        with torch.no_grad():
            for p, b in zip(params, before):
                p.copy_(b)


if __name__ == "__main__":
    main()
