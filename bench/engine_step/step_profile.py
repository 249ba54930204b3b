"""Where one decode step's time goes, per forward implementation, dtype and batch invariance.

One EngineCore per variant lives in this process (the default model; HF modules or the engine's
own Llama forward, float32 or bfloat16, batch invariance off or on). For each case (N sequences
with a context of C tokens), every core gets the same N random prompts of C tokens, prefills
them, and then the cores take turns of a few decode steps each, so that drift in a shared VM
falls on every variant alike (measured one after the other, whichever ran first looked up to
25% faster here). Each step is split into the model's forward, the LM head, input preparation,
sampling, and the rest (scheduling, outputs): the engine's overhead over a bare forward of the
same model code on the same batch.

Usage: python bench/engine_step/step_profile.py [--cases 1x100 1x1000 32x100 32x1000] [--rounds 5]
       [--threads 2] [--variants ...] [--ops] [--out bench/results/step_profile.md]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trio_llm.config import EngineArgs
from trio_llm.engine.ops import (
    bf16_rows,
    f32_rows,
    fused,
    int4_rows,
    int_rows,
    paged_amx,
    paged_decode,
    threads,
)
from trio_llm.engine.step.core import EngineCore
from trio_llm.ipc.messages import EngineCoreRequest
from trio_llm.sampling_params import SamplingParams

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))  # bench/: bench modules are imported by their path under it

import hostinfo  # noqa: E402

STEPS_PER_TURN = 4
"""Decode steps a variant takes per turn; the first, which pays for the switch, is not timed."""


@dataclass(frozen=True)
class Variant:
    impl: str  # "hf" or "own"
    dtype: str
    invariant: str  # "off", "on" or "auto"
    quantization: str = "none"  # the GGUF dequantized unless a variant says otherwise
    in_place: bool = True  # decodes on the in-place kernel (engine/ops/paged_decode.py)
    int4_rows: bool = True  # 4-bit weights on engine/ops/int4_rows.py's kernel where it is chosen
    int_rows: bool = True  # quantized weights on engine/ops/int_rows.py's where it is chosen
    fused: bool = True  # the elementwise ops in engine/ops/fused.py's kernels where they run
    amx: bool = True  # attention on engine/ops/paged_amx.py's kernel where it runs
    strips: bool = True  # plain bf16 weights on engine/ops/bf16_rows.py's kernel where chosen
    f32_strips: bool = True  # plain float32 weights on engine/ops/f32_rows.py's kernel
    f32_blocks: bool = True  # float32 from the GGUF's blocks there (dense copies when False)
    dense_from: int = 0  # the layers' calls take their dense copies from at least these rows

    def make(self, threads: int, kv_cache_memory: int) -> EngineCore:
        """Its core; the row-exact kernels are chosen at start-up (`TRIO_LLM_INT4_ROWS`,
        `TRIO_LLM_INT_ROWS`), the fused ops at each step (`TRIO_LLM_FUSED`, set for its
        turns)."""
        wanted = {
            int4_rows.ENV: self.int4_rows,
            int_rows.ENV: self.int_rows,
            bf16_rows.ENV: self.strips,
            f32_rows.ENV: self.f32_strips,
            f32_rows.BLOCKS_ENV: self.f32_blocks,
        }
        before = {name: os.environ.get(name) for name in wanted}
        os.environ.update({name: "1" if on else "0" for name, on in wanted.items()})
        try:
            core = EngineCore(self.args(threads, kv_cache_memory))
        finally:
            for name, value in before.items():
                if value is None:
                    del os.environ[name]
                else:
                    os.environ[name] = value
        own = core.runner.own
        if self.dense_from and own is not None:  # the layers' crossovers raised (not the head's)
            for weight in own.matrices():
                if weight is not own.lm_head and getattr(weight, "dense", None) is not None:
                    weight.dense_rows = max(weight.dense_rows, self.dense_from)  # type: ignore[union-attr]
        return core

    @property
    def label(self) -> str:
        quantized = "" if self.quantization == "none" else f", weights {self.quantization}"
        gather = "" if self.in_place else ", decodes gathered"
        torch4 = "" if self.int4_rows else ", torch's int4 kernel"
        integer = "" if self.int_rows else ", no integer kernel"
        eager = "" if self.fused else ", eager elementwise ops"
        eager += "" if self.amx else ", attention without AMX"
        eager += "" if self.strips else ", bf16 weights on oneDNN"
        eager += "" if self.f32_strips else ", float32 weights on oneDNN"
        eager += "" if self.f32_blocks else ", float32 weights dense"
        eager += f", dense copies from {self.dense_from} rows" if self.dense_from else ""
        return (
            f"{self.impl}, {self.dtype}, invariance {self.invariant}{quantized}{gather}{torch4}"
            f"{integer}{eager}"
        )

    def args(self, threads: int, kv_cache_memory: int) -> EngineArgs:
        return EngineArgs(
            num_threads=threads,
            max_num_seqs=256,
            dtype=self.dtype,
            model_impl="transformers" if self.impl == "hf" else "auto",
            batch_invariant=self.invariant,
            quantization=self.quantization,
            ngram_speculation="off",
            kv_cache_memory=kv_cache_memory,
            enable_prefix_caching=False,  # every case's prompts are new; no stale hits
        )


VARIANTS = {
    "own-fp32": Variant("own", "float32", "off"),
    "own-fp32-inv": Variant("own", "float32", "on"),
    # float32 weights on oneDNN's plans rather than engine/ops/f32_rows.py's kernel
    "own-fp32-onednn": Variant("own", "float32", "off", f32_strips=False),
    "own-fp32-inv-onednn": Variant("own", "float32", "on", f32_strips=False),
    # the file's blocks dequantized in the kernel (the default of float32 x none) or dense copies
    "own-fp32-dense": Variant("own", "float32", "off", f32_blocks=False),
    "own-fp32-inv-dense": Variant("own", "float32", "on", f32_blocks=False),
    "own-bf16-noinv": Variant("own", "bfloat16", "off"),
    "own-bf16": Variant("own", "bfloat16", "on"),
    "hf-fp32": Variant("hf", "float32", "off"),
    "hf-fp32-inv": Variant("hf", "float32", "on"),
    "hf-bf16": Variant("hf", "bfloat16", "off"),
    "hf-bf16-inv": Variant("hf", "bfloat16", "on"),
    # The GGUF in its own formats (Q4_1 as int4, Q8_0 as int8) and as int8 with int8
    # activations (engine/quant), activations in bf16; invariance on keeps every row on the
    # quantized kernels.
    "own-gguf": Variant("own", "auto", "off", "auto"),
    "own-gguf-inv": Variant("own", "auto", "on", "auto"),
    # As before engine/ops/int4_rows.py: invariance on with torch's int4 kernel for every row.
    "own-gguf-inv-torch4": Variant("own", "auto", "on", "auto", int4_rows=False),
    # The default without engine/ops/int4_rows.py: torch's int4 kernel below the crossover.
    "own-gguf-torch4": Variant("own", "auto", "off", "auto", int4_rows=False),
    # The default, its decodes gathered and run by SDPA instead of the in-place kernel.
    "own-gguf-gather": Variant("own", "auto", "off", "auto", in_place=False),
    # Without engine/ops/int_rows.py (where it is chosen): the float row-exact kernel or torch's.
    "own-gguf-noint": Variant("own", "auto", "off", "auto", int_rows=False),
    "own-gguf-inv-noint": Variant("own", "auto", "on", "auto", int_rows=False),
    # Without engine/ops/fused.py: the layer's elementwise work as eager torch ops.
    "own-gguf-eager": Variant("own", "auto", "off", "auto", fused=False),
    # The attention on the float kernel and SDPA instead of AMX tiles (where they run).
    "own-gguf-noamx": Variant("own", "auto", "off", "auto", amx=False),
    "own-gguf-inv-noamx": Variant("own", "auto", "on", "auto", amx=False),
    # The default with the layers' dense copies taken from 64 rows at least (the LM head's as
    # measured).
    "own-gguf-dense64": Variant("own", "auto", "off", "auto", dense_from=64),
    # The default with its dense copies on oneDNN alone where they are banded with the strip
    # kernel's tiles (ops/matmul.py's BandedWeight, an AMX CPU).
    "own-gguf-onednn": Variant("own", "auto", "off", "auto", strips=False),
    "own-w8a8": Variant("own", "auto", "off", "w8a8"),
    # The GGUF in its own formats with float32 activations (the AVX2-only class's dtype).
    "own-gguf-fp32": Variant("own", "float32", "off", "auto"),
    "own-gguf-fp32-inv": Variant("own", "float32", "on", "auto"),
    "own-gguf-fp32-noint": Variant("own", "float32", "off", "auto", int_rows=False),
    # --quantization none: the GGUF dequantized to bf16, its matmuls on the strip kernel or not
    "own-none": Variant("own", "auto", "auto", "none"),
    "own-none-onednn": Variant("own", "auto", "auto", "none", strips=False),
    "own-none-off": Variant("own", "auto", "off", "none"),
    "own-none-off-onednn": Variant("own", "auto", "off", "none", strips=False),
}
DEFAULT_VARIANTS = ["own-fp32", "own-fp32-inv", "own-bf16-noinv", "own-bf16"]


class Split:
    """Times the runner's parts of every step by wrapping the instance's methods (the runner
    calls them through `self`, so the wrappers see each call)."""

    PARTS = ("prepare", "sample", "lm_head", "execute")

    def __init__(self, core: EngineCore) -> None:
        self.times: dict[str, float] = defaultdict(float)
        runner = core.runner
        for name in self.PARTS:
            setattr(runner, name, self._timed(name, getattr(runner, name)))

    def _timed(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self.times[name] += time.perf_counter() - t0

        return timed

    def take(self) -> dict[str, float]:
        got, self.times = dict(self.times), defaultdict(float)
        return got


@dataclass
class Row:
    variant: Variant
    n: int
    context: int
    step: float
    forward: float
    lm_head: float
    prepare: float
    sampling: float
    """The sampler and its tensors (the sample method less the LM head)."""

    @property
    def rest(self) -> float:
        """Scheduling and outputs: the step outside the runner."""
        return self.step - self.forward - self.lm_head - self.prepare - self.sampling


def run_case(
    cores: dict[Variant, EngineCore],
    splits: dict[Variant, Split],
    n: int,
    context: int,
    rounds: int,
    profiled: Variant | None = None,
) -> tuple[list[Row], str]:
    g = torch.Generator().manual_seed(n * 10_000 + context)
    prompts = [torch.randint(100, 40000, (context,), generator=g).tolist() for _ in range(n)]
    params = SamplingParams(
        temperature=0.0, max_tokens=(rounds + 1) * STEPS_PER_TURN + 8, ignore_eos=True
    )
    for core in cores.values():
        for i, prompt in enumerate(prompts):
            core.add_request(EngineCoreRequest(f"{n}x{context}-{i}", prompt, params))
        while core.scheduler.waiting or any(
            s.num_computed_tokens < s.num_prompt_tokens for s in core.scheduler.running
        ):
            core.step()
    samples: dict[Variant, list[tuple[float, dict[str, float]]]] = defaultdict(list)
    for round_ in range(rounds + 1):  # round 0 warms up
        for variant, core in cores.items():
            os.environ[paged_decode.ENV] = "1" if variant.in_place else "0"
            os.environ[fused.ENV] = "1" if variant.fused else "0"
            os.environ[paged_amx.ENV] = "1" if variant.amx else "0"
            for k in range(STEPS_PER_TURN):
                splits[variant].take()
                t0 = time.perf_counter()
                core.step()
                elapsed = time.perf_counter() - t0
                parts = splits[variant].take()
                if round_ and k:
                    samples[variant].append((elapsed, parts))
    ops = op_table(cores[profiled]) if profiled is not None else ""
    rows = []
    for variant, core in cores.items():
        core.abort_requests([f"{n}x{context}-{i}" for i in range(n)])
        while core.has_work():
            core.step()
        got = samples[variant]

        def median(key: Callable[[tuple[float, dict[str, float]]], float]) -> float:
            return statistics.median(key(s) for s in got)  # noqa: B023

        rows.append(
            Row(
                variant,
                n,
                context,
                step=median(lambda s: s[0]),
                # execute holds prepare, the forward and sample (the LM head and the sampler).
                forward=median(
                    lambda s: s[1]["execute"] - s[1]["prepare"] - s[1].get("sample", 0.0)
                ),
                lm_head=median(lambda s: s[1].get("lm_head", 0.0)),
                prepare=median(lambda s: s[1]["prepare"]),
                sampling=median(lambda s: s[1].get("sample", 0.0) - s[1].get("lm_head", 0.0)),
            )
        )
    return rows, ops


def prefill_times(
    cores: dict[Variant, EngineCore], context: int, rounds: int
) -> dict[Variant, float]:
    """Median seconds to compute one fresh prompt of `context` tokens alone (in the default
    step budget's chunks), per variant, the variants taking turns."""
    g = torch.Generator().manual_seed(context)
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    times: dict[Variant, list[float]] = defaultdict(list)
    for round_ in range(rounds + 1):  # round 0 warms up
        for variant, core in cores.items():
            prompt = torch.randint(100, 40000, (context,), generator=g).tolist()
            os.environ[fused.ENV] = "1" if variant.fused else "0"
            os.environ[paged_amx.ENV] = "1" if variant.amx else "0"
            core.add_request(EngineCoreRequest(f"prefill-{round_}", prompt, params))
            t0 = time.perf_counter()
            while core.has_work():
                core.step()
            if round_:
                times[variant].append(time.perf_counter() - t0)
    return {v: statistics.median(t) for v, t in times.items()}


def op_table(core: EngineCore, steps: int = 3) -> str:
    """The profiler's top operators over a few decode steps of the core's running sequences."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            core.step()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=10)


def invariance_cost(
    rows: list[Row], variants: list[Variant], cases: list[tuple[int, ...]]
) -> list[str]:
    """The table of step time with invariance on over off, per forward and dtype measured both
    ways (the issue's bound: at most 1.10 at N=32 and 1.05 at N=1)."""
    pairs = [
        (off, on)
        for off in variants
        for on in variants
        if (off.impl, off.dtype, off.quantization) == (on.impl, on.dtype, on.quantization)
        and off.invariant == "off"
        and on.invariant != "off"
    ]
    if not pairs:
        return []
    step = {(r.variant, r.n, r.context): r.step for r in rows}
    lines = [
        "",
        "Batch invariance's cost: the step with invariance on over the step with it off:",
        "",
        "| N | C | "
        + " | ".join(on.label.replace(f", invariance {on.invariant}", "") for _, on in pairs)
        + " |",
        "|---|---|" + "---|" * len(pairs),
    ]
    for n, context in cases:
        cells = [f"{step[(on, n, context)] / step[(off, n, context)]:.3f}" for off, on in pairs]
        lines.append(f"| {n} | {context} | " + " | ".join(cells) + " |")
    return lines


def kv_bytes(dtype: str, cases: list[tuple[int, int]], rounds: int) -> int:
    """The cache the largest case needs (SmolLM2-135M: 30 layers, 3 KV heads of 64), plus room."""
    tokens = max(n * (c + (rounds + 1) * STEPS_PER_TURN + 40) for n, c in cases)
    per_token = 30 * 2 * 3 * 64 * (4 if dtype == "float32" else 2)
    return int(tokens * per_token * 1.1) + (64 << 20)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--cases", nargs="+", default=["1x100", "1x1000", "32x100", "32x1000"])
    p.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS, choices=list(VARIANTS))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--ops", action="store_true", help="the profiler's top ops, first variant")
    p.add_argument(
        "--prefill", type=int, nargs="*", default=[1000], help="prompt lengths to time alone"
    )
    p.add_argument("--out", type=Path, default=BENCH / "results" / "step_profile.md")
    args = p.parse_args()
    cases = [tuple(int(x) for x in c.split("x")) for c in args.cases]

    variants = [VARIANTS[v] for v in args.variants]
    if any(v.invariant != "off" for v in variants):
        # fp32 invariance needs MKL's CNR mode from MKL's first call on, as the engine process
        # sets it: here it is on for the variants without invariance too.
        threads.enable_reproducible_mkl()
    cores = {
        v: v.make(args.threads, kv_bytes(v.dtype, cases, args.rounds))  # type: ignore[arg-type]
        for v in variants
    }
    splits = {v: Split(core) for v, core in cores.items()}
    for v, core in cores.items():
        decision = core.runner.invariance
        print(
            f"{v.label}: dtype {core.ready.dtype}, invariance "
            f"{'on' if decision.on else 'off'} ({decision.reason})",
            flush=True,
        )
    load_before = os.getloadavg()
    rows: list[Row] = []
    ops: dict[tuple[int, int], str] = {}
    for n, context in cases:
        got, table = run_case(
            cores, splits, n, context, args.rounds, variants[-1] if args.ops else None
        )
        for row in got:
            rows.append(row)
            print(
                f"N={n} C={context} {row.variant.label}: step {row.step * 1e3:.1f} ms "
                f"({n / row.step:.1f} tok/s), forward {row.forward * 1e3:.1f}, "
                f"LM head {row.lm_head * 1e3:.1f}, prepare {row.prepare * 1e3:.2f}, "
                f"sampling {row.sampling * 1e3:.2f}",
                flush=True,
            )
        if table:
            ops[(n, context)] = table

    lines = [
        *hostinfo.heading(
            "One decode step: forward implementation, dtype and batch invariance",
            f"Load average (1, 5, 15 min) {', '.join(f'{x:.1f}' for x in load_before)} before "
            f"the steps, {', '.join(f'{x:.1f}' for x in os.getloadavg())} after (2 cores shared).",
        ),
        "",
        "EngineCore in process, default model (SmolLM2-135M-Instruct), N sequences with C "
        "context tokens each, greedy decode steps; one core per variant, the variants taking "
        f"turns of {STEPS_PER_TURN} steps in one process (the first of each turn untimed); "
        f"medians of {args.rounds * (STEPS_PER_TURN - 1)} steps. `forward`: the decoder's "
        "forward alone (hf: transformers' modules with the paged attention hooked in; own: "
        "engine/models/llama.py), `LM head`, `prepare` (the step's input tensors) and "
        "`sampling` (the sampler and its tensors) apart; `rest`: scheduling and outputs. "
        "`bare share`: (forward + LM head) / step, what a bare forward of the same code on the "
        "same batch would take of the engine's step.",
        "",
        "| N | C | variant | step (ms) | tok/s | forward | LM head | prepare | sampling | rest "
        "| bare share |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.n} | {r.context} | {r.variant.label} | {r.step * 1e3:.1f} | "
            f"{r.n / r.step:.1f} | {r.forward * 1e3:.1f} | {r.lm_head * 1e3:.1f} | "
            f"{r.prepare * 1e3:.2f} | {r.sampling * 1e3:.2f} | {r.rest * 1e3:.1f} | "
            f"{(r.forward + r.lm_head) / r.step:.0%} |"
        )
    base = {(r.n, r.context): r for r in rows if r.variant == variants[0]}
    lines += [
        "",
        f"Step time relative to {variants[0].label} (lower is faster):",
        "",
        "| N | C | " + " | ".join(v.label for v in variants) + " |",
        "|---|---|" + "---|" * len(variants),
    ]
    for n, context in cases:
        cells = [
            f"{r.step / base[(n, context)].step:.2f}"
            for r in rows
            if (r.n, r.context) == (n, context)
        ]
        lines.append(f"| {n} | {context} | " + " | ".join(cells) + " |")
    lines += invariance_cost(rows, variants, cases)
    for context in args.prefill:
        times = prefill_times(cores, context, args.rounds)
        first = times[variants[0]]
        lines += [
            "",
            f"One prompt of {context} tokens computed alone (time to first token, medians of "
            f"{args.rounds}):",
            "",
            "| variant | seconds | relative |",
            "|---|---|---|",
        ]
        lines += [f"| {v.label} | {t:.2f} | {t / first:.2f} |" for v, t in times.items()]
        print(f"prefill {context}: " + ", ".join(f"{v.label} {t:.2f} s" for v, t in times.items()))
    for (n, context), table in ops.items():
        lines += ["", f"Top operators, {variants[-1].label}, N={n}, C={context} (3 steps):", ""]
        lines += ["```", table.strip(), "```"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
