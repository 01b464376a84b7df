"""Engine benchmarks: step speed, peak memory, SAZO's overhead and the sampler's cost.

Every number is a ratio of two measurements taken in the same run (timings on shared
machines drift up to 2×), over interleaved rounds. Speed times each step back to back with two
forwards of its own, in alternating order, so that both sides of a ratio see the same load; its
ratio is the least disturbed pair's (the smallest step + forwards, as other processes only ever
add time), and the median of the pairs' ratios is in the JSON too. Progress goes to stderr:

    speed      ZO step ÷ (2 × forward) for SmolLM2-135M and a tiny GPT-2, B=8, seq 64, float32:
               a plain reference MeZO loop (global ``torch.manual_seed``, 4 out-of-place passes,
               as in the original MeZO code) and sazo_lite with noise=None / TorchNoise / the default
               (``noise="auto"``: GaussianTable for these CPU models, folded too) / NoiseTable,
               Rademacher z (8 signs per random byte) with TorchNoise, and both TorchNoise variants
               with ``fold_updates=True`` (2 passes a step in steady state)
    memory     peak RSS of one ZO step ÷ peak RSS of one inference forward, each in a fresh process
    overhead   SAZO step ÷ uniform (MeZO) step on the tiny GPT-2, and the sampler's extra state
    sampler    sample + update for N = 10⁶, B = 32: SAZOSampler, UniformSampler and a bare SumTree

Run one part: ``python -m benchmarks.engine_speed speed gpt2-tiny`` (the whole table:
``make bench``).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np
import torch

from benchmarks.cli import count, machine, measured_line, positive, refuse_unused
from sazo_lite import MeZO, SAZOSampler, UniformSampler
from sazo_lite.course.memory_measure import peak_rss_bytes, run_child
from sazo_lite.noise import NoiseTable, TorchNoise
from sazo_lite.sumtree import SumTree

MODELS = ("smollm2", "gpt2-tiny")
VARIANTS = ("reference", "plain", "torch_noise", "default", "default_folded", "noise_table", "rademacher",
            "torch_noise_folded", "rademacher_folded")


# -- models and losses ------------------------------------------------------------------
def build_model(name: str) -> torch.nn.Module:
    """SmolLM2-135M (offline cache, float32) or a tiny GPT-2 (random init, GPT-2's vocabulary)."""
    if name == "smollm2":
        from sazo_lite.llm import load_smollm2
        return load_smollm2(verbose=False)[0]
    if name == "gpt2-tiny":
        from transformers import GPT2Config, GPT2LMHeadModel
        config = GPT2Config(n_embd=128, n_layer=2, n_head=4, n_positions=64, resid_pdrop=0.0,
                            embd_pdrop=0.0, attn_pdrop=0.0)  # 50257-token vocabulary: 6.8M parameters
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            return GPT2LMHeadModel(config).eval()
    raise ValueError(f"Invalid model: {name!r} (expected one of {MODELS})")


def distinct_parameters(model) -> list[torch.Tensor]:
    """model.parameters() with tied tensors once (the embedding is also the LM head)."""
    return list({id(p): p for p in model.parameters()}.values())


def random_tokens(model, batch: int, seq: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(model.config.vocab_size, (batch, seq), generator=g)  # [B, seq]


def lm_losses(model, tokens: torch.Tensor) -> torch.Tensor:
    """Per-row next-token cross-entropy [B] (what a MeZO closure returns)."""
    with torch.no_grad():
        logits = model(tokens).logits[:, :-1]                                  # [B, seq−1, V]
        losses = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten(),
                                                   reduction="none")
    return losses.view(tokens.shape[0], -1).mean(1)


# -- the reference loop -----------------------------------------------------------------
@torch.no_grad()
def reference_mezo_step(params, closure, eps: float, lr: float, seed: int) -> float:
    """Original MeZO: z from the global seed, four out-of-place passes (θ.data = θ.data + c·z)."""
    def perturb(scale: float) -> None:
        torch.manual_seed(seed)
        for p in params:
            z = torch.normal(mean=0, std=1, size=p.shape, dtype=p.dtype)
            p.data = p.data + scale * eps * z

    perturb(+1)
    plus = float(closure().mean())
    perturb(-2)
    minus = float(closure().mean())
    perturb(+1)
    g = (plus - minus) / (2 * eps)
    torch.manual_seed(seed)
    for p in params:
        z = torch.normal(mean=0, std=1, size=p.shape, dtype=p.dtype)
        p.data = p.data - lr * g * z
    return g


def _timed(fn, clock=time.perf_counter) -> float:
    start = clock()
    fn()
    return clock() - start


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def step_functions(model, params, closure) -> dict:
    """One callable per variant, each taking one ZO step (lr = 0: θ only drifts by rounding)."""
    optimisers = {"plain": MeZO(params, lr=0.0, eps=1e-3, noise=None),
                  "torch_noise": MeZO(params, lr=0.0, eps=1e-3, noise=TorchNoise(workers=2)),
                  "default": MeZO(params, lr=0.0, eps=1e-3),
                  "default_folded": MeZO(params, lr=0.0, eps=1e-3, fold_updates=True),
                  "noise_table": MeZO(params, lr=0.0, eps=1e-3, noise=NoiseTable()),
                  "rademacher": MeZO(params, lr=0.0, eps=1e-3, perturbation="rademacher",
                                     noise=TorchNoise(workers=2)),
                  # steady state of fold_updates=True: 2 passes a step (update folded into the next +εz)
                  "torch_noise_folded": MeZO(params, lr=0.0, eps=1e-3, noise=TorchNoise(workers=2),
                                             fold_updates=True),
                  "rademacher_folded": MeZO(params, lr=0.0, eps=1e-3, perturbation="rademacher",
                                            noise=TorchNoise(workers=2), fold_updates=True)}
    steps = {name: (lambda opt=opt: opt.step(closure)) for name, opt in optimisers.items()}
    counter = iter(range(10 ** 9))
    steps["reference"] = lambda: reference_mezo_step(params, closure, 1e-3, 0.0, next(counter))
    return steps


PASS_SOURCES = ("plain", "torch_noise", "default")


def pass_functions(params) -> dict:
    """One callable per source making two passes over θ (+εz, then −εz: θ back within rounding);
    the breakdown of a step: it makes 3 such passes (2 folded) beside its 2 forwards."""
    optimisers = {"plain": MeZO(params, lr=0.0, eps=1e-3, noise=None),
                  "torch_noise": MeZO(params, lr=0.0, eps=1e-3, noise=TorchNoise(workers=2)),
                  "default": MeZO(params, lr=0.0, eps=1e-3)}
    return {name: (lambda opt=opt: (opt._shift(1, +1.0), opt._shift(1, -1.0))) for name, opt in optimisers.items()}


def paired_ratio(step_times: list[float], forward_times: list[float]) -> dict:
    """A step's cost in two forwards from pairs timed back to back: the least disturbed pair's (the smallest
    step + forwards) step, forwards and ratio, and the median of the pairs' ratios."""
    pairs = list(zip(step_times, forward_times))
    step, forwards = min(pairs, key=sum)
    return dict(step_s=step, forwards_s=forwards, ratio=step / forwards,
                median_ratio=statistics.median(s / f for s, f in pairs))


def speed(name: str, rounds: int = 3, batch: int = 8, seq: int = 64, clock: str = "wall",
          progress: bool = True) -> dict:
    """step ÷ (2 × forward) for every variant, each step paired with two forwards timed beside it.

    Each round times, for every variant, two forwards and one step back to back (which runs first
    alternates), then two passes over θ per pass source: a ratio's numerator and denominator are
    measured in the same moment, whatever the machine's load does over the run. ``{variant}_ratio``
    is the least disturbed pair's, ``{variant}_median_ratio`` the median of the pairs'.
    ``clock="cpu"`` times CPU seconds of the whole process (``time.process_time``, all threads)
    on one torch thread: the work a step costs, for a machine too loaded for wall-clock ratios
    (it does not credit TorchNoise's second worker thread). ``progress``: a bar on stderr.
    """
    from tqdm.auto import tqdm

    timer = CLOCKS[clock]
    if clock == "cpu":
        torch.set_num_threads(1)
    torch.manual_seed(0)
    if progress:
        print(f"speed: loading {name} ...", file=sys.stderr, flush=True)
    model = build_model(name)
    tokens = random_tokens(model, batch, seq)
    closure = lambda: lm_losses(model, tokens)  # noqa: E731
    two_forwards = lambda: (closure(), closure())  # noqa: E731
    params = distinct_parameters(model)
    steps = step_functions(model, params, closure)
    passes = pass_functions(params)
    bar = tqdm(total=1 + len(steps) + len(passes) + rounds * (len(VARIANTS) + len(PASS_SOURCES)),
               desc=f"speed {name} (warm-up, then {rounds} rounds)", file=sys.stderr, disable=not progress)
    try:
        for fn in (closure, *steps.values(), *passes.values()):  # warm-up: thread pool, buffers, the noise table
            fn()
            bar.update(1)
        times = {key: [] for key in (*VARIANTS, *(f"two_forwards_{v}" for v in VARIANTS),
                                     *(f"two_passes_{s}" for s in PASS_SOURCES))}
        for k in range(rounds):
            for i, variant in enumerate(VARIANTS):
                order = ((variant, steps[variant]), (f"two_forwards_{variant}", two_forwards))
                for key, fn in order if (k + i) % 2 else order[::-1]:
                    times[key].append(_timed(fn, timer))
                bar.update(1)
            for source in PASS_SOURCES:
                times[f"two_passes_{source}"].append(_timed(passes[source], timer))
                bar.update(1)
    finally:
        bar.close()
    forwards = [t for v in VARIANTS for t in times[f"two_forwards_{v}"]]
    out = dict(model=name, params=sum(p.numel() for p in params), batch=batch, seq=seq, rounds=rounds, clock=clock,
               threads=torch.get_num_threads(), forward_s=min(forwards) / 2, times=times)
    for source in PASS_SOURCES:   # other processes only ever add time: the best round is the least disturbed one
        out[f"pass_{source}_s"] = min(times[f"two_passes_{source}"]) / 2
    out["default_noise"] = type(MeZO(params, lr=0.0).noise).__name__
    for variant in VARIANTS:
        pair = paired_ratio(times[variant], times[f"two_forwards_{variant}"])
        out[f"{variant}_s"], out[f"{variant}_forwards_s"] = pair["step_s"], pair["forwards_s"]
        out[f"{variant}_ratio"], out[f"{variant}_median_ratio"] = pair["ratio"], pair["median_ratio"]
    return out


def breakdown(result: dict) -> str:
    """Where the default step's time goes: 2 forwards (those timed beside it), 3 passes over θ, the rest
    (Python, checks)."""
    forwards = result.get("default_forwards_s", 2 * result["forward_s"])   # reports before the pairing: the best round's
    step, one_pass = result["default_s"], result["pass_default_s"]
    rest = step - forwards - 3 * one_pass
    return (f"{result['model']} default step ({result['default_noise']}) {step:.3f} s = 2 forwards {forwards:.3f} s"
            f" + 3 passes × {one_pass:.3f} s + rest {rest:.3f} s (plain-loop pass {result['pass_plain_s']:.3f} s,"
            f" TorchNoise pass {result['pass_torch_noise_s']:.3f} s)")


def too_noisy(result: dict) -> str | None:
    """A warning when some step's median paired ratio is below 1: a step is two forwards and more, so
    the machine's load, not the step, made those timings (the ratios of that run are noise); else None."""
    cheap = [v for v in VARIANTS if result.get(f"{v}_median_ratio", 1.0) < 1.0]
    if not cheap:
        return None
    return (f"WARNING: {', '.join(cheap)} read cheaper than two forwards (median paired ratio "
            f"{min(result[f'{v}_median_ratio'] for v in cheap):.2f} < 1): the load of this machine swamped the "
            f"timings; rerun on an idle machine, with more --rounds, or with --clock cpu")


def step_bound_failure(result: dict, bound: float) -> str | None:
    """A message when the default step costs more than ``bound`` × two forwards, else None."""
    if result["default_ratio"] <= bound:
        return None
    return (f"FAILED: the default MeZO step costs {result['default_ratio']:.2f} × two forwards on "
            f"{result['model']}, past its bound {bound}\n  {breakdown(result)}")


def step_verdict(result: dict, bound: float) -> tuple[str, bool]:
    """The step-cost verdict against ``bound`` and whether it fails the run: a step past its bound fails it only
    when the timings are clean; where ``too_noisy`` finds that the load swamped them, the ratio is load, not the
    step, so the bound is not judged (the run does not fail on noise; its warning says to rerun)."""
    failure = step_bound_failure(result, bound)
    if failure is None:
        return f"default step ÷ 2·forward = {result['default_ratio']:.2f} ≤ {bound}", False
    if too_noisy(result):
        return (f"NOT JUDGED (load): the default step read {result['default_ratio']:.2f} × two forwards on "
                f"{result['model']}, past its bound {bound}, in timings the load swamped (the warning above); "
                f"rerun on an idle machine or with --clock cpu to judge it"), False
    return failure, True


# -- memory (fresh processes) -------------------------------------------------------------
MEMORY_MODES = ("inference", "plain", "torch_noise", "default", "noise_table")


def _memory_child(name: str, mode: str, batch: int = 8, seq: int = 64) -> dict:
    torch.manual_seed(0)
    model = build_model(name)
    params = distinct_parameters(model)
    noise = {"plain": None, "torch_noise": TorchNoise(workers=2), "default": "auto", "noise_table": NoiseTable()}.get(mode)
    opt = MeZO(params, lr=0.0, eps=1e-3, noise=noise) if mode != "inference" else None
    run = (lambda t: lm_losses(model, t)) if opt is None else (lambda t: opt.step(lambda: lm_losses(model, t)))
    run(random_tokens(model, batch, seq))  # warm-up: allocator, kernels, noise table
    run(random_tokens(model, batch, seq, seed=1))
    return dict(peak_rss=peak_rss_bytes(), weights=sum(p.numel() * p.element_size() for p in params))


def memory(name: str, modes=MEMORY_MODES, timeout: float = 300.0) -> dict:
    """Peak RSS per mode (one process each) and each ZO mode's peak ÷ the inference peak."""
    peaks = {mode: run_child("benchmarks.engine_speed", ["memory-child", name, mode], timeout=timeout,
                             env={"HF_HUB_OFFLINE": "1"})
             for mode in modes}
    out = dict(model=name, weights=peaks["inference"]["weights"],
               **{f"{mode}_peak": peaks[mode]["peak_rss"] for mode in modes})
    for mode in modes[1:]:
        out[f"{mode}_ratio"] = peaks[mode]["peak_rss"] / peaks["inference"]["peak_rss"]
    return out


# -- SAZO's overhead and the sampler's cost -----------------------------------------------
def state_bytes(sampler) -> int:
    """Bytes of the arrays/tensors a sampler holds (its O(N) state), inside helper objects too."""
    total = 0
    for value in vars(sampler).values():
        if isinstance(value, np.ndarray):
            total += value.nbytes
        elif isinstance(value, torch.Tensor):
            total += value.numel() * value.element_size()
        elif type(value).__module__.startswith("sazo_lite"):  # e.g. SAZO's sum trees
            total += state_bytes(value)
    return total


def _train_step(opt, sampler, tokens, batch: int, model) -> None:
    indices, weights = sampler.sample(batch)
    rows = tokens[indices % len(tokens)]  # the pool stands in for N examples
    out = opt.step(lambda: lm_losses(model, rows), weights=weights)
    sampler.update(indices, out.directional_diffs)


def sampler_seconds(sampler, batch: int, repeats: int = 50, seed: int = 0) -> float:
    """Median seconds of one sample(B) + update(B) round trip (after 20 warm-up rounds)."""
    g = torch.Generator().manual_seed(seed)

    def round_trip():
        indices, _ = sampler.sample(batch)
        sampler.update(indices, torch.randn(batch, generator=g, dtype=torch.float64))

    for _ in range(20):
        round_trip()
    return statistics.median(_timed(round_trip) for _ in range(repeats))


def round_order(k: int, names=("uniform", "sazo")) -> tuple:
    """The order of the timed steps in round ``k``: A B B A, where A is the first of ``names`` in even rounds and
    the second in odd ones. Each side runs first, second, third and fourth equally often over two rounds, so
    warm-up, caches and a load that drifts over a round favour neither side of the ratio."""
    a, b = names if k % 2 == 0 else names[::-1]
    return a, b, b, a


def overhead(name: str = "gpt2-tiny", sizes=(10 ** 5, 10 ** 6), rounds: int = 4, batch: int = 8) -> dict:
    """SAZO's cost over MeZO per step, two ways, and its extra state bytes per N.

    direct ratio: SAZO training step ÷ uniform training step, the median over rounds of each round's
        ratio; a round times both steps twice, in the order ``round_order`` gives (alternating which
        runs first); ``best_ratio`` is the least disturbed round's (the smallest total). On a shared
        machine its noise (a few %) exceeds the effect.
    component ratio: 1 + (SAZO sampler round trip − uniform's) ÷ uniform training step, with
        the round trips timed in isolation (median of 50): resolves effects below 1%.
    """
    torch.manual_seed(0)
    model = build_model(name)
    tokens = random_tokens(model, 64, 64)
    opt = MeZO(distinct_parameters(model), lr=0.0, eps=1e-3, noise=TorchNoise(workers=2))
    out = dict(model=name, batch=batch, rounds=rounds)
    for n in sizes:
        samplers = {"uniform": UniformSampler(n, seed=0), "sazo": SAZOSampler(n, seed=0)}
        times = {key: [] for key in samplers}      # one entry per round: the round's two steps of that sampler
        for key, sampler in samplers.items():  # warm-up
            _train_step(opt, sampler, tokens, batch, model)
        for k in range(rounds):
            spent = dict.fromkeys(samplers, 0.0)
            for key in round_order(k, tuple(samplers)):
                spent[key] += _timed(lambda: _train_step(opt, samplers[key], tokens, batch, model))
            for key in samplers:
                times[key].append(spent[key] / 2)
        pair = paired_ratio(times["sazo"], times["uniform"])
        uniform = statistics.median(times["uniform"])
        extra = sampler_seconds(SAZOSampler(n, seed=1), batch) - sampler_seconds(UniformSampler(n, seed=1), batch)
        out[f"N={n:.0e}"] = dict(uniform_step_s=uniform, sazo_step_s=statistics.median(times["sazo"]),
                                 ratio=pair["median_ratio"], best_ratio=pair["ratio"],
                                 sampler_extra_s=extra, component_ratio=1 + extra / uniform,
                                 extra_state_bytes=state_bytes(samplers["sazo"]) - state_bytes(samplers["uniform"]))
    return out


def sampler_cost(n: int = 10 ** 6, batch: int = 32, repeats: int = 20) -> dict:
    """Median seconds of sample(B) + update(B) at N examples; a bare SumTree and multinomial."""
    g = torch.Generator().manual_seed(0)
    out = dict(num_examples=n, batch=batch)
    for name, sampler in (("uniform", UniformSampler(n, seed=0)), ("sazo", SAZOSampler(n, seed=0))):
        out[f"{name}_s"] = sampler_seconds(sampler, batch, repeats)
    tree = SumTree(torch.rand(n, generator=g, dtype=torch.float64))
    def tree_round_trip():
        indices = tree.sample(batch, g)
        tree.update(indices, torch.rand(batch, generator=g, dtype=torch.float64))
    out["sumtree_s"] = statistics.median(_timed(tree_round_trip) for _ in range(repeats))
    probs = torch.rand(n, generator=g, dtype=torch.float64)
    out["multinomial_s"] = statistics.median(
        _timed(lambda: torch.multinomial(probs, batch, replacement=True, generator=g)) for _ in range(repeats))
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.engine_speed", description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=("speed", "memory", "overhead", "sampler", "memory-child"),
                        help="what to measure (memory-child: one fresh process of memory, run by memory)")
    parser.add_argument("model", nargs="?", default="gpt2-tiny", choices=MODELS, help="the model (default gpt2-tiny)")
    parser.add_argument("mode", nargs="?", default="plain", choices=MEMORY_MODES, help="memory-child: the step measured (default plain)")
    parser.add_argument("--clock", default="wall", choices=tuple(CLOCKS), help="speed: wall or CPU seconds")
    parser.add_argument("--rounds", type=count, default=3, help="speed: interleaved rounds (default 3)")
    parser.add_argument("--bound", type=positive, default=None,
                        help="speed: exit 1 when the default step costs more than BOUND × two forwards (not judged, "
                             "exit 0, when the load swamped the timings)")
    args = parser.parse_args(argv)
    if args.part != "speed":
        refuse_unused(parser, args, ("clock", "rounds", "bound"), f"to {args.part} (speed only)")
    # positionals a part does not read: else taken without a word (memory smollm2 default measured every mode)
    if args.part != "memory-child" and args.mode != parser.get_default("mode"):
        parser.error(f"argument mode: {args.mode!r} does not apply to {args.part} (memory-child only; memory "
                     f"measures every mode)")
    if args.part == "sampler" and args.model != parser.get_default("model"):
        parser.error(f"argument model: {args.model!r} does not apply to sampler (its samplers time no model)")
    if args.part == "memory-child":
        print(json.dumps(_memory_child(args.model, args.mode)))
        return
    run = {"speed": lambda: speed(args.model, rounds=args.rounds, clock=args.clock), "memory": lambda: memory(args.model),
           "overhead": lambda: overhead(args.model), "sampler": sampler_cost}[args.part]
    result = run()
    result["machine"] = machine()
    print(json.dumps(result, indent=1))
    print(f"measured {measured_line(result['machine'])}")
    if args.part == "speed":
        print(breakdown(result))
        warning = too_noisy(result)
        if warning:
            print(warning, file=sys.stderr, flush=True)
        if args.bound is None:
            print(f"default step ÷ 2·forward = {result['default_ratio']:.2f}")
            return
        verdict, failed = step_verdict(result, args.bound)
        if failed:
            raise SystemExit(verdict)
        print(verdict)


if __name__ == "__main__":
    main()
