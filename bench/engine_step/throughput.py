"""Offline engine throughput against Hugging Face `generate` on static batches, side by side.

Throughput: for each N, N random prompts of --prompt tokens each ask for --output tokens
(greedy, ignore_eos). The engine serves them as the frontend would have it: its own process,
requests and outputs through the shared-memory rings. `generate` runs the same prompts as one
static batch of N in this process. Both report wall-clock throughput and CPU-time throughput
(output tokens per CPU second of the process doing the work): on a machine whose cores other
processes share, CPU time is the steadier measure of the work each side does.

Step time: EngineCore in this process serves one request and times its decode steps; the same
model, loaded by HF with its own attention, times one bare forward pass (one token, a KV cache of
the same length, logits of one row). The engine's step includes scheduling, building the inputs,
the forward pass with paged attention, sampling and the output message.

Usage: python bench/engine_step/throughput.py [--ns 1,8,32,128] [--threads 2] [--model M]
       [--out bench/results/engine.md]
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from trio_llm.config import EngineArgs
from trio_llm.engine.step.core import EngineCore
from trio_llm.ipc import ShmRing
from trio_llm.ipc.codec import decode_engine_message, encode
from trio_llm.ipc.messages import (
    EngineCoreOutputs,
    EngineCoreRequest,
    EngineLaunch,
    EngineReady,
    Shutdown,
)
from trio_llm.model_files import resolve_model
from trio_llm.sampling_params import SamplingParams

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))  # bench/: bench modules are imported by their path under it

import hostinfo  # noqa: E402


@dataclass
class Run:
    seconds: float
    cpu_seconds: float
    output_tokens: int
    step_times: list[float] = field(default_factory=list)
    """Wall seconds per step in which every request was decoding."""
    kv_bytes: int = 0
    """KV memory in use at the peak."""

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds

    @property
    def tokens_per_cpu_s(self) -> float:
        return self.output_tokens / self.cpu_seconds

    @property
    def step_ms(self) -> float:
        return statistics.median(self.step_times) * 1e3 if self.step_times else float("nan")


def prompts_for(n: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    """Random token ids, above the low ids where tokenizers keep their special tokens."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(100, vocab, (length,), generator=g).tolist() for _ in range(n)]


def params(output: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=output, ignore_eos=True)


