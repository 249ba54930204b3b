"""The engine on a GPU against Hugging Face `generate`, on random-weight models built here (no
weights travel to the device machine): offline throughput with CUDA graphs on and off, and one
sequence's decode step beside the sum of its kernels' times.

Models: SmolLM2-135M's shape and Llama-3.2-1B's shape (random weights, bf16 on a GPU, context
capped at --max-model-len), saved once under --workdir. For each shape and each N in --ns, N
random prompts of --prompt tokens ask for --output tokens each (greedy, ignore_eos); the engine
(EngineCore in this process, bench/engine_step/throughput.py's `run_core`) serves them with
graphs on, then with --enforce-eager, and `generate` runs them as one static batch; tok/s =
output tokens / wall seconds, after a warm-up run of each (Triton's compiles, cuBLAS's
choices).

Step time: one request decoding alone (graphs on), the median wall time of --step-samples steps
(scheduling, inputs, the replay, sampling, the sampled token back), and the CUDA kernel time of
the same steps under torch.profiler, summed per step: the goal is a step within 1.5x of its
kernels.

On a CPU (no CUDA) it runs the same code on --shapes tiny with few sequences, eager only (graphs
need CUDA), to prove the script end to end; its numbers say nothing about a GPU.

Usage: python bench/gpu/gpu_engine.py [--shapes smollm2,llama1b] [--ns 1,32,256] [--prompt 128]
       [--output 128] [--out bench/results/gpu_engine.md]
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

import torch

from trio_llm.config import EngineArgs
from trio_llm.engine.step.core import EngineCore
from trio_llm.ipc.messages import EngineCoreRequest

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))  # bench/: bench modules are imported by their path under it

import hostinfo  # noqa: E402
from engine_step import throughput  # noqa: E402

SHAPES: dict[str, dict[str, object]] = {
    # HuggingFaceTB/SmolLM2-135M-Instruct's config.json
    "smollm2": dict(
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=64,
        vocab_size=49152,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
    ),
    # meta-llama/Llama-3.2-1B's config.json (its llama3 rope scaling included)
    "llama1b": dict(
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        vocab_size=128256,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    ),
    # The CPU proof run's.
    "tiny": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=4096,
        tie_word_embeddings=True,
    ),
}


def build_model(shape: str, workdir: Path, max_model_len: int) -> Path:
    """A random-weight Llama of `shape` saved as a Hugging Face directory (no tokenizer: the
    engine takes token ids)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    path = workdir / shape
    if (path / "config.json").is_file():
        return path
    config = LlamaConfig(
        **SHAPES[shape],  # type: ignore[arg-type]
        max_position_embeddings=max_model_len,
        bos_token_id=1,
        eos_token_id=2,
        architectures=["LlamaForCausalLM"],
    )
    torch.manual_seed(0)
    # Initialized where it is fastest: 1.2B random parameters take a CPU several seconds.
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    model.save_pretrained(path)
    del model
    return path


def load_hf(path: Path, device: str, dtype: torch.dtype) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return (
        AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa")
        .to(device)
        .eval()
    )


def make_core(path: Path, device: str, dtype: str, eager: bool, max_num_seqs: int) -> EngineCore:
    return EngineCore(
        EngineArgs(
            model=str(path),
            device=device,
            dtype=dtype,
            enforce_eager=eager,
            max_num_seqs=max_num_seqs,
            kv_cache_memory="auto" if device.startswith("cuda") else "256MiB",
            num_threads=None if device.startswith("cuda") else 1,
        )
    )


def step_profile(core: EngineCore, prompt: list[int], steps: int) -> tuple[float, float | None]:
    """(median wall ms of one decode step of a lone request, CUDA kernel ms per step)."""
    wall = throughput.engine_step(core, prompt, steps).wall_ms
    if core.device.type != "cuda":
        return wall, None
    from torch.profiler import ProfilerActivity, profile

    core.add_request(EngineCoreRequest("profiled", prompt, throughput.params(steps + 1)))
    core.step()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            core.step()
        torch.cuda.synchronize()
    assert not core.has_work()
    # Every GPU activity (kernels, also those a graph replays, memcpys, memsets), by its span.
    kernel_us = sum(
        event.time_range.elapsed_us()
        for event in prof.events()
        if event.device_type == torch.autograd.DeviceType.CUDA
    )
    return wall, kernel_us / 1e3 / steps


def graph_replays(core: EngineCore) -> str:
    graphs = getattr(core.runner, "graphs", None)
    if graphs is None:
        return "—"
    return f"{graphs.replays} replays, {graphs.memory_bytes / 2**20:.0f} MiB"


