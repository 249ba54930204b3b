"""The quantized survey (issue 42): every family whose GGUF file serves quantized, with its
weights' memory against the file's size and its decode step against the same file dequantized.

Each family is a random-weight model of small but real proportions (hidden 512, 4 layers, 8
heads over 4 KV heads of 64, a vocabulary of 8192; the mixtures 8 experts routed top-2), written
as llama.cpp's converter writes it (tests/engine/gguf_writer.py: the family's tensor names and
row orders) with its matrices in --kind. The file is then loaded twice, as a user starts it:
`--quantization auto` (the file's own formats: the own forward for the Llama family,
transformers' modules for the rest) and `--quantization none` (dequantized to --dtype). Memory:
the bytes of every weight the engine holds (quantized forms and what stays float: the embedding,
the norms), a tied weight once; dense copies (kept for calls of many rows where memory allows)
are listed apart, because they are a cache the engine sizes to the machine, not the model. Step:
N sequences of --context tokens all decoding, the median of --steps decode steps, this process's
CPU time on --threads threads (the machine is shared; CPU time is what a step costs).

Usage: python bench/weights/quant_survey.py [--families qwen3,gemma3,...] [--ns 1 8]
       [--kind Q4_0] [--out bench/results/quant_survey.md]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trio_llm import model_files
from trio_llm.config import EngineArgs
from trio_llm.engine.models import gguf_modules
from trio_llm.engine.models.gguf_weights import weights_nbytes
from trio_llm.engine.step.core import EngineCore
from trio_llm.ipc.messages import EngineCoreRequest
from trio_llm.sampling_params import SamplingParams

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))  # bench/: bench modules are imported by their path under it
sys.path.insert(0, str(BENCH.parent / "tests" / "engine"))  # the tests' GGUF writer

import hostinfo  # noqa: E402

SHAPE: dict[str, Any] = {
    "vocab_size": 8192,
    "hidden_size": 512,
    "intermediate_size": 1536,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}
"""A small model's proportions (SmolLM2-135M is hidden 576, 30 layers, 9 heads over 3)."""
MOE = {"num_experts_per_tok": 2}

FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", {"head_dim": 64}),
    "qwen2": ("Qwen2Config", {}),
    "mistral": ("MistralConfig", {"sliding_window": 1024}),
    "qwen3": ("Qwen3Config", {"head_dim": 64}),
    "gemma3": (
        "Gemma3TextConfig",
        {
            "head_dim": 64,
            "sliding_window": 512,
            "layer_types": ["sliding_attention"] * 3 + ["full_attention"],
        },
    ),
    "granite": (
        "GraniteConfig",
        {
            "embedding_multiplier": 12.0,
            "residual_multiplier": 0.22,
            "attention_multiplier": 0.015625,
            "logits_scaling": 8.0,
        },
    ),
    "phi3": ("Phi3Config", {"sliding_window": 2047, "original_max_position_embeddings": 2048}),
    "gpt_neox": ("GPTNeoXConfig", {"rotary_pct": 0.25}),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        {"head_dim": 64, "num_experts": 8, "moe_intermediate_size": 384, **MOE},
    ),
    "olmoe": ("OlmoeConfig", {"num_experts": 8, "intermediate_size": 384, **MOE}),
    "mixtral": ("MixtralConfig", {"num_local_experts": 8, "intermediate_size": 768, **MOE}),
}
"""transformers' config class and the family's own settings (real checkpoints' values where
they matter: Granite's multipliers, Gemma 3's five local layers to one global, GPT-NeoX's
partial rotary)."""

clock = time.process_time


@dataclass
class Load:
    forward: str
    weights: int
    dense: int
    steps: dict[int, float]
    """N -> median decode step (seconds)."""


def write_file(family: str, kind: str, directory: Path) -> Path:
    import gguf
    import gguf_writer
    import transformers

    name, own = FAMILIES[family]
    config = getattr(transformers, name)(**{**SHAPE, **own})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    path = directory / f"{family}-{kind}.gguf"
    kind_type = gguf.GGMLQuantizationType[kind]
    # The token table in the file's type too, as llama.cpp's quantize writes it.
    gguf_writer.write(
        model, path, model_files.default_gguf_path(), matrices=kind_type, embedding=True
    )
    return path


def held_bytes(core: EngineCore) -> int:
    """Bytes of every weight the engine holds for the model, a shared tensor once."""
    runner = core.runner
    if runner.own is not None:
        return weights_nbytes(runner.own)
    seen: dict[int, int] = {}
    tensors = [*runner.model.parameters(), *runner.model.buffers()]
    for module in runner.model.modules():  # what a module holds as a plain attribute
        tensors += [v for v in vars(module).values() if isinstance(v, torch.Tensor)]
    caches = {t.data_ptr() for t in [*runner.k_caches, *runner.v_caches]}  # held by attention
    for t in tensors:
        if t.device.type != "meta" and t.layout == torch.strided and t.data_ptr() not in caches:
            seen[t.data_ptr()] = t.numel() * t.element_size()
    quantized = sum(w.nbytes for w in gguf_modules.quantized_weights(runner.model))
    return sum(seen.values()) + quantized


