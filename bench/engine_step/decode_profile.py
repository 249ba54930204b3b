"""Where a lone stream's decode step goes: matmuls, attention, norms, rotary, the rest of the
forward, the LM head, sampling, and Python (scheduling, inputs, outputs), per weight format.

One EngineCore per variant in this process (the default model, the own forward), each decoding
one greedy stream after a prompt of C tokens; the variants take turns of a few steps so drift in
a shared VM falls on each alike. The forward's parts are timed by wrapping the functions it calls
(`linear`, the attention call, `_rms_norm`, `_rotate`, the embedding lookup): on a CPU every op
is synchronous, so a wrapper's clock is the op's time (plus about a microsecond per call, which
the table's call counts let a reader weigh).

Usage: python bench/engine_step/decode_profile.py [--context 100] [--rounds 8] [--threads 2]
       [--variants bf16 gguf] [--out bench/results/decode_profile.md]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from trio_llm.config import EngineArgs
from trio_llm.engine.models import llama
from trio_llm.engine.step.core import EngineCore
from trio_llm.ipc.messages import EngineCoreRequest
from trio_llm.sampling_params import SamplingParams

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))  # bench/: bench modules are imported by their path under it

import hostinfo  # noqa: E402

VARIANTS = {
    "bf16": ("bf16 (the GGUF dequantized, the former default)", "bfloat16", "none"),
    "fp32": ("fp32 (the GGUF dequantized)", "float32", "none"),
    "gguf": ("the GGUF in its own formats (Q4_1 as int4, Q8_0 as int8)", "auto", "auto"),
    "int8": ("int8 quantized at load", "auto", "int8"),
    "w8a8": ("the GGUF as int8 rows with int8 activations", "auto", "w8a8"),
}
PARTS = ("matmul", "LM head", "attention", "norms", "rotary", "embedding")
STEPS_PER_TURN = 5


class Clock:
    """Seconds (exclusive of the timed parts inside) and calls per part, over the steps since
    the last `take`. What the LM head calls is the LM head's."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.stack: list[list[Any]] = []
        """[part, start, seconds of timed parts inside] of the parts in progress."""

    def wrap(self, part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if self.stack and self.stack[-1][0] == "LM head":
                return fn(*args, **kwargs)
            self.stack.append([part, time.perf_counter(), 0.0])
            try:
                return fn(*args, **kwargs)
            finally:
                _, start, inner = self.stack.pop()
                elapsed = time.perf_counter() - start
                self.seconds[part] += elapsed - inner
                self.calls[part] += 1
                if self.stack:
                    self.stack[-1][2] += elapsed

        return timed

    def take(self) -> tuple[dict[str, float], dict[str, int]]:
        got = dict(self.seconds), dict(self.calls)
        self.seconds, self.calls = defaultdict(float), defaultdict(int)
        return got


def instrument(core: EngineCore, clock: Clock) -> None:
    own = core.runner.own
    assert own is not None, "the own forward runs every variant"
    own.linear = clock.wrap("matmul", own.linear)
    own.logits = clock.wrap("LM head", own.logits)  # type: ignore[method-assign]
    runner = core.runner
    runner.sample = clock.wrap("sampling", runner.sample)  # type: ignore[method-assign]
    runner.prepare = clock.wrap("inputs", runner.prepare)  # type: ignore[method-assign]


def patch_module(clock: Clock) -> None:
    """The forward's module-level helpers and the attention call, for every core."""
    llama._rms_norm = clock.wrap("norms", llama._rms_norm)  # type: ignore[assignment]
    llama._rotate = clock.wrap("rotary", llama._rotate)  # type: ignore[assignment]
    llama.embedding = clock.wrap("embedding", llama.embedding)  # type: ignore[assignment]
    from trio_llm.engine.attention import metadata_type

    for backend in ("torch",):
        kind = metadata_type(backend)
        kind.forward = clock.wrap("attention", kind.forward)  # type: ignore[method-assign]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--context", type=int, default=100)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--variants", nargs="+", default=["bf16", "gguf"], choices=list(VARIANTS))
    p.add_argument("--out", type=Path, default=BENCH / "results" / "decode_profile.md")
    args = p.parse_args()

    clock = Clock()
    patch_module(clock)
    cores = {}
    for name in args.variants:
        _, dtype, quantization = VARIANTS[name]
        core = EngineCore(
            EngineArgs(
                num_threads=args.threads,
                dtype=dtype,
                quantization=quantization,
                ngram_speculation="off",
                kv_cache_memory="64MiB",
                enable_prefix_caching=False,
            )
        )
        instrument(core, clock)
        cores[name] = core
    prompt = torch.randint(100, 40000, (args.context,), generator=torch.Generator().manual_seed(0))
    params = SamplingParams(
        temperature=0.0, max_tokens=(args.rounds + 1) * STEPS_PER_TURN + 4, ignore_eos=True
    )
    for name, core in cores.items():
        core.add_request(EngineCoreRequest(name, prompt.tolist(), params))
        core.step()  # the prefill
    samples: dict[str, list[tuple[float, dict[str, float], dict[str, int]]]] = defaultdict(list)
    for round_ in range(args.rounds + 1):
        for name, core in cores.items():
            for k in range(STEPS_PER_TURN):
                clock.take()
                t0 = time.perf_counter()
                core.step()
                elapsed = time.perf_counter() - t0
                seconds, calls = clock.take()
                if round_ and k:
                    samples[name].append((elapsed, seconds, calls))

    lines = [
        *hostinfo.heading("A lone stream's decode step, part by part"),
        "",
        f"EngineCore in process, the default model (SmolLM2-135M-Instruct), one greedy stream "
        f"after a {args.context}-token prompt, n-gram drafts off; medians over "
        f"{args.rounds * (STEPS_PER_TURN - 1)} steps per variant, the variants taking turns. "
        "`matmul`: the 30 layers' projections (QKV, output, gate-up, down); `LM head`: the "
        "sampled row's logits; `inputs`: the step's input tensors; `Python and the rest`: the "
        "step less every timed part (scheduling, the forward's small ops such as views, "
        "residual adds and SiLU, outputs).",
        "",
        "| variant | step (ms) | " + " | ".join(PARTS) + " | inputs | sampling "
        "| Python and the rest |",
        "|---|---|" + "---|" * (len(PARTS) + 3),
    ]
    for name, got in samples.items():
        step = statistics.median(s[0] for s in got)
        parts = {
            part: statistics.median(s[1].get(part, 0.0) for s in got)
            for part in (*PARTS, "inputs", "sampling")
        }
        rest = step - sum(parts.values())
        cells = [f"{parts[p] * 1e3:.2f} ({parts[p] / step:.0%})" for p in (*PARTS, "inputs")]
        cells.append(f"{parts['sampling'] * 1e3:.2f} ({parts['sampling'] / step:.0%})")
        cells.append(f"{rest * 1e3:.2f} ({rest / step:.0%})")
        lines.append(f"| {VARIANTS[name][0]} | {step * 1e3:.2f} | " + " | ".join(cells) + " |")
        print(lines[-1], flush=True)
    calls = samples[args.variants[0]][0][2]
    lines += [
        "",
        "Calls per step: " + ", ".join(f"{k} {v}" for k, v in sorted(calls.items())) + ".",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
