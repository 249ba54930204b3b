"""Where one engine step's time goes, and what the CPU knobs change: evidence for issue 6's tuning.

EngineCore in this process serves N random 100-token prompts for each batch size N; the variants
(each torch thread count asked for, and with --compile the most threads with the MLP and norm
modules through torch.compile) take turns of a few decode steps each (interleaved, so that drift
in a shared VM does not favour whichever runs first), and the median step and the tokens/s it gives
are printed side by side with the time of the model's weight matmuls alone (the same weights and
row count, no model around them: the floor of a fp32 engine on this machine); --ops prints the
torch profiler's top operators of a few steps.

Usage: python bench/step_profile.py [--ns 1 32] [--threads 1 2] [--compile] [--ops]
       [--dtype auto] [--out bench/results/step_profile.md]
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from trio_llm.config import EngineArgs
from trio_llm.engine.core import EngineCore
from trio_llm.ipc.messages import EngineCoreRequest
from trio_llm.sampling_params import SamplingParams

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from engine import machine  # noqa: E402  (bench/engine.py)

PROMPT = 100
ROUNDS = 8
"""Timed turns each variant takes at each N (3 timed decode steps and one matmul floor a
turn), after one untimed turn each."""


@dataclass(frozen=True)
class Variant:
    threads: int
    compiled: bool = False

    @property
    def label(self) -> str:
        return f"{self.threads} thread{'s' * (self.threads > 1)}" + (
            ", torch.compile" if self.compiled else ""
        )


class Pointwise:
    """Every layer's MLP and RMSNorms, eager or through torch.compile (inductor, dynamic
    shapes): what fusing the per-layer pointwise work buys. Both forwards are kept so that the
    variants can take turns; each compiles in its first turn, which the timing leaves out."""

    def __init__(self, core: EngineCore) -> None:
        self.modules = [
            module
            for layer in core.runner.decoder.layers
            for module in (layer.mlp, layer.input_layernorm, layer.post_attention_layernorm)
        ]
        self.eager = [m.forward for m in self.modules]
        self.compiled = [torch.compile(f, dynamic=True) for f in self.eager]

    def use(self, compiled: bool) -> None:
        for module, forward in zip(self.modules, self.compiled if compiled else self.eager):
            module.forward = forward


@dataclass
class Samples:
    steps: list[float] = field(default_factory=list)
    floors: list[float] = field(default_factory=list)


def measure(
    core: EngineCore, n: int, variants: list[Variant], pointwise: Pointwise | None
) -> dict[Variant, Samples]:
    """Decode step times of n requests, and the matmul floor, per variant. The variants take
    turns of a few steps in one process: measured one after the other, whichever ran first
    looked up to 25 % faster on this VM, and the matmul floor alone drifted by 40 % within
    minutes; interleaving shows that drift to be the machine's, not the variant's."""
    g = torch.Generator().manual_seed(n)
    params = SamplingParams(
        temperature=0.0, max_tokens=(ROUNDS + 1) * len(variants) * 4 + 20, ignore_eos=True
    )
    for i in range(n):
        prompt = torch.randint(100, 40000, (PROMPT,), generator=g).tolist()
        core.add_request(EngineCoreRequest(f"n{n}-{i}", prompt, params))
    while core.scheduler.waiting or any(
        s.num_computed_tokens < s.num_prompt_tokens for s in core.scheduler.running
    ):
        core.step()  # prefill
    samples = {v: Samples() for v in variants}
    for round_ in range(ROUNDS + 1):  # round 0 warms up (and compiles)
        for v in variants:
            torch.set_num_threads(v.threads)
            if pointwise is not None:
                pointwise.use(v.compiled)
            for k in range(4):
                t0 = time.perf_counter()
                core.step()
                if round_ and k:  # the first step after a switch pays for the switch
                    samples[v].steps.append(time.perf_counter() - t0)
            if round_:
                samples[v].floors.append(matmul_floor(core, n))
    core.abort_requests([f"n{n}-{i}" for i in range(n)])
    while core.has_work():
        core.step()
    return samples


def matmul_floor(core: EngineCore, n: int) -> float:
    """Seconds of every Linear's weight matmul at n rows, back to back."""
    linears = [m for m in core.runner.model.modules() if isinstance(m, torch.nn.Linear)]
    inputs = {m.in_features: torch.randn(n, m.in_features, dtype=m.weight.dtype) for m in linears}
    t0 = time.perf_counter()
    for m in linears:
        F.linear(inputs[m.in_features], m.weight)
    return time.perf_counter() - t0


def op_table(core: EngineCore, n: int) -> str:
    from torch.profiler import ProfilerActivity, profile

    g = torch.Generator().manual_seed(0)
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    for i in range(n):
        core.add_request(
            EngineCoreRequest(
                f"ops-{i}", torch.randint(100, 40000, (PROMPT,), generator=g).tolist(), params
            )
        )
    for _ in range(20):
        core.step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(5):
            core.step()
    core.abort_requests([f"ops-{i}" for i in range(n)])
    while core.has_work():
        core.step()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--ns", type=int, nargs="+", default=[1, 32])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--compile", action="store_true", help="then torch.compile, most threads")
    p.add_argument("--ops", action="store_true", help="the profiler's top ops, most threads")
    p.add_argument("--dtype", default="auto", help="the engine's dtype (auto: bf16 where AMX)")
    p.add_argument("--out", type=Path, default=BENCH / "results" / "step_profile.md")
    args = p.parse_args()

    variants = [Variant(t) for t in args.threads]
    if args.compile:
        variants.append(Variant(max(args.threads), compiled=True))
    core = EngineCore(
        EngineArgs(num_threads=max(args.threads), max_num_seqs=max(args.ns), dtype=args.dtype)
    )
    pointwise = Pointwise(core) if args.compile else None
    rows = []
    ops = {}
    for n in args.ns:
        for v, got in measure(core, n, variants, pointwise).items():
            step, floor = statistics.median(got.steps), statistics.median(got.floors)
            rows.append((v, n, step, floor))
            print(
                f"{v.label} N={n}: step {step * 1e3:.1f} ms ({n / step:.1f} tok/s), "
                f"weight matmuls alone {floor * 1e3:.1f} ms",
                flush=True,
            )
        if args.ops:
            torch.set_num_threads(max(args.threads))
            if pointwise is not None:
                pointwise.use(False)
            ops[n] = op_table(core, n)
            print(ops[n], flush=True)

    lines = [
        "# One engine step on this CPU: threads, torch.compile, and the matmul floor",
        "",
        f"Machine: {machine()}.",
        f"Date: {datetime.datetime.now().isoformat(timespec='minutes')}.",
        "",
        f"EngineCore in process, default model ({core.ready.dtype}), N requests of {PROMPT} "
        f"random prompt tokens, greedy; the median of {ROUNDS * 3} decode steps per row, the "
        "variants taking turns in one process. "
        "`matmuls alone`: every Linear of the model (LM head included) at N rows, back to back, "
        "no model around them. Written by bench/step_profile.py.",
        "",
        "| N | variant | step (ms) | tok/s | matmuls alone (ms) | matmul share |",
        "|---|---|---|---|---|---|",
    ]
    for v, n, step, floor in rows:
        lines.append(
            f"| {n} | {v.label} | {step * 1e3:.1f} | {n / step:.1f} | {floor * 1e3:.1f} | "
            f"{floor / step:.0%} |"
        )
    for n, table in ops.items():
        lines += ["", f"Top operators, N={n}, {max(args.threads)} threads (5 steps):", ""]
        lines += ["```", table.strip(), "```"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
