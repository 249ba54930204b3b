"""Decode steps per architecture: the generic path, the own forward where one exists, and
transformers' own `generate` at the same batch.

Each model is a random-weight model of a real small checkpoint's shapes (some with fewer layers,
said in the table), built from transformers' config class and saved once under --cache. For each
N, N prompts of --context tokens decode greedily: the engine (EngineCore in this process) runs
its steps with every sequence decoding and the median step is taken; `generate` runs the same
prompts as one static batch of N, and its step is the median interval between its decode steps'
logits (a logits processor notes when each is ready). Time is this process's CPU time unless
--clock wall (the machine is shared). The variants of one model run one after another (one loaded
at a time: the larger models do not fit three times in memory), in --rounds rounds, and each
cell is the median of the rounds' medians.

Goals (issue 26): the generic path at N=32 at least 2x transformers' generate at batch 32; an
own forward at least 1.15x the generic path, or it is not kept.

Usage: python bench/model_types/models.py [--models gemma3,qwen3,...] [--ns 1,32] [--threads 1]
       [--rounds 2] [--clock cpu|wall] [--mixed gemma3] [--out bench/results/models.md]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from trio_llm.config import EngineArgs
from trio_llm.engine.step.core import EngineCore
from trio_llm.ipc.messages import EngineCoreRequest
from trio_llm.sampling_params import SamplingParams

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))  # bench/: bench modules are imported by their path under it

import hostinfo  # noqa: E402

clock = time.process_time
"""What a step's time is read from (`--clock`): this process's CPU time by default. The machine
is shared (2 cores, load 4-16), and one-threaded processes time-sliced with others measured up
to 4x apart in wall time between rounds of the same cell; CPU time is what the step costs."""


@dataclass(frozen=True)
class Spec:
    label: str
    """The checkpoint whose shapes these are (and how it was cut down)."""
    config: str
    """transformers' config class."""
    shape: dict[str, Any]


