"""The engine's paths besides the float own forward, each run once on a GPU: quantized weights
and batch invariance (the generic path runs through bench/model_types/survey.py).

Quantized weights: a random-weight Llama (SmolLM2-135M's layer shapes, 4 layers) is started as
a user would start it, with `--quantization int8`, `int4` and `w8a8`, and what the engine says
is recorded. Their kernels are CPU ones, so the plan refuses them off the CPU; each is then
forced past that gate (the plan asked as if for a CPU) to see what the quantized forward does
on this device: its greedy tokens for 4 prompts against the same quantization on the CPU, or the
error it dies with. Beside it, the torch ops a CUDA quantized path could use, each on the
gate/up shapes of SmolLM2-135M and Llama-3.2-1B at 1, 32 and 256 rows: whether it runs here,
its largest error against the dequantized matrix in bf16, and its time against bf16
`F.linear`.

Batch invariance: `--batch-invariant on`, as a user would ask: what the engine says. Then the
default (auto) engine in bf16 with CUDA graphs: 32 greedy requests each alone, and all 32 in one
batch; how many of the 32 got the same tokens both ways.

On a CPU it runs the same code on a tiny shape (the forced runs then equal the plain ones); its
numbers say nothing about a GPU.

Usage: python bench/gpu/gpu_paths.py [--out bench/results/gpu_paths.md]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn.functional as F

from trio_llm.config import EngineArgs
from trio_llm.engine.models import quantized as quant
from trio_llm.engine.step.core import EngineCore
from trio_llm.ipc.messages import EngineCoreRequest
from trio_llm.sampling_params import SamplingParams

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))  # bench/: bench modules are imported by their path under it

import hostinfo  # noqa: E402

SHAPES = {
    # SmolLM2-135M's layers, fewer of them: the quantized path's shapes, not its depth, matter.
    "smollm2": dict(
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=4,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=64,
        vocab_size=49152,
    ),
    "tiny": dict(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        vocab_size=1024,
    ),
}
QUANTIZATIONS = ("int8", "int4", "w8a8")
ROWS = (1, 32, 256)


def build_model(shape: str, path: Path) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    if (path / "config.json").is_file():
        return path
    config = LlamaConfig(
        **SHAPES[shape],  # type: ignore[arg-type]
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        # Wide, so greedy picks are rarely near-ties that rounding could flip.
        initializer_range=0.2,
        bos_token_id=1,
        eos_token_id=2,
        architectures=["LlamaForCausalLM"],
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).eval().save_pretrained(path)
    return path


def greedy(core: EngineCore, prompts: list[list[int]], tokens: int) -> list[list[int]]:
    """Every prompt's greedy tokens, all submitted at once."""
    got: dict[str, list[int]] = {str(i): [] for i in range(len(prompts))}
    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        core.add_request(EngineCoreRequest(str(i), prompt, params))
    while core.has_work():
        for out in core.step().outputs:
            if out.error:
                raise RuntimeError(out.error)
            got[out.request_id] += out.new_token_ids
    return [got[str(i)] for i in range(len(prompts))]


def start(path: Path, device: str, **kwargs: object) -> EngineCore:
    kwargs.setdefault("kv_cache_memory", "64MiB")
    return EngineCore(EngineArgs(model=str(path), device=device, **kwargs))  # type: ignore[arg-type]


@contextmanager
def plan_as_if_cpu() -> Iterator[None]:
    """The quantization plan asked as if the engine ran on the CPU: past its device gate."""
    original = quant.plan

    def plan(quantization: str, source: object, config: object, device: str, impl: str):  # type: ignore[no-untyped-def]
        return original(quantization, source, config, "cpu", impl)  # type: ignore[arg-type]

    quant.plan = plan  # type: ignore[assignment]
    try:
        yield
    finally:
        quant.plan = original  # type: ignore[assignment]


def first_line(error: BaseException) -> str:
    text = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return f"{type(error).__name__}: {text[:300]}".replace("|", "/")