def cpu_seconds_of(pid: int) -> float:
    """User plus system CPU time of a process, all its threads."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def sync(device: torch.device | str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def run_core(core: EngineCore, prompts: list[list[int]], output: int, tag: str) -> Run:
    """The same work as `EngineProcess.run`, through EngineCore in this process: what the
    engine reaches with no process boundary and no frontend (bench/serving/compare.py's
    reference)."""
    block_bytes = core.ready.kv_cache_bytes // core.ready.num_blocks
    peak_blocks = 0
    steps: list[float] = []
    cpu0 = time.process_time()
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
    seconds = time.perf_counter() - start
    assert produced == len(prompts) * output
    return Run(seconds, time.process_time() - cpu0, produced, steps[1:], peak_blocks * block_bytes)


class EngineProcess:
    """The engine as the frontend runs it: its own process, fed and drained through the rings."""

    def __init__(self, args: EngineArgs, ring_bytes: int = 8 << 20) -> None:
        self.requests = ShmRing.create(ring_bytes)
        self.outputs = ShmRing.create(ring_bytes)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "trio_llm.engine"],
            stdin=subprocess.PIPE,
            pass_fds=(*self.requests.fds, *self.outputs.fds),
        )
        self.requests.watch_peer(self.process.pid)
        self.outputs.watch_peer(self.process.pid)
        assert self.process.stdin is not None
        launch = EngineLaunch(
            args=args, request_ring=self.requests.spec, output_ring=self.outputs.spec
        )
        self.process.stdin.write(encode(launch))
        self.process.stdin.close()
        self.tx = self.requests.sender()
        self.rx = self.outputs.receiver()
        ready = decode_engine_message(self.rx.receive(timeout=600))
        if not isinstance(ready, EngineReady):
            raise RuntimeError(f"the engine did not start: {ready}")
        self.ready = ready

    def run(self, prompts: list[list[int]], outputs: list[int], tag: str) -> Run:
        block_bytes = self.ready.kv_cache_bytes // self.ready.num_blocks
        peak_blocks = 0
        stamps: list[float] = []
        cpu0 = cpu_seconds_of(self.process.pid)
        start = time.perf_counter()
        for i, (prompt, output) in enumerate(zip(prompts, outputs)):
            self.tx.send(encode(EngineCoreRequest(f"{tag}-{i}", prompt, params(output))))
        produced = finished = 0
        while finished < len(prompts):
            msg = decode_engine_message(self.rx.receive(timeout=3600))
            assert isinstance(msg, EngineCoreOutputs), msg
            produced += sum(len(o.new_token_ids) for o in msg.outputs)
            finished += sum(o.finish_reason is not None for o in msg.outputs)
            stats = msg.stats
            peak_blocks = max(peak_blocks, stats.num_total_blocks - stats.num_free_blocks)
            if len(msg.outputs) == len(prompts) and stats.num_waiting == 0:
                stamps.append(msg.timestamp)
        seconds = time.perf_counter() - start
        cpu = cpu_seconds_of(self.process.pid) - cpu0
        assert produced == sum(outputs)
        # Step time: the gap between consecutive all-decode outputs, on the engine's clock.
        steps = [b - a for a, b in itertools.pairwise(stamps)]
        return Run(seconds, cpu, produced, steps, peak_blocks * block_bytes)

    def close(self) -> None:
        self.tx.send(encode(Shutdown()))
        self.process.wait(60)
        self.requests.close()
        self.outputs.close()


def run_generate(model: torch.nn.Module, prompts: list[list[int]], outputs: list[int]) -> Run:
    """One static batch: prompts left-padded to the longest, every row generating as many
    tokens as the longest request asks; only each request's own tokens count as output."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=model.device)
    mask = torch.tensor(
        [[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=model.device
    )
    output = max(outputs)
    with torch.inference_mode():
        cpu0 = time.process_time()
        start = time.perf_counter()
        out = model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=output,
            min_new_tokens=output,
            do_sample=False,
            return_dict_in_generate=True,
            pad_token_id=0,
        )
        sync(model.device)
        seconds = time.perf_counter() - start
        cpu = time.process_time() - cpu0
    assert out.sequences.shape[1] - width == output
    produced = sum(outputs)
    cache = out.past_key_values
    kv = sum(t.nbytes for layer in cache.layers for t in (layer.keys, layer.values))
    return Run(seconds, cpu, produced, kv_bytes=kv)


@dataclass
class StepTimes:
    wall_ms: float
    cpu_ms: float


def timed(fn: Callable[[], object], device: torch.device | str) -> tuple[float, float]:
    sync(device)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - wall0, time.process_time() - cpu0


def medians(samples: list[tuple[float, float]]) -> StepTimes:
    return StepTimes(
        wall_ms=statistics.median(w for w, _ in samples) * 1e3,
        cpu_ms=statistics.median(c for _, c in samples) * 1e3,
    )


def engine_step(core: EngineCore, prompt: list[int], steps: int) -> StepTimes:
    """Median decode step of one request, in process (after its prefill step)."""
    core.add_request(EngineCoreRequest("step", prompt, params(steps + 1)))
    core.step()  # the prefill and the first token
    samples = [timed(core.step, core.device) for _ in range(steps)]
    assert not core.has_work()
    return medians(samples)


def bare_forward(model: torch.nn.Module, prompt: list[int], repeats: int) -> StepTimes:
    """One decode forward pass: one token, a KV cache of the prompt, HF's own attention."""
    from transformers import DynamicCache

    device = model.device
    ids = torch.tensor([prompt], device=device)
    token = torch.tensor([[1000]], device=device)
    samples = []
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        model(ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        for _ in range(repeats):
            # The cache grows by one position per call, like the engine's decode steps.
            samples.append(
                timed(lambda: model(token, past_key_values=cache, logits_to_keep=1), device)
            )
    return medians(samples)


def compare(
    engine: EngineProcess,
    hf: torch.nn.Module,
    prompts: list[list[int]],
    outputs: list[int],
    tag: str,
) -> tuple[Run, Run]:
    eng = engine.run(prompts, outputs, tag)
    gen = run_generate(hf, prompts, outputs)
    print(
        f"{tag}: engine {eng.tokens_per_s:7.1f} tok/s ({eng.tokens_per_cpu_s:7.1f}/cpu-s, "
        f"step {eng.step_ms:6.1f} ms), generate {gen.tokens_per_s:7.1f} tok/s "
        f"({gen.tokens_per_cpu_s:7.1f}/cpu-s)",
        flush=True,
    )
    return eng, gen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ns", default="1,8,32,128")
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--output", type=int, default=128)
    parser.add_argument(
        "--output-at-128",
        type=int,
        default=32,
        help="output tokens when N >= 128 (generate's slowest cells; both sides use it)",
    )
    parser.add_argument(
        "--mixed",
        type=int,
        default=32,
        help="also N requests of mixed prompt and output lengths (0: skip)",
    )
    parser.add_argument("--step-samples", type=int, default=30)
    parser.add_argument("--model", default=None, help="default: SmolLM2-135M-Instruct")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--kv-cache-memory", default="2GiB")
    parser.add_argument("--out", default=str(BENCH / "results" / "engine.md"))
    args = parser.parse_args()
    ns = [int(n) for n in args.ns.split(",")]
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]

    from transformers import AutoModelForCausalLM

    source = resolve_model(args.model)
    engine_args = EngineArgs(
        model=str(source.path) if args.model else source.name,
        served_model_name=source.name,
        num_threads=args.threads,
        kv_cache_memory=args.kv_cache_memory,
        max_num_seqs=max(ns),
        enable_prefix_caching=False,  # random prompts share nothing; keep the work identical
    )
    engine = EngineProcess(engine_args)
    ready = engine.ready
    vocab = ready.vocab_size
    hf = AutoModelForCausalLM.from_pretrained(source.path, dtype=getattr(torch, ready.dtype))
    hf.to(ready.device).eval()
    # Warm both paths once (first-call allocations and kernel selection).
    engine.run(prompts_for(2, 16, vocab), [4, 4], "warm")
    run_generate(hf, prompts_for(2, 16, vocab), [4, 4])

    rows = []
    for n in ns:
        output = args.output_at_128 if n >= 128 else args.output
        prompts = prompts_for(n, args.prompt, vocab, seed=n)
        rows.append((str(n), output, *compare(engine, hf, prompts, [output] * n, f"n{n}")))
    if args.mixed:
        # Realistic lengths: prompts and outputs spread around the same means.
        g = torch.Generator().manual_seed(7)
        lengths = torch.randint(
            args.prompt // 4, args.prompt * 7 // 4 + 1, (args.mixed,), generator=g
        )
        outputs = torch.randint(
            args.output // 8, args.output * 15 // 8 + 1, (args.mixed,), generator=g
        )
        prompts = [prompts_for(1, int(n), vocab, seed=i)[0] for i, n in enumerate(lengths)]
        label = f"{args.mixed} mixed"
        mean = f"{sum(outputs.tolist()) / args.mixed:.0f} avg"
        rows.append((label, mean, *compare(engine, hf, prompts, outputs.tolist(), "mixed")))
    engine.close()

    core = EngineCore(engine_args)
    step_prompt = prompts_for(1, args.prompt, vocab, seed=1)[0]
    engine_step(core, step_prompt, 3)  # warm
    step = engine_step(core, step_prompt, args.step_samples)
    bare = bare_forward(hf, step_prompt, args.step_samples)
    print(f"N=1 step: engine {step}, bare forward {bare}", flush=True)

    lines = [
        *hostinfo.heading(
            "Engine benchmark: continuous batching vs Hugging Face `generate`",
            f"Load average {load_before:.1f} before the run and {os.getloadavg()[0]:.1f} after "
            f"(other processes share these cores). torch threads: {args.threads} on each side. "
            f"Model: {source.name} ({ready.dtype}, attention backend {ready.attention_backend}).",
        ),
        "",
        "## Throughput: the engine process (through the rings) vs `generate` (static batch)",
        "",
        f"Each request: {args.prompt} random prompt tokens, greedy, ignore_eos, {args.output} "
        f"output tokens ({args.output_at_128} when N >= 128, to keep generate's run short). "
        "tok/s: output tokens over the wall time of the whole batch. tok/cpu-s: output tokens "
        "per CPU second of the process doing the work. Engine step: median gap between "
        "consecutive steps in which all N requests decode (- where none did). The mixed row: "
        f"prompts of {args.prompt // 4}-{args.prompt * 7 // 4} tokens and {args.output // 8}-"
        f"{args.output * 15 // 8} output tokens each; `generate` left-pads the prompts and runs "
        "every row as long as the longest request, and only each request's own tokens count.",
        "",
        "| N | out | engine tok/s | generate tok/s | ratio | engine tok/cpu-s | "
        "generate tok/cpu-s | ratio (CPU) | engine step ms | engine KV peak | generate KV |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for n, output, eng, gen in rows:
        step_ms = "-" if math.isnan(eng.step_ms) else f"{eng.step_ms:.1f}"
        lines.append(
            f"| {n} | {output} | {eng.tokens_per_s:.1f} | {gen.tokens_per_s:.1f} | "
            f"{eng.tokens_per_s / gen.tokens_per_s:.2f}x | {eng.tokens_per_cpu_s:.1f} | "
            f"{gen.tokens_per_cpu_s:.1f} | {eng.tokens_per_cpu_s / gen.tokens_per_cpu_s:.2f}x | "
            f"{step_ms} | {eng.kv_bytes / 2**20:.1f} MiB | "
            f"{gen.kv_bytes / 2**20:.1f} MiB |"
        )
    lines += [
        "",
        f"Engine KV cache reserved: {ready.kv_cache_bytes / 2**20:.0f} MiB "
        f"({ready.num_blocks} blocks of {ready.block_size} tokens); it is allocated lazily "
        "(zero pages), so only the blocks in use cost memory.",
        "",
        "## N=1 step time vs one bare forward pass",
        "",
        f"Median over {args.step_samples} decode steps after a {args.prompt}-token prompt.",
        "",
        "| | wall ms | CPU ms |",
        "|---|---|---|",
        f"| engine step (EngineCore, in process) | {step.wall_ms:.1f} | {step.cpu_ms:.1f} |",
        f"| bare forward (HF attention, KV cache) | {bare.wall_ms:.1f} | {bare.cpu_ms:.1f} |",
        f"| engine / bare | {step.wall_ms / bare.wall_ms:.2f}x | "
        f"{step.cpu_ms / bare.cpu_ms:.2f}x |",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(text)


if __name__ == "__main__":
    sys.exit(main())