def measure(
    path: Path, quantization: str, ns: list[int], context: int, steps: int, args: Any
) -> Load:
    top = max(ns)
    core = EngineCore(
        EngineArgs(
            model=str(path),
            dtype=args.dtype,
            quantization=quantization,
            num_threads=args.threads,
            max_num_seqs=top,
            max_num_batched_tokens=max(top * context, 512),
            max_model_len=context + steps + 16,
            kv_cache_memory="64MiB",
            enable_prefix_caching=False,
            batch_invariant=args.batch_invariant,
        )  # type: ignore[arg-type]
    )
    runner = core.runner
    dense = runner.dense_copies.nbytes if runner.dense_copies and runner.dense_copies.kept else 0
    load = Load(runner.choice.own or "transformers' modules", held_bytes(core), dense, {})
    params = SamplingParams(temperature=0.0, max_tokens=steps + 4, ignore_eos=True)
    generator = torch.Generator().manual_seed(1)
    for n in ns:
        for i in range(n):
            prompt = torch.randint(3, SHAPE["vocab_size"], (context,), generator=generator)
            core.add_request(EngineCoreRequest(f"{n}-{i}", prompt.tolist(), params))
        while core.scheduler.waiting or any(
            s.num_computed_tokens < s.num_prompt_tokens for s in core.scheduler.running
        ):
            core.step()
        times = []
        for _ in range(steps):
            start = clock()
            core.step()
            times.append(clock() - start)
        load.steps[n] = statistics.median(times)
        while core.has_work():
            core.step()
    del core, runner
    gc.collect()
    return load


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--families", default=",".join(FAMILIES), help="comma-separated")
    p.add_argument("--kind", default="Q4_0", help="the GGUF type of the matrices")
    p.add_argument("--ns", type=int, nargs="+", default=[1, 8], help="sequences decoding")
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--dtype", default="bfloat16", help="the activations' and dequantized dtype")
    p.add_argument(
        "--batch-invariant",
        default="off",
        help="for both loads (off: the steps differ only in the weights' format; under auto a "
        "dequantized file runs invariant where the start-up check passes, a quantized one not)",
    )
    p.add_argument("--out", type=Path, default=None, help="write the report here")
    args = p.parse_args()
    families = args.families.split(",")
    rows = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        for family in families:
            path = write_file(family, args.kind, Path(tmp))
            size = path.stat().st_size
            ran = {
                q: measure(path, q, args.ns, args.context, args.steps, args)
                for q in ("auto", "none")
            }
            rows.append((family, size, ran["auto"], ran["none"]))
            quant, deq = ran["auto"], ran["none"]
            print(
                f"{family}: file {size / 2**20:.1f} MiB, weights {quant.weights / 2**20:.1f} "
                f"/ {deq.weights / 2**20:.1f} MiB, steps "
                + ", ".join(
                    f"N={n} {quant.steps[n] * 1e3:.1f} / {deq.steps[n] * 1e3:.1f} ms"
                    for n in args.ns
                ),
                file=sys.stderr,
            )
            path.unlink()
    lines = report(rows, args, time.monotonic() - started)
    print("\n".join(lines))
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


def report(rows: list[tuple[str, int, Load, Load]], args: Any, seconds: float) -> list[str]:
    mib = 2**20
    lines = hostinfo.heading(
        "Quantized GGUF files of every family that serves quantized: memory and decode step",
        f"{seconds:.0f} s in all.",
    )
    lines += [
        "",
        f"Random weights of small real proportions (hidden 512, 4 layers, 8 heads over 4 KV "
        f"heads, vocabulary 8192; mixtures 8 experts top-2), every matrix in {args.kind} (the "
        f"token embedding too, as llama.cpp's quantize writes it), the norms float. Each file "
        f"loaded `--quantization auto` (its own formats) and `none` (dequantized to "
        f"{args.dtype}), activations {args.dtype}. weights: every weight the engine holds; "
        f"ratio: that over the file's size; dense copies: the cache kept for calls of many "
        f"rows (sized to the machine's free memory, not part of the model). Step: the median "
        f"of {args.steps} decode steps with N sequences of {args.context} tokens decoding, "
        f"CPU time of {args.threads} thread(s), batch invariance {args.batch_invariant} for "
        f"both; speed-up: dequantized over quantized.",
        "",
        "| family | forward | file (MiB) | quantized weights (MiB) | ratio to file | "
        "dense copies (MiB) | dequantized weights (MiB) | "
        + " | ".join(f"step N={n} quantized / dequantized (ms) | speed-up N={n}" for n in args.ns)
        + " |",
        "|---|---|---|---|---|---|---|" + "---|---|" * len(args.ns),
    ]
    for family, size, quant, deq in rows:
        cells = [
            family,
            quant.forward,
            f"{size / mib:.1f}",
            f"{quant.weights / mib:.1f}",
            f"{quant.weights / size:.2f}x",
            f"{quant.dense / mib:.1f}",
            f"{deq.weights / mib:.1f}",
        ]
        for n in args.ns:
            q, d = quant.steps[n], deq.steps[n]
            cells += [f"{q * 1e3:.1f} / {d * 1e3:.1f}", f"{d / q:.2f}x"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


if __name__ == "__main__":
    main()
