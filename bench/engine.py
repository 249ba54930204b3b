"""Offline engine throughput against Hugging Face `generate` on static batches, side by side.

For each N (concurrent requests), N random prompts of --prompt tokens each ask for --output tokens
with ignore_eos, greedy. The engine runs them through the real engine process and shared-memory
rings (column "engine"), and in-process through EngineCore (column "core", the same work without
the process boundary); `generate` runs them as one static batch of N. Also measured: one bare
forward pass of the model (one token, KV cache of --prompt tokens, HF's own attention), which the
engine's N=1 step time is compared with.

Usage: python bench/engine.py [--ns 1,8,32,128] [--threads 2] [--out bench/results/engine.md]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field

import torch

from trio_llm.config import EngineArgs
from trio_llm.engine.core import EngineCore
from trio_llm.engine.loader import resolve_model
from trio_llm.ipc.messages import EngineCoreRequest
from trio_llm.sampling_params import SamplingParams


@dataclass
class Run:
    seconds: float
    output_tokens: int
    step_times: list[float] = field(default_factory=list)
    """Seconds per step in which every request was decoding."""
    kv_bytes: int = 0
    """KV memory held at the peak."""
    kv_reserved: int = 0

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds

    @property
    def step_ms(self) -> float:
        return statistics.median(self.step_times) * 1e3 if self.step_times else float("nan")


def prompts_for(n: int, length: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(100, 49000, (length,), generator=g).tolist() for _ in range(n)]


def params(output: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=output, ignore_eos=True)


def run_core(core: EngineCore, prompts: list[list[int]], output: int, tag: str) -> Run:
    block_bytes = core.ready.kv_cache_bytes // core.ready.num_blocks
    peak_blocks = 0
    steps: list[float] = []
    start = time.perf_counter()
    for i, prompt in enumerate(prompts):
        core.add_request(EngineCoreRequest(f"{tag}-{i}", prompt, params(output)))
    produced = 0
    while core.has_work():
        t0 = time.perf_counter()
        out = core.step()
        dt = time.perf_counter() - t0
        produced += sum(len(o.new_token_ids) for o in out.outputs)
        stats = out.stats
        peak_blocks = max(peak_blocks, stats.num_total_blocks - stats.num_free_blocks)
        if len(out.outputs) == len(prompts) and stats.num_waiting == 0:
            steps.append(dt)
    del steps[:1]  # the step that finished the last prefill
    seconds = time.perf_counter() - start
    assert produced == len(prompts) * output
    return Run(seconds, produced, steps, peak_blocks * block_bytes, core.ready.kv_cache_bytes)


def run_generate(model: torch.nn.Module, prompts: list[list[int]], output: int) -> Run:
    ids = torch.tensor(prompts)
    with torch.inference_mode():
        start = time.perf_counter()
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=output,
            min_new_tokens=output,
            do_sample=False,
            return_dict_in_generate=True,
            pad_token_id=0,
        )
        seconds = time.perf_counter() - start
    produced = (out.sequences.shape[1] - ids.shape[1]) * ids.shape[0]
    cache = out.past_key_values
    kv = sum(t.nbytes for layer in cache.layers for t in (layer.keys, layer.values))
    return Run(seconds, produced, kv_bytes=kv, kv_reserved=kv)


def bare_forward_ms(model: torch.nn.Module, context: int, repeats: int = 15) -> float:
    """One decode forward (one token, a KV cache of `context` tokens), HF's own attention."""
    from transformers import DynamicCache

    prompt = torch.tensor(prompts_for(1, context, seed=1))
    times = []
    with torch.inference_mode():
        for _ in range(repeats):
            cache = DynamicCache(config=model.config)
            model(prompt, past_key_values=cache, use_cache=True, logits_to_keep=1)
            t0 = time.perf_counter()
            model(torch.tensor([[1000]]), past_key_values=cache, use_cache=True, logits_to_keep=1)
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def machine() -> str:
    cpu = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (
        f"{cpu}, {os.cpu_count()} cores; Python {platform.python_version()}, "
        f"torch {torch.__version__}; {datetime.date.today().isoformat()}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ns", default="1,8,32,128")
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--output", type=int, default=128)
    parser.add_argument(
        "--generate-output-at-128",
        type=int,
        default=32,
        help="output tokens for the N=128 cells (generate's slowest; both columns use it)",
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--kv-cache-memory", default="2GiB")
    parser.add_argument("--out", default="bench/results/engine.md")
    args = parser.parse_args()
    ns = [int(n) for n in args.ns.split(",")]
    torch.set_num_threads(args.threads)

    from transformers import AutoModelForCausalLM

    source = resolve_model(None)
    core = EngineCore(
        EngineArgs(
            num_threads=args.threads,
            kv_cache_memory=args.kv_cache_memory,
            max_num_seqs=max(ns),
            enable_prefix_caching=False,
        )
    )
    hf = AutoModelForCausalLM.from_pretrained(source.path, dtype=core.runner.spec.dtype).eval()
    # Warm both paths once (first-call allocations and kernel selection).
    run_core(core, prompts_for(2, 16), 4, "warm")
    run_generate(hf, prompts_for(2, 16), 4)

    bare = bare_forward_ms(hf, args.prompt + args.output // 2)
    rows = []
    for n in ns:
        output = args.generate_output_at_128 if n >= 128 else args.output
        prompts = prompts_for(n, args.prompt, seed=n)
        engine = run_core(core, prompts, output, f"n{n}")
        generate = run_generate(hf, prompts, output)
        rows.append((n, output, engine, generate))
        print(
            f"N={n:4d} out={output}: core {engine.tokens_per_s:7.1f} tok/s "
            f"(step {engine.step_ms:6.1f} ms), generate {generate.tokens_per_s:7.1f} tok/s, "
            f"ratio {engine.tokens_per_s / generate.tokens_per_s:.2f}",
            flush=True,
        )

    lines = [
        "# Engine benchmark: continuous batching vs Hugging Face `generate`",
        "",
        f"Machine: {machine()}. torch threads: {args.threads}. Model: {source.name} "
        f"({core.ready.dtype}, attention backend {core.ready.attention_backend}).",
        f"Each request: {args.prompt} random prompt tokens, greedy, ignore_eos; output tokens "
        f"as listed ({args.generate_output_at_128} at N=128 to keep generate's run short). "
        "`generate` runs all N as one static batch. Times are wall clock of the whole batch; "
        "step time is the median over steps where all N requests decode.",
        "",
        f"Bare forward pass (one token, KV cache of {args.prompt + args.output // 2} tokens, "
        f"HF attention): {bare:.1f} ms.",
        "",
        "| N | output tokens | core tok/s | generate tok/s | ratio | core step ms | "
        "core KV in use | core KV reserved | generate KV |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for n, output, engine, generate in rows:
        lines.append(
            f"| {n} | {output} | {engine.tokens_per_s:.1f} | {generate.tokens_per_s:.1f} | "
            f"{engine.tokens_per_s / generate.tokens_per_s:.2f}x | {engine.step_ms:.1f} | "
            f"{engine.kv_bytes / 2**20:.1f} MiB | {engine.kv_reserved / 2**20:.0f} MiB | "
            f"{generate.kv_bytes / 2**20:.1f} MiB |"
        )
    one = next((e for n, _, e, _ in rows if n == 1), None)
    if one is not None:
        lines += [
            "",
            f"N=1 step time against the bare forward pass: {one.step_ms:.1f} ms vs {bare:.1f} ms "
            f"({one.step_ms / bare - 1:+.0%}).",
        ]
    text = "\n".join(lines) + "\n"
    print(text)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(text)


if __name__ == "__main__":
    sys.exit(main())