def free(core: object | None = None) -> None:
    del core
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def quantized_rows(path: Path, device: str, prompts: list[list[int]]) -> list[str]:
    rows = []
    for kind in QUANTIZATIONS:
        try:
            free(start(path, device, quantization=kind))
            said = "starts"
        except Exception as error:  # the refusal is what this records
            said = first_line(error)
        try:
            reference = greedy(start(path, "cpu", quantization=kind), prompts, 16)
        except Exception as error:
            rows.append(f"| {kind} | {said} | — | CPU run failed: {first_line(error)} |")
            continue
        core = None
        try:
            with plan_as_if_cpu():
                core = start(path, device, quantization=kind)
            got = greedy(core, prompts, 16)
            same = sum(a == b for a, b in zip(got, reference, strict=True))
            forced = f"runs: {same}/{len(prompts)} prompts' tokens equal the CPU's"
        except Exception as error:
            forced = first_line(error)
        free(core)
        rows.append(f"| {kind} | {said} | {forced} | |")
    return rows


def time_ms(fn: Callable[[], object], device: str) -> float:
    if device == "cuda":
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=10, rep=50, return_mode="median"))
    fn()
    runs = []
    for _ in range(5):
        t = time.perf_counter()
        fn()
        runs.append((time.perf_counter() - t) * 1e3)
    return statistics.median(runs)


Op = tuple[Callable[[torch.Tensor], torch.Tensor], torch.Tensor]


def op_candidates(w: torch.Tensor) -> dict[str, Callable[[], Op]]:
    """name -> a builder of (x -> x @ W', W' dequantized in bf16) for each quantized op torch
    might have on this device; a builder raises where its op is missing here."""
    wf = w.float()
    scales = wf.abs().amax(dim=1).clamp(min=1e-12) / 127.0
    q8 = torch.round(wf / scales[:, None]).clamp(-127, 127).to(torch.int8)
    deq8 = (q8.float() * scales[:, None]).to(torch.bfloat16)

    def int8pack() -> Op:
        s8 = scales.to(torch.bfloat16)
        return (lambda x: torch.ops.aten._weight_int8pack_mm(x, q8, s8)), deq8

    def int_mm() -> Op:
        def fn(x: torch.Tensor) -> torch.Tensor:
            x32 = x.float()
            step = x32.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127.0
            x8 = torch.round(x32 / step).to(torch.int8)
            if x8.shape[0] <= 16:  # cuBLASLt's int8 GEMM wants more than 16 rows
                x8 = F.pad(x8, (0, 0, 0, 17 - x8.shape[0]))
            y = torch._int_mm(x8, q8.t())[: x.shape[0]]
            return (y.float() * step * scales).to(torch.bfloat16)

        return fn, deq8

    def int4pack() -> Op:
        group = 32
        n, k = w.shape
        groups = wf.view(n, k // group, group)
        low, high = groups.amin(-1), groups.amax(-1)
        scale = ((high - low) / 15.0).clamp(min=1e-12)
        q4 = torch.round((groups - low[..., None]) / scale[..., None]).clamp(0, 15)
        zero = low + 8 * scale
        deq4 = ((q4 - 8) * scale[..., None] + zero[..., None]).view(n, k).to(torch.bfloat16)
        q4 = q4.view(n, k)
        sz = torch.stack([scale.t(), zero.t()], dim=-1).to(torch.bfloat16).contiguous()
        if w.device.type == "cuda":
            # tinygemm's layout: two values a byte, the inner dimension in tiles of 16 x tiles.
            tiles = next(t for t in (8, 4, 2) if k % (16 * t) == 0)
            q4u8 = (q4[:, ::2].to(torch.uint8) << 4) | q4[:, 1::2].to(torch.uint8)
            packed = torch.ops.aten._convert_weight_to_int4pack(q4u8.contiguous(), tiles)
            return (lambda x: torch.ops.aten._weight_int4pack_mm(x, packed, group, sz)), deq4
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q4.to(torch.int32), 1)
        return (lambda x: torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, group, sz)), deq4

    return {
        "_weight_int8pack_mm (int8 weight, bf16 act)": int8pack,
        "_int_mm (W8A8, int8 act per row)": int_mm,
        "_weight_int4pack_mm (int4 groups of 32, bf16 act)": int4pack,
    }


