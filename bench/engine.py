"""Offline engine throughput against Hugging Face `generate` on static batches, side by side.

For each N (concurrent requests), N random prompts of --prompt tokens each ask for --output tokens
with ignore_eos, greedy. The engine runs them through the real engine process and shared-memory
rings (column "engine"), and in-process through EngineCore (column "core", the same work without
the process boundary); `generate` runs them as one static batch of N. Also measured: one bare
forward pass of the model (one token, KV cache of --prompt tokens, HF's own attention), which the
engine's N=1 step time is compared with.

Usage: python bench/engine.py [--ns 1,8,32,128] [--threads 2] [--model M] [--in-process]
       [--out bench/results/engine.md]
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field

import torch

from trio_llm.config import EngineArgs
from trio_llm.engine.core import EngineCore
from trio_llm.engine.launch import EngineLaunch
from trio_llm.engine.loader import resolve_model
from trio_llm.ipc.codec import decode_engine_message, encode
from trio_llm.ipc.messages import EngineCoreOutputs, EngineCoreRequest, EngineReady, Shutdown
from trio_llm.ipc.shm_ring import ShmRing
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


def prompts_for(n: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    """Random token ids, above the low ids where tokenizers keep their special tokens."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(100, vocab, (length,), generator=g).tolist() for _ in range(n)]


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

    def run(self, prompts: list[list[int]], output: int, tag: str) -> Run:
        block_bytes = self.ready.kv_cache_bytes // self.ready.num_blocks
        peak_blocks = 0
        stamps: list[float] = []
        start = time.perf_counter()
        for i, prompt in enumerate(prompts):
            self.tx.send(encode(EngineCoreRequest(f"{tag}-{i}", prompt, params(output))))
        produced = finished = 0
        while finished < len(prompts):
            msg = decode_engine_message(self.rx.receive(timeout=600))
            assert isinstance(msg, EngineCoreOutputs), msg
            produced += sum(len(o.new_token_ids) for o in msg.outputs)
            finished += sum(o.finish_reason is not None for o in msg.outputs)
            stats = msg.stats
            peak_blocks = max(peak_blocks, stats.num_total_blocks - stats.num_free_blocks)
            if len(msg.outputs) == len(prompts) and stats.num_waiting == 0:
                stamps.append(msg.timestamp)
        seconds = time.perf_counter() - start
        assert produced == len(prompts) * output
        # Step time: the gap between consecutive all-decode outputs (the engine's clock).
        steps = [b - a for a, b in itertools.pairwise(stamps)]
        return Run(seconds, produced, steps, peak_blocks * block_bytes, self.ready.kv_cache_bytes)

    def close(self) -> None:
        self.tx.send(encode(Shutdown()))
        self.process.wait(60)
        self.requests.close()
        self.outputs.close()


def run_generate(model: torch.nn.Module, prompts: list[list[int]], output: int) -> Run:
    ids = torch.tensor(prompts, device=model.device)
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
        sync(model.device)
        seconds = time.perf_counter() - start
    produced = (out.sequences.shape[1] - ids.shape[1]) * ids.shape[0]
    cache = out.past_key_values
    kv = sum(t.nbytes for layer in cache.layers for t in (layer.keys, layer.values))
    return Run(seconds, produced, kv_bytes=kv, kv_reserved=kv)