def bench_shape(shape: str, args: argparse.Namespace, device: str, rows: list[str]) -> list[str]:
    """The throughput rows of one shape (appended to `rows`); the step-time lines back."""
    cuda = device.startswith("cuda")
    path = build_model(shape, args.workdir, args.max_model_len)
    ns = [int(n) for n in args.ns.split(",")]
    vocab = int(SHAPES[shape]["vocab_size"])  # type: ignore[call-overload]
    prompts = {n: throughput.prompts_for(n, args.prompt, vocab, seed=n) for n in ns}
    warm = throughput.prompts_for(2, 16, vocab, seed=99)
    results: dict[str, dict[int, float]] = {}
    notes: dict[str, str] = {}
    modes = [("graphs", False), ("eager", True)] if cuda else [("eager", True)]
    step_lines: list[str] = []
    for mode, eager in modes:
        t = time.perf_counter()
        core = make_core(path, device, args.dtype, eager, max(ns))
        started = time.perf_counter() - t
        throughput.run_core(core, warm, 4, f"warm-{mode}")
        results[mode] = {}
        for n in ns:
            run = throughput.run_core(core, prompts[n], args.output, f"{mode}-{n}")
            results[mode][n] = run.tokens_per_s
            print(f"{shape} engine {mode} N={n}: {run.tokens_per_s:.0f} tok/s", flush=True)
        notes[mode] = f"start-up {started:.1f} s, {graph_replays(core)}"
        if mode == modes[0][0]:
            wall, kernels = step_profile(core, prompts[ns[0]][0], args.step_samples)
            kernel_text = "—" if kernels is None else f"{kernels:.3f} ms"
            ratio = "—" if kernels is None else f"{wall / kernels:.2f}x"
            step_lines.append(f"| {shape} | {mode} | {wall:.3f} ms | {kernel_text} | {ratio} |")
        del core
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
    hf = load_hf(
        path, device, getattr(torch, args.dtype) if args.dtype != "auto" else torch.float32
    )
    throughput.run_generate(hf, warm, [4, 4])
    results["hf"] = {}
    for n in ns:
        run = throughput.run_generate(hf, prompts[n], [args.output] * n)
        results["hf"][n] = run.tokens_per_s
        print(f"{shape} HF generate N={n}: {run.tokens_per_s:.0f} tok/s", flush=True)
    del hf
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    for n in ns:
        hf_tps = results["hf"][n]
        cells = []
        for mode in ("graphs", "eager"):
            tps = results.get(mode, {}).get(n)
            cells.append("—" if tps is None else f"{tps:.0f} ({tps / hf_tps:.2f}x)")
        rows.append(f"| {shape} | {n} | {cells[0]} | {cells[1]} | {hf_tps:.0f} |")
    rows.append(f"| {shape} | engine | {notes.get('graphs', '—')} | {notes['eager']} | |")
    return step_lines


def machine(device: str) -> str:
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(0)
        name = (
            f"{props.name}, {props.total_memory / 2**30:.0f} GiB, {props.multi_processor_count} SMs"
        )
        return f"Device: {name}; torch {torch.__version__}, CUDA {torch.version.cuda}."
    return f"Device: CPU only ({hostinfo.describe()}); torch {torch.__version__}."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=None, help="default: smollm2,llama1b (CPU: tiny)")
    parser.add_argument("--ns", default=None, help="default: 1,32,256 (CPU: 1,4)")
    parser.add_argument("--prompt", type=int, default=None, help="default 128 (CPU: 16)")
    parser.add_argument("--output", type=int, default=None, help="default 128 (CPU: 8)")
    parser.add_argument("--step-samples", type=int, default=30)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--dtype", default=None, help="default bfloat16 (CPU: float32)")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/trio-gpu-models"))
    parser.add_argument("--out", type=Path, default=BENCH / "results" / "gpu_engine.md")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    args.shapes = args.shapes or ("smollm2,llama1b" if cuda else "tiny")
    args.ns = args.ns or ("1,32,256" if cuda else "1,4")
    args.prompt = args.prompt or (128 if cuda else 16)
    args.output = args.output or (128 if cuda else 8)
    args.dtype = args.dtype or ("bfloat16" if cuda else "float32")
    if not cuda:
        args.step_samples = min(args.step_samples, 5)
        torch.set_num_threads(1)  # HF's side too: the CPU run proves the script, on few cores
    args.workdir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    rows = [
        "| shape | N | engine, CUDA graphs: tok/s (x HF) | engine, eager: tok/s (x HF) "
        "| HF generate tok/s |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    steps = [
        "| shape | mode | decode step, 1 seq (wall) | its CUDA kernels | wall / kernels |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for shape in args.shapes.split(","):
        steps += bench_shape(shape, args, device, rows)
    report = [
        "# The engine on a GPU: CUDA graphs, eager, and Hugging Face generate",
        "",
        f"Command: `{hostinfo.command()}`",
        "",
        machine(device),
        "",
        f"Random-weight models of each shape in {args.dtype}, context capped at "
        f"{args.max_model_len}. N prompts of {args.prompt} random tokens, {args.output} output "
        "tokens each (greedy, ignore_eos); the engine is EngineCore in this process (no "
        "frontend), its KV cache auto-sized on a GPU (256 MiB on a CPU); `generate` runs one "
        "static batch with SDPA attention. Goal (issue 20): at least 2x HF at 256.",
        "",
        *(
            []
            if cuda
            else [
                "**No GPU in this run**: the CPU proof run of bench/gpu/gpu_check.sh (tiny shape, "
                "eager only: graphs need CUDA). Its numbers say nothing about a GPU.",
                "",
            ]
        ),
        *rows,
        "",
        "## One sequence's decode step",
        "",
        "Median wall time of a lone request's decode step through EngineCore.step (schedule, "
        "inputs, forward, sampling, the token back), and the CUDA kernel time of the same "
        "steps under torch.profiler, per step. Goal: wall within 1.5x of the kernels.",
        "",
        *steps,
        "",
        f"Run took {time.perf_counter() - started:.0f} s. Written by bench/gpu/gpu_engine.py.",
        "",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(report))
    print("\n".join(report))


if __name__ == "__main__":
    main()