def op_rows(device: str) -> list[str]:
    """The quantized ops on gate/up matrices ([2 * intermediate, hidden]) of two models."""
    shapes = {"SmolLM2-135M": (3072, 576), "Llama-3.2-1B": (16384, 2048)}
    if device == "cpu":
        shapes = {"tiny": (512, 128)}
    gen = torch.Generator(device="cpu").manual_seed(0)
    rows = []
    for model, (n, k) in shapes.items():
        w = (torch.randn(n, k, generator=gen) * 0.05).to(device=device, dtype=torch.bfloat16)
        for name, build in op_candidates(w).items():
            try:
                fn, deq = build()
            except Exception as error:  # the op, or its packing, is missing here
                rows.append(f"| {model} | {name} | | {first_line(error)} | | |")
                continue
            for m in ROWS:
                x = torch.randn(m, k, generator=gen).to(device=device, dtype=torch.bfloat16)
                try:
                    y = fn(x)
                    ref = F.linear(x.float(), deq.float())
                    err = (y.float() - ref).abs().max().item() / ref.abs().max().item()
                    ms = time_ms(lambda fn=fn, x=x: fn(x), device)
                    base = time_ms(lambda x=x, w=w: F.linear(x, w), device)
                    rows.append(
                        f"| {model} | {name} | {m} | {err:.1e} | {ms * 1e3:.1f} us "
                        f"| {base * 1e3:.1f} us ({base / ms:.2f}x) |"
                    )
                except Exception as error:
                    rows.append(f"| {model} | {name} | {m} | {first_line(error)} | | |")
                    break
    return rows


def invariance_lines(path: Path, device: str, prompts: list[list[int]]) -> list[str]:
    lines = []
    try:
        free(start(path, device, batch_invariant="on"))
        lines.append("- `--batch-invariant on`: the engine starts.")
    except Exception as error:
        lines.append(f"- `--batch-invariant on`: {first_line(error)}")
    dtype = "bfloat16" if device == "cuda" else "float32"
    core = start(path, device, dtype=dtype, max_num_seqs=len(prompts))
    lines.append(f"- `auto` ({dtype}): batch invariance {core.runner.invariance.describe()}.")
    alone = [greedy(core, [p], 32)[0] for p in prompts]
    together = greedy(core, prompts, 32)
    same = sum(a == b for a, b in zip(alone, together, strict=True))
    lines.append(
        f"- {len(prompts)} greedy requests of 32 tokens, each alone and all in one batch "
        f"({dtype}, {'CUDA graphs' if device == 'cuda' else 'eager'}): {same}/{len(prompts)} "
        "the same both ways."
    )
    free(core)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/trio-gpu-paths"))
    parser.add_argument("--out", type=Path, default=BENCH / "results" / "gpu_paths.md")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    shape = "smollm2" if cuda else "tiny"
    if not cuda:
        torch.set_num_threads(1)
    started = time.perf_counter()
    path = build_model(shape, args.workdir / shape)
    vocab = int(SHAPES[shape]["vocab_size"])
    gen = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(3, vocab, (int(length),), generator=gen).tolist()
        for length in torch.randint(4, 60, (32,), generator=gen)
    ]
    if cuda:
        props = torch.cuda.get_device_properties(0)
        machine = f"{props.name}, torch {torch.__version__}, CUDA {torch.version.cuda}"
    else:
        machine = f"CPU only ({hostinfo.describe()}), torch {torch.__version__}"
    report = [
        "# The engine's other paths on a GPU: quantized weights, batch invariance",
        "",
        f"Command: `{hostinfo.command()}`. Device: {machine}.",
        "",
        __doc__.split("\n\n", 1)[1].split("\n\nOn a CPU")[0],
        "",
        *([] if cuda else ["**No GPU in this run**: the CPU proof run (tiny shape).", ""]),
        f"## Quantized weights ({shape} shape)",
        "",
        "| quantization | started as a user would | forced past the CPU gate | |",
        "| --- | --- | --- | --- |",
        *quantized_rows(path, device, prompts[:4]),
        "",
        "| gate/up of | op | rows | max error / max | time | bf16 F.linear (op speed-up) |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
        *op_rows(device),
        "",
        "## Batch invariance",
        "",
        *invariance_lines(path, device, prompts),
        "",
        f"Run took {time.perf_counter() - started:.0f} s. Written by bench/gpu/gpu_paths.py.",
        "",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(report))
    print("\n".join(report))


if __name__ == "__main__":
    main()