def bare_forward_ms(model: torch.nn.Module, context: int, vocab: int, repeats: int = 15) -> float:
    """One decode forward (one token, a KV cache of `context` tokens), HF's own attention."""
    from transformers import DynamicCache

    device = model.device
    prompt = torch.tensor(prompts_for(1, context, vocab, seed=1), device=device)
    token = torch.tensor([[1000]], device=device)
    times = []
    with torch.inference_mode():
        for _ in range(repeats):
            cache = DynamicCache(config=model.config)
            model(prompt, past_key_values=cache, use_cache=True, logits_to_keep=1)
            sync(device)
            t0 = time.perf_counter()
            model(token, past_key_values=cache, use_cache=True, logits_to_keep=1)
            sync(device)
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def machine() -> str:
    cpu = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (
        f"{cpu}, {os.cpu_count()} cores; Python {platform.python_version()}, "
        f"torch {torch.__version__}; {datetime.date.today().isoformat()}; load average "
        f"{os.getloadavg()[0]:.1f} at the end (other processes share the cores)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ns", default="1,8,32,128")
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--output", type=int, default=128)
    parser.add_argument(
        "--output-at-128",
        type=int,
        default=32,
        help="output tokens for the N=128 cells (generate's slowest; both sides use it)",
    )
    parser.add_argument("--model", default=None, help="default: SmolLM2-135M-Instruct")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--kv-cache-memory", default="2GiB")
    parser.add_argument(
        "--in-process", action="store_true", help="drive EngineCore in this process instead"
    )
    parser.add_argument("--out", default="bench/results/engine.md")
    args = parser.parse_args()
    ns = [int(n) for n in args.ns.split(",")]
    torch.set_num_threads(args.threads)

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
    if args.in_process:
        core = EngineCore(engine_args)
        ready = core.ready

        def run_engine(prompts: list[list[int]], output: int, tag: str) -> Run:
            return run_core(core, prompts, output, tag)

        close = None
    else:
        engine = EngineProcess(engine_args)
        ready = engine.ready
        run_engine = engine.run
        close = engine.close
    vocab = ready.vocab_size
    hf = AutoModelForCausalLM.from_pretrained(source.path, dtype=getattr(torch, ready.dtype))
    hf.to(ready.device).eval()
    # Warm both paths once (first-call allocations and kernel selection).
    run_engine(prompts_for(2, 16, vocab), 4, "warm")
    run_generate(hf, prompts_for(2, 16, vocab), 4)

    bare = bare_forward_ms(hf, args.prompt + args.output // 2, vocab)
    rows = []
    for n in ns:
        output = args.output_at_128 if n >= 128 else args.output
        prompts = prompts_for(n, args.prompt, vocab, seed=n)
        eng = run_engine(prompts, output, f"n{n}")
        gen = run_generate(hf, prompts, output)
        rows.append((n, output, eng, gen))
        print(
            f"N={n:4d} out={output}: engine {eng.tokens_per_s:7.1f} tok/s "
            f"(step {eng.step_ms:6.1f} ms), generate {gen.tokens_per_s:7.1f} tok/s, "
            f"ratio {eng.tokens_per_s / gen.tokens_per_s:.2f}",
            flush=True,
        )
    if close is not None:
        close()

    where = "in-process EngineCore" if args.in_process else "the engine process, through the rings"
    lines = [
        "# Engine benchmark: continuous batching vs Hugging Face `generate`",
        "",
        f"Machine: {machine()}. torch threads: {args.threads} (engine and generate). "
        f"Model: {source.name} ({ready.dtype}, attention backend {ready.attention_backend}). "
        f"Engine: {where}.",
        "",
        f"Each request: {args.prompt} random prompt tokens, greedy, ignore_eos; output tokens as "
        f"listed ({args.output_at_128} at N=128, to keep generate's run short). `generate` runs "
        "all N as one static batch. Throughput is output tokens over the wall time of the whole "
        "batch; engine step time is the median gap between consecutive steps in which all N "
        "requests decode.",
        "",
        f"Bare forward pass (one token, KV cache of {args.prompt + args.output // 2} tokens, "
        f"HF attention, logits of one row): {bare:.1f} ms (median).",
        "",
        "| N | output tokens | engine tok/s | generate tok/s | ratio | engine step ms | "
        "engine KV in use (peak) | engine KV reserved | generate KV |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for n, output, eng, gen in rows:
        lines.append(
            f"| {n} | {output} | {eng.tokens_per_s:.1f} | {gen.tokens_per_s:.1f} | "
            f"{eng.tokens_per_s / gen.tokens_per_s:.2f}x | {eng.step_ms:.1f} | "
            f"{eng.kv_bytes / 2**20:.1f} MiB | {eng.kv_reserved / 2**20:.0f} MiB | "
            f"{gen.kv_bytes / 2**20:.1f} MiB |"
        )
    one = next((e for n, _, e, _ in rows if n == 1), None)
    if one is not None:
        lines += [
            "",
            f"N=1 engine step against the bare forward pass: {one.step_ms:.1f} ms vs "
            f"{bare:.1f} ms ({one.step_ms / bare - 1:+.0%}).",
        ]
    text = "\n".join(lines) + "\n"
    print(text)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(text)


if __name__ == "__main__":
    sys.exit(main())