SPECS = {
    "llama": Spec(
        "SmolLM2-135M (Llama)",
        "LlamaConfig",
        {
            "hidden_size": 576,
            "intermediate_size": 1536,
            "num_hidden_layers": 30,
            "num_attention_heads": 9,
            "num_key_value_heads": 3,
            "vocab_size": 49152,
            "tie_word_embeddings": True,
            "rope_theta": 100000.0,
            "max_position_embeddings": 8192,
        },
    ),
    "qwen3": Spec(
        "Qwen3-0.6B, 14 of 28 layers",
        "Qwen3Config",
        {
            "hidden_size": 1024,
            "intermediate_size": 3072,
            "num_hidden_layers": 14,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "vocab_size": 151936,
            "tie_word_embeddings": True,
            "max_position_embeddings": 40960,
        },
    ),
    "gemma3": Spec(
        "Gemma-3-270M",
        "Gemma3TextConfig",
        {
            "hidden_size": 640,
            "intermediate_size": 2048,
            "num_hidden_layers": 18,
            "num_attention_heads": 4,
            "num_key_value_heads": 1,
            "head_dim": 256,
            "vocab_size": 262144,
            "sliding_window": 512,
            "query_pre_attn_scalar": 256,
            "max_position_embeddings": 32768,
        },
    ),
    "gemma2": Spec(
        "Gemma-2-2B, 3 of 26 layers",
        "Gemma2Config",
        {
            "hidden_size": 2304,
            "intermediate_size": 9216,
            "num_hidden_layers": 3,
            "num_attention_heads": 8,
            "num_key_value_heads": 4,
            "head_dim": 256,
            "vocab_size": 256000,
            "sliding_window": 4096,
            "query_pre_attn_scalar": 256,
            "attn_logit_softcapping": 50.0,
            "final_logit_softcapping": 30.0,
            "max_position_embeddings": 8192,
        },
    ),
    "phi3": Spec(
        "Phi-3-mini-4k, 2 of 32 layers",
        "Phi3Config",
        {
            "hidden_size": 3072,
            "intermediate_size": 8192,
            "num_hidden_layers": 2,
            "num_attention_heads": 32,
            "num_key_value_heads": 32,
            "vocab_size": 32064,
            "sliding_window": 2047,
            "max_position_embeddings": 4096,
        },
    ),
    "olmoe": Spec(
        "OLMoE-1B-7B, 2 of 16 layers (64 experts, top 8)",
        "OlmoeConfig",
        {
            "hidden_size": 2048,
            "intermediate_size": 1024,
            "num_hidden_layers": 2,
            "num_attention_heads": 16,
            "num_key_value_heads": 16,
            "num_experts": 64,
            "num_experts_per_tok": 8,
            "vocab_size": 50304,
            "max_position_embeddings": 4096,
        },
    ),
    "gpt2": Spec(
        "GPT-2 (124M)",
        "GPT2Config",
        {"n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257, "n_positions": 1024},
    ),
}


def build(name: str, cache: Path) -> Path:
    """The random-weight model of SPECS[name], saved under `cache` once."""
    import transformers

    path = cache / name
    if (path / "config.json").is_file():
        return path
    spec = SPECS[name]
    config = getattr(transformers, spec.config)(
        **spec.shape, bos_token_id=1, eos_token_id=2, pad_token_id=0
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.config.architectures = [type(model).__name__]
    model.save_pretrained(path)
    return path


@dataclass
class Cell:
    steps: list[float] = field(default_factory=list)
    """Median step seconds, one per round."""
    impl: str = ""
    matmuls: list[float] = field(default_factory=list)
    """The share of the step in matrix products, one per round."""

    @property
    def ms(self) -> float:
        return statistics.median(self.steps) * 1e3


def prompts(n: int, context: int, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(n)
    return [
        torch.randint(100, min(vocab, 30000), (context,), generator=g).tolist() for _ in range(n)
    ]


MATMULS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::_grouped_mm"})
"""The profiler's names of the matrix products a decode step is made of."""


def matmul_share(core: EngineCore, steps: int = 2) -> float:
    """The share of a few decode steps' CPU time spent in matrix products: what no forward of
    the same dtype avoids, so 1 / share bounds what any own forward can gain over this one."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            core.step()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    return sum(e.self_cpu_time_total for e in events if e.key in MATMULS) / total


def engine_steps(
    path: Path, impl: str, n: int, context: int, steps: int, threads: int
) -> tuple[float, str, float]:
    """Median decode step (seconds) with N sequences decoding, what forward it took, and the
    share of the step in matrix products."""
    core = _core(path, impl, n, context, steps, threads)
    params = SamplingParams(temperature=0.0, max_tokens=steps + 8, ignore_eos=True)
    for i, prompt in enumerate(prompts(n, context, core.vocab_size)):
        core.add_request(EngineCoreRequest(f"r{i}", prompt, params))
    while core.scheduler.waiting or any(
        s.num_computed_tokens < s.num_prompt_tokens for s in core.scheduler.running
    ):
        core.step()
    times = []
    for _ in range(steps):
        t0 = clock()
        core.step()
        times.append(clock() - t0)
    own = core.runner.choice.own or "generic"
    share = matmul_share(core)
    del core
    gc.collect()
    return statistics.median(times[1:]), own, share


def _core(path: Path, impl: str, n: int, context: int, steps: int, threads: int) -> EngineCore:
    return EngineCore(
        EngineArgs(
            model=str(path),
            dtype="float32",
            model_impl=impl,
            num_threads=threads,
            max_num_seqs=max(n, 1),
            max_num_batched_tokens=max(n * context, 512),
            max_model_len=context + steps + 16,
            kv_cache_memory=_kv_bytes(path, n * (context + steps + 32)),
            enable_prefix_caching=False,
        )
    )


def _kv_bytes(path: Path, tokens: int) -> int:
    """Bytes of KV cache for `tokens` tokens of the model at `path` (float32), with room."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path)
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    per_token = 2 * config.num_hidden_layers * kv_heads * head_dim * 4
    return int(tokens * per_token * 1.2) + (16 << 20)


def generate_step(path: Path, n: int, context: int, steps: int, threads: int) -> float:
    """transformers' `generate` at batch N: the median time between its decode steps (a logits
    processor notes when each step's logits are ready)."""
    from transformers import AutoModelForCausalLM, LogitsProcessor, LogitsProcessorList

    class Clock(LogitsProcessor):
        def __init__(self) -> None:
            self.times: list[float] = []

        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            self.times.append(clock())
            return scores

    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = torch.tensor(prompts(n, context, model.config.vocab_size))
    ticks = Clock()
    with torch.inference_mode():
        model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=steps + 2,
            min_new_tokens=steps + 2,
            do_sample=False,
            pad_token_id=0,
            logits_processor=LogitsProcessorList([ticks]),
        )
    # The first interval follows the prefill's step; the rest are decode steps.
    intervals = [b - a for a, b in zip(ticks.times[1:], ticks.times[2:])]
    return statistics.median(intervals)


def mixed_workload(n: int, vocab: int, seed: int = 0) -> list[tuple[list[int], int]]:
    """N requests as a server sees them: prompts of 16-192 tokens, 8-96 tokens out each."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        length = int(torch.randint(16, 193, (1,), generator=g))
        tokens = int(torch.randint(8, 97, (1,), generator=g))
        out.append((torch.randint(100, min(vocab, 30000), (length,), generator=g).tolist(), tokens))
    return out


def engine_mixed(path: Path, n: int, threads: int) -> float:
    """The generic path's output tokens per second on the mixed workload (in process)."""
    core = _core(path, "transformers", n, 192, 96, threads)
    work = mixed_workload(n, core.vocab_size)
    t0 = clock()
    for i, (prompt, tokens) in enumerate(work):
        params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
        core.add_request(EngineCoreRequest(f"m{i}", prompt, params))
    while core.has_work():
        core.step()
    elapsed = clock() - t0
    del core
    gc.collect()
    return sum(tokens for _, tokens in work) / elapsed


def generate_mixed(path: Path, n: int, threads: int) -> float:
    """transformers' `generate` on the same workload as one static batch: prompts left-padded
    to the longest, every row run as long as the longest request; only each request's own
    tokens count."""
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    work = mixed_workload(n, model.config.vocab_size)
    longest = max(len(p) for p, _ in work)
    ids = torch.zeros(n, longest, dtype=torch.long)
    mask = torch.zeros(n, longest, dtype=torch.long)
    for row, (prompt, _) in enumerate(work):
        ids[row, longest - len(prompt) :] = torch.tensor(prompt)
        mask[row, longest - len(prompt) :] = 1
    most = max(tokens for _, tokens in work)
    t0 = clock()
    with torch.inference_mode():
        model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=most,
            min_new_tokens=most,
            do_sample=False,
            pad_token_id=0,
        )
    return sum(tokens for _, tokens in work) / (clock() - t0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", default=",".join(SPECS))
    p.add_argument("--ns", default="1,32")
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument(
        "--mixed",
        default="",
        help="models to also run the mixed workload on (N=32, comma-separated; 'all')",
    )
    p.add_argument(
        "--clock",
        choices=["cpu", "wall"],
        default="cpu",
        help="time steps by this process's CPU time (default) or by the wall clock",
    )
    p.add_argument("--cache", type=Path, default=Path("/tmp/trio-llm-bench-models"))
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    global clock
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    ns = [int(n) for n in args.ns.split(",")]
    names = args.models.split(",")
    torch.set_num_threads(args.threads)
    results: dict[tuple[str, int, str], Cell] = {}
    for name in names:
        path = build(name, args.cache)
        for _ in range(args.rounds):
            for n in ns:
                for impl in ("transformers", "auto"):
                    step, own, share = engine_steps(
                        path, impl, n, args.context, args.steps, args.threads
                    )
                    if impl == "auto" and own == "generic":
                        continue  # auto took the generic path: no own forward to compare
                    key = (name, n, "generic" if impl == "transformers" else "own")
                    cell = results.setdefault(key, Cell(impl=own))
                    cell.steps.append(step)
                    cell.matmuls.append(share)
                    print(f"{name} N={n} {key[2]}: {step * 1e3:.1f} ms", file=sys.stderr)
                step = generate_step(path, n, args.context, args.steps, args.threads)
                gc.collect()
                results.setdefault((name, n, "generate"), Cell()).steps.append(step)
                print(f"{name} N={n} generate: {step * 1e3:.1f} ms", file=sys.stderr)
    mixed = names if args.mixed == "all" else [m for m in args.mixed.split(",") if m]
    throughput: dict[str, tuple[float, float]] = {}
    for name in mixed:
        path = build(name, args.cache)
        engine = engine_mixed(path, 32, args.threads)
        gc.collect()
        generate = generate_mixed(path, 32, args.threads)
        gc.collect()
        throughput[name] = (engine, generate)
        print(f"{name} mixed: {engine:.1f} vs {generate:.1f} tok/s", file=sys.stderr)
    report = render(names, ns, results, args) + render_mixed(throughput)
    print(report)
    if args.out:
        args.out.write_text(report)


def render(
    names: list[str], ns: list[int], results: dict[tuple[str, int, str], Cell], args: Any
) -> str:
    lines = [
        *hostinfo.heading(
            "Decode steps per architecture: generic path, own forward, transformers' generate"
        ),
        "",
        "Random weights of each checkpoint's shapes, float32, greedy; N sequences of "
        f"{args.context}-token prompts all decoding. Step: milliseconds per decode step, "
        f"{'CPU time of the one-threaded process' if args.clock == 'cpu' else 'wall time'} (the "
        "engine's whole step: scheduling, inputs, forward, LM head, sampling); generate: "
        "transformers' `generate` on the same prompts as one static batch. The ratios are "
        "speed-ups (step time of the slower over the faster). matmuls: the share of the "
        "generic step's CPU time in matrix products (torch profiler); own ceiling: 1 / that "
        "share, the most any own forward of the same dtype could gain over the generic path "
        "(it does the same products).",
        "",
        "| model | N | generic (ms) | own (ms) | generate (ms) | generic vs generate | "
        "own vs generic | matmuls | own ceiling |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in names:
        for n in ns:
            generic = results.get((name, n, "generic"))
            own = results.get((name, n, "own"))
            gen = results.get((name, n, "generate"))

            def ms(cell: Cell | None) -> str:
                return f"{cell.ms:.1f}" if cell else "-"

            vs_generate = f"{gen.ms / generic.ms:.2f}x" if generic and gen else "-"
            vs_generic = f"{generic.ms / own.ms:.2f}x ({own.impl})" if own and generic else "-"
            share = statistics.median(generic.matmuls) if generic and generic.matmuls else 0.0
            ceiling = f"{1 / share:.2f}x" if share else "-"
            lines.append(
                f"| {SPECS[name].label} | {n} | {ms(generic)} | {ms(own)} | {ms(gen)} | "
                f"{vs_generate} | {vs_generic} | {share:.0%} | {ceiling} |"
            )
    return "\n".join(lines) + "\n"


def render_mixed(throughput: dict[str, tuple[float, float]]) -> str:
    if not throughput:
        return ""
    lines = [
        "",
        "## A mixed workload: continuous batching against a static batch",
        "",
        "32 requests, prompts of 16-192 tokens and 8-96 output tokens each (seeded), greedy. "
        "The engine (generic path, in process) takes them all at once and batches whatever is "
        "running; `generate` runs them as one static batch, prompts left-padded, every row as "
        "long as the longest request. tok/s: the requests' own output tokens over the time taken "
        "(the clock above).",
        "",
        "| model | generic tok/s | generate tok/s | generic vs generate |",
        "|---|---|---|---|",
    ]
    for name, (engine, generate) in throughput.items():
        lines.append(
            f"| {SPECS[name].label} | {engine:.1f} | {generate:.1f} | {engine / generate:.2f}x |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
