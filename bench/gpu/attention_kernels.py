"""Decode attention's achieved bandwidth: the Triton kernel against a torch baseline (gather the
paged K/V, then `F.scaled_dot_product_attention`), side by side in one run.

    python bench/gpu/attention_kernels.py           # CUDA: correctness pass, batch x context grid
    python bench/gpu/attention_kernels.py --sweep   # CUDA: launch shapes at the target point only
    python bench/gpu/attention_kernels.py --device cpu --quick
                                # CPU: baseline timed, kernels interpreted for correctness,
                                # and the sm_90 compile report

Bandwidth counts the bytes decode must move at least once: each sequence's K and V, the query,
the output, its block-table row and its length. Both columns divide the same bytes by their own
time, so their ratio is the speedup. On CUDA, times are `triton.testing.do_bench` medians (L2
flushed before every call, eager launches); on CPU, medians of wall-clock runs. Results go to
--out as markdown (default bench/results/attention_kernels.md) with the machine they ran on.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from threadpoolctl import threadpool_limits

from trio_llm import kernels
from trio_llm.kernels import DecodeConfig, decode_config

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))  # bench/: bench modules are imported by their path under it

import hostinfo  # noqa: E402

# Vendor datasheet HBM bandwidth (bytes/s), matched against torch.cuda.get_device_name().
PEAK_BANDWIDTH = {"H200": 4.8e12, "H100": 3.35e12, "A100": 2.0e12}
TARGET = {"batch": 64, "context": 4096, "head_dim": 64, "share_of_peak": 0.60}
# Largest |Triton - torch baseline| accepted before a timing counts: both round to the output
# dtype (bf16 by default), so a few ulps of values of order 1.
AGREEMENT = 5e-2


@dataclass(frozen=True)
class Shape:
    name: str
    num_heads: int
    num_kv_heads: int
    head_dim: int


SHAPES = [
    Shape("SmolLM2-135M (9q/3kv, d64)", 9, 3, 64),
    Shape("GQA 32q/8kv, d64", 32, 8, 64),
    Shape("GQA 32q/8kv, d128", 32, 8, 128),
]


@dataclass
class Problem:
    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_tables: torch.Tensor
    context_lens: torch.Tensor
    context: int
    scale: float

    def args(self) -> tuple[torch.Tensor, ...]:
        return (self.q, self.k_cache, self.v_cache, self.block_tables, self.context_lens)

    def min_bytes(self) -> int:
        kv = 2 * self.context_lens.sum().item() * self.k_cache[0, 0].numel()
        io = 2 * self.q.numel()
        elt = self.q.element_size()
        return (kv + io) * elt + self.block_tables.numel() * 4 + self.context_lens.numel() * 4


def make_problem(
    shape: Shape, batch: int, context: int, block_size: int, dtype: torch.dtype, device: str
) -> Problem:
    """Every sequence `context` long, its blocks scattered at random over the cache."""
    gen = torch.Generator(device=device).manual_seed(batch * 100_003 + context)
    per_seq = -(-context // block_size)
    num_blocks = batch * per_seq
    cache_shape = (num_blocks, block_size, shape.num_kv_heads, shape.head_dim)
    k_cache = torch.randn(cache_shape, generator=gen, device=device, dtype=dtype)
    v_cache = torch.randn(cache_shape, generator=gen, device=device, dtype=dtype)
    order = torch.randperm(num_blocks, generator=gen, device=device)
    tables = order.view(batch, per_seq).to(torch.int32)
    q = torch.randn(batch, shape.num_heads, shape.head_dim, generator=gen, device=device)
    return Problem(
        q.to(dtype),
        k_cache,
        v_cache,
        tables,
        torch.full((batch,), context, dtype=torch.int32, device=device),
        context,
        shape.head_dim**-0.5,
    )


def torch_decode(p: Problem) -> torch.Tensor:
    """What a torch backend does: gather each sequence's blocks contiguous, then SDPA (GQA
    through enable_gqa). All sequences share one length here, so no mask is needed."""
    batch, num_heads, head_dim = p.q.shape
    k = p.k_cache[p.block_tables.long()].flatten(1, 2)[:, : p.context].transpose(1, 2)
    v = p.v_cache[p.block_tables.long()].flatten(1, 2)[:, : p.context].transpose(1, 2)
    out = F.scaled_dot_product_attention(p.q[:, :, None], k, v, scale=p.scale, enable_gqa=True)
    return out.view(batch, num_heads, head_dim)


def time_ms(fn: Callable[[], object], device: str, cpu_runs: int = 5) -> float:
    if device == "cuda":
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))
    fn()
    runs = []
    for _ in range(cpu_runs):
        start = time.perf_counter()
        fn()
        runs.append((time.perf_counter() - start) * 1e3)
    return statistics.median(runs)


def graph_ms(fn: Callable[[], object]) -> float:
    """Median ms of `fn` replayed from a CUDA graph: the kernels' time without the Python launch
    cost, as the engine's decode steps run (cuda_graphs.py). No L2 flush between replays, so a
    problem that fits in L2 reads from it (such rows are marked)."""
    from triton.testing import do_bench_cudagraph

    return float(do_bench_cudagraph(fn, rep=100, return_mode="median"))


def copy_bandwidth(device: str) -> float:
    """Bytes/s of a 2 GiB device-to-device copy, read plus written: the ceiling measured here."""
    src = torch.empty(1 << 30, dtype=torch.float16, device=device).normal_()
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), device)
    return 2 * src.numel() * src.element_size() / (ms * 1e-3)


def machine(device: str) -> list[str]:
    cpu = hostinfo.cpu_name()
    lines = [
        f"- date: {datetime.datetime.now(datetime.UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- CPU: {cpu}, {os.cpu_count()} cores",
        f"- python {platform.python_version()}, torch {torch.__version__}, "
        f"triton {_triton_version()}",
    ]
    if device == "cpu":
        lines.append("- torch and BLAS limited to 1 thread")
    if hasattr(os, "getloadavg"):
        lines.append(
            f"- load average at start (other work on this machine): {os.getloadavg()[0]:.1f}"
        )
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        lines.append(
            f"- GPU: {props.name}, {props.multi_processor_count} SMs, "
            f"{props.total_memory / 2**30:.0f} GiB"
        )
    return lines


def _triton_version() -> str:
    import triton

    return triton.__version__


def peak_bandwidth(device: str, override_tbs: float | None) -> float | None:
    if override_tbs:
        return override_tbs * 1e12
    if device != "cuda":
        return None
    name = torch.cuda.get_device_name(0)
    return next((bw for key, bw in PEAK_BANDWIDTH.items() if key in name), None)


def max_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


# --- correctness ---------------------------------------------------------------------------------


def correctness(device: str, quick: bool) -> list[str]:
    """Kernel against reference on a few sampled problems per dtype (the tests cover the full
    pairwise grid): the largest absolute error and the relative L2 error of each."""
    gen = torch.Generator().manual_seed(0)
    rows = []
    cases = [(Shape("9q/3kv d64", 9, 3, 64), 16), (Shape("32q/8kv d128", 32, 8, 128), 32)]
    lengths = [1, 15, 16, 17, 300] if quick else [1, 15, 16, 17, 300, 1023, 2048, 4097]
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for shape, block_size in cases:
            if quick and shape.head_dim == 128 and dtype != torch.bfloat16:
                continue
            needed = [-(-n // block_size) for n in lengths]
            cache_shape = (sum(needed), block_size, shape.num_kv_heads, shape.head_dim)
            k_cache = torch.randn(cache_shape, generator=gen).to(dtype).to(device)
            v_cache = torch.randn(cache_shape, generator=gen).to(dtype).to(device)
            tables = torch.zeros(len(lengths), max(needed), dtype=torch.int32)
            order = torch.randperm(sum(needed), generator=gen)
            used = 0
            for b, n in enumerate(needed):
                tables[b, :n] = order[used : used + n]
                used += n
            tables = tables.to(device)
            lens = torch.tensor(lengths, dtype=torch.int32, device=device)
            q = torch.randn(len(lengths), shape.num_heads, shape.head_dim, generator=gen)
            q = q.to(dtype).to(device)
            args = (q, k_cache, v_cache, tables, lens, shape.head_dim**-0.5)
            rows.append(_error_row("decode", shape, block_size, dtype, lengths, args))
            q_lens = [min(n, 64) for n in lengths]
            cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
            qp = torch.randn(sum(q_lens), shape.num_heads, shape.head_dim, generator=gen)
            pargs = (qp.to(dtype).to(device), k_cache, v_cache, tables, cu.to(device), lens)
            rows.append(
                _error_row("prefill", shape, block_size, dtype, lengths, (*pargs, args[-1]))
            )
    header = [
        "| kernel | shape | block | dtype | contexts | max abs err | rel L2 err |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    return header + rows


def _error_row(
    kind: str,
    shape: Shape,
    block_size: int,
    dtype: torch.dtype,
    lengths: list[int],
    args: tuple,
) -> str:
    fn, ref = (
        (kernels.decode_attention, kernels.decode_attention_ref)
        if kind == "decode"
        else (kernels.prefill_attention, kernels.prefill_attention_ref)
    )
    out, expect = fn(*args).float(), ref(*args).float()
    rel = ((out - expect).norm() / expect.norm()).item()
    contexts = ",".join(map(str, lengths))
    name = str(dtype).removeprefix("torch.")
    return (
        f"| {kind} | {shape.name} | {block_size} | {name} | {contexts} "
        f"| {max_error(out, expect):.2e} | {rel:.2e} |"
    )


# --- bandwidth grid ------------------------------------------------------------------------------


def bandwidth_grid(
    device: str, dtype: torch.dtype, quick: bool, peak: float | None
) -> tuple[list[str], dict[str, float]]:
    shapes = SHAPES[:1] if quick else SHAPES
    batches = [1, 4] if quick else [1, 16, 64, 256]
    contexts = [256, 1024] if quick else [1024, 4096, 16384]
    interpreted = device != "cuda"
    header = [
        "| shape | batch | context | splits | MB moved | triton us | triton GB/s | % peak "
        "| graph us | graph GB/s | graph % peak | torch us | torch GB/s | speedup "
        "| max abs diff |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
        "| ---: | ---: | ---: |",
    ]
    l2 = torch.cuda.get_device_properties(0).L2_cache_size if device == "cuda" else 0
    rows, at_target = [], {}
    for shape in shapes:
        for batch in batches:
            for context in contexts:
                p = make_problem(shape, batch, context, 16, dtype, device)
                splits = decode_config(
                    batch, shape.num_kv_heads, p.block_tables.shape[1] * 16, p.q.device
                ).num_splits
                diff = max_error(kernels.decode_attention(*p.args(), p.scale), torch_decode(p))
                agrees = diff <= AGREEMENT
                nbytes = p.min_bytes()
                base_ms = time_ms(lambda p=p: torch_decode(p), device)
                base_gbs = nbytes / (base_ms * 1e-3) / 1e9
                if interpreted:
                    tri = "interp. | — | — | — | — | —"
                    speed = "—"
                else:
                    ms = time_ms(lambda p=p: kernels.decode_attention(*p.args(), p.scale), device)
                    gms = graph_ms(lambda p=p: kernels.decode_attention(*p.args(), p.scale))
                    gbs, ggbs = (nbytes / (t * 1e-3) / 1e9 for t in (ms, gms))
                    share = f"{100 * gbs * 1e9 / peak:.0f}%" if peak else "—"
                    gshare = f"{100 * ggbs * 1e9 / peak:.0f}%" if peak else "—"
                    if nbytes < 2 * l2:
                        gshare += " (L2)"
                    tri = f"{ms * 1e3:.1f} | {gbs:.0f} | {share} | {gms * 1e3:.1f} | {ggbs:.0f} "
                    tri += f"| {gshare}"
                    speed = f"{base_ms / ms:.2f}x"
                    if agrees and (batch, context, shape.head_dim) == (
                        TARGET["batch"],
                        TARGET["context"],
                        TARGET["head_dim"],
                    ):
                        at_target[shape.name] = (gbs * 1e9, ggbs * 1e9)
                rows.append(
                    f"| {shape.name} | {batch} | {context} | {splits} | {nbytes / 1e6:.1f} "
                    f"| {tri} | {base_ms * 1e3:.1f} | {base_gbs:.0f} | {speed} "
                    f"| {diff:.1e}{'' if agrees else ' WRONG'} |"
                )
                del p
                if device == "cuda":
                    torch.cuda.empty_cache()
    return header + rows, at_target


# --- prefill attention ------------------------------------------------------------------------


def prefill_problem(
    shape: Shape, batch: int, length: int, dtype: torch.dtype, device: str
) -> tuple[tuple[torch.Tensor, ...], torch.Tensor, torch.Tensor, torch.Tensor]:
    """`batch` whole prompts of `length` tokens, their K/V written at scattered blocks: the
    kernel's arguments, and the same queries, keys and values contiguous ([B, H, L, D]) for
    SDPA."""
    block_size = 16
    gen = torch.Generator(device=device).manual_seed(batch * 7 + length)
    per_seq = -(-length // block_size)
    num_blocks = batch * per_seq
    k = torch.randn(batch, length, shape.num_kv_heads, shape.head_dim, generator=gen, device=device)
    v = torch.randn(batch, length, shape.num_kv_heads, shape.head_dim, generator=gen, device=device)
    q = torch.randn(batch, length, shape.num_heads, shape.head_dim, generator=gen, device=device)
    k, v, q = k.to(dtype), v.to(dtype), q.to(dtype)
    cache_shape = (num_blocks, block_size, shape.num_kv_heads, shape.head_dim)
    k_cache = torch.zeros(cache_shape, dtype=dtype, device=device)
    v_cache = torch.zeros(cache_shape, dtype=dtype, device=device)
    tables = torch.randperm(num_blocks, generator=gen, device=device).view(batch, per_seq)
    pos = torch.arange(length, device=device)
    slots = (tables[:, pos // block_size] * block_size + pos % block_size).reshape(-1)
    kernels.write_kv(k.flatten(0, 1), v.flatten(0, 1), k_cache, v_cache, slots)
    cu = torch.arange(batch + 1, device=device, dtype=torch.int32) * length
    lens = torch.full((batch,), length, dtype=torch.int32, device=device)
    args = (q.flatten(0, 1), k_cache, v_cache, tables.to(torch.int32), cu, lens)
    return args, q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)


def prefill_grid(device: str, dtype: torch.dtype, quick: bool) -> list[str]:
    """Causal prefill TFLOP/s of the Triton kernel beside SDPA on the same (contiguous) q/k/v:
    4 * B * Hq * L^2 / 2 * D flops (QK^T and PV, the causal half)."""
    shapes = SHAPES[:1] if quick else SHAPES
    cases = [(1, 512), (4, 1024)] if quick else [(1, 1024), (1, 4096), (8, 1024), (4, 4096)]
    rows = [
        "| shape | batch | prompt | triton ms | triton TFLOP/s | SDPA ms | SDPA TFLOP/s "
        "| triton / SDPA | max abs diff |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for shape in shapes:
        for batch, length in cases:
            args, q, k, v = prefill_problem(shape, batch, length, dtype, device)
            scale = shape.head_dim**-0.5

            def sdpa(
                q: torch.Tensor = q, k: torch.Tensor = k, v: torch.Tensor = v, scale: float = scale
            ) -> torch.Tensor:
                return F.scaled_dot_product_attention(
                    q, k, v, is_causal=True, scale=scale, enable_gqa=True
                )

            ref = sdpa().transpose(1, 2).flatten(0, 1)
            diff = max_error(kernels.prefill_attention(*args, scale), ref)
            flops = 4 * batch * shape.num_heads * length * length / 2 * shape.head_dim
            sdpa_ms = time_ms(sdpa, device)
            tri_ms = time_ms(
                lambda args=args, scale=scale: kernels.prefill_attention(*args, scale), device
            )
            rows.append(
                f"| {shape.name} | {batch} | {length} | {tri_ms:.3f} "
                f"| {flops / tri_ms / 1e9:.0f} | {sdpa_ms:.3f} | {flops / sdpa_ms / 1e9:.0f} "
                f"| {sdpa_ms / tri_ms:.2f}x | {diff:.1e}{'' if diff <= AGREEMENT else ' WRONG'} |"
            )
            del args, q, k, v
            if device == "cuda":
                torch.cuda.empty_cache()
    return rows


# --- launch-shape sweep at the target point -----------------------------------------------------


def sweep(device: str, dtype: torch.dtype, peak: float | None) -> list[str]:
    """Around the heuristic's choice at the target point: the split count with default tiles,
    then tile width x warps x pipeline stages with the default split count."""
    header = [
        "| shape | block_n | warps | stages | splits | triton us | GB/s | % peak |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    rows = []
    for shape in SHAPES[:2]:
        p = make_problem(shape, TARGET["batch"], TARGET["context"], 16, dtype, device)
        chosen = decode_config(
            TARGET["batch"], shape.num_kv_heads, p.block_tables.shape[1] * 16, p.q.device
        )
        configs = [DecodeConfig(num_splits=s) for s in (1, 2, 4, 8, 16, 32)]
        configs += [
            DecodeConfig(block_n=n, num_warps=w, num_stages=st, num_splits=chosen.num_splits)
            for n in (32, 64, 128)
            for w in (4, 8)
            for st in (2, 3)
        ]
        expect = torch_decode(p)
        nbytes = p.min_bytes()
        for cfg in configs:
            out = kernels.decode_attention(*p.args(), p.scale, config=cfg)
            if max_error(out, expect) > AGREEMENT:
                rows.append(
                    f"| {shape.name} | {cfg.block_n} | {cfg.num_warps} | {cfg.num_stages} "
                    f"| {cfg.num_splits} | WRONG RESULT | | |"
                )
                continue
            ms = time_ms(
                lambda cfg=cfg, p=p: kernels.decode_attention(*p.args(), p.scale, config=cfg),
                device,
            )
            gbs = nbytes / (ms * 1e-3) / 1e9
            share = f"{100 * gbs * 1e9 / peak:.0f}%" if peak else "—"
            mark = " (default)" if cfg == chosen else ""
            rows.append(
                f"| {shape.name} | {cfg.block_n} | {cfg.num_warps} | {cfg.num_stages} "
                f"| {cfg.num_splits}{mark} | {ms * 1e3:.1f} | {gbs:.0f} | {share} |"
            )
        del p
        torch.cuda.empty_cache()
    return header + rows


# --- static sm_90 compile report (no GPU needed) -------------------------------------------------


def sm90_report() -> list[str]:
    """Compile the kernels for sm_90 here (Triton ships ptxas and cuobjdump) and read what costs
    no device time: registers, spilled bytes, shared memory, and which loads and matrix
    instructions the SASS holds (LDGSTS.128: 16-byte async copies; HGMMA: Hopper wgmma)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from trio_llm.kernels import _triton as impl

    if not isinstance(impl.decode_kernel, triton.runtime.JITFunction):
        return ["(skipped: the kernels were loaded interpreted in this process)"]
    tools = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"

    def compile_one(fn: object, args: dict, num_warps: int, num_stages: int) -> str:
        sig, consts, attrs = {}, {}, {}
        for i, name in enumerate(fn.arg_names):
            value = args[name]
            if fn.params[i].is_constexpr:
                sig[name], consts[name] = "constexpr", value
            elif isinstance(value, str):
                sig[name], attrs[(i,)] = "*" + value, [["tt.divisibility", 16]]
            elif isinstance(value, float):
                sig[name] = "fp32"
            else:
                sig[name] = "i32"
                if value % 16 == 0:
                    attrs[(i,)] = [["tt.divisibility", 16]]
        options = {"num_warps": num_warps, "num_stages": num_stages}
        compiled = triton.compile(
            ASTSource(fn, sig, consts, attrs), target=GPUTarget("cuda", 90, 32), options=options
        )
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(compiled.asm["cubin"])
            f.flush()
            res = _run([str(tools / "cuobjdump"), "--dump-resource-usage", f.name])
            sass = _run([str(tools / "cuobjdump"), "--dump-sass", f.name])
        regs = re.search(r"REG:(\d+)", res)
        stack = re.search(r"STACK:(\d+)", res)
        ops = re.findall(r"\b(LDGSTS\.E\.BYPASS\.128|LDG\.E\.128|HGMMA|HMMA)", sass)
        counts = ", ".join(f"{op} x{ops.count(op)}" for op in sorted(set(ops))) or "none"
        return (
            f"{regs.group(1) if regs else '?'} | {stack.group(1) if stack else '?'} "
            f"| {compiled.metadata.shared} | {counts}"
        )

    rows = [
        "| kernel | dtype | d | group | tile | warps/stages | registers | stack (spill) bytes "
        "| shared bytes | wide loads / matrix ops in SASS |",
        "| --- | --- | ---: | ---: | --- | --- | ---: | ---: | ---: | --- |",
    ]
    for dtype, d, group, hkv in (("bf16", 64, 3, 3), ("bf16", 128, 4, 8), ("fp32", 64, 8, 1)):
        cfg = DecodeConfig()
        args = _decode_args(dtype, d, group, hkv, cfg.block_n, 4)
        usage = compile_one(impl.decode_kernel, args, cfg.num_warps, cfg.num_stages)
        rows.append(
            f"| decode | {dtype} | {d} | {group} | {cfg.block_n} tokens "
            f"| {cfg.num_warps}/{cfg.num_stages} | {usage} |"
        )
    for dtype, d, group, hkv in (("bf16", 64, 3, 3), ("bf16", 128, 4, 8), ("fp32", 128, 1, 8)):
        cfg = kernels.prefill_config(torch.float32 if dtype == "fp32" else torch.bfloat16)
        args = _prefill_args(dtype, d, group, hkv, cfg.block_m, cfg.block_n)
        usage = compile_one(impl.prefill_kernel, args, cfg.num_warps, cfg.num_stages)
        rows.append(
            f"| prefill | {dtype} | {d} | {group} | {cfg.block_m}x{cfg.block_n} "
            f"| {cfg.num_warps}/{cfg.num_stages} | {usage} |"
        )
    return rows


def _run(cmd: list[str]) -> str:
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout


def _decode_args(dtype: str, d: int, group: int, hkv: int, block_n: int, splits: int) -> dict:
    page = 16
    return dict(
        q_ptr=dtype,
        k_cache_ptr=dtype,
        v_cache_ptr=dtype,
        block_tables_ptr="i32",
        context_lens_ptr="i32",
        out_ptr=dtype,
        part_acc_ptr="fp32",
        part_ml_ptr="fp32",
        scale_log2=0.18,
        stride_qb=group * hkv * d,
        stride_qh=d,
        stride_kb=page * hkv * d,
        stride_kt=hkv * d,
        stride_kh=d,
        stride_vb=page * hkv * d,
        stride_vt=hkv * d,
        stride_vh=d,
        stride_tb=256,
        stride_ob=group * hkv * d,
        stride_oh=d,
        num_heads=group * hkv,
        split_len=512,
        num_splits=splits,
        HEAD_DIM=d,
        GROUP=group,
        BLOCK_G=max(16, 1 << (group - 1).bit_length()),
        BLOCK_D=d,
        BLOCK_N=block_n,
        PAGE=page,
        SPLIT=splits > 1,
        DOT_PRECISION="ieee" if dtype == "fp32" else "tf32",
        UPCAST=False,
    )


def _prefill_args(dtype: str, d: int, group: int, hkv: int, block_m: int, block_n: int) -> dict:
    page = 16
    block_m = max(block_m, 1 << (group - 1).bit_length())
    return dict(
        q_ptr=dtype,
        k_cache_ptr=dtype,
        v_cache_ptr=dtype,
        block_tables_ptr="i32",
        cu_seqlens_q_ptr="i32",
        context_lens_ptr="i32",
        out_ptr=dtype,
        scale_log2=0.18,
        stride_qt=group * hkv * d,
        stride_qh=d,
        stride_kb=page * hkv * d,
        stride_kt=hkv * d,
        stride_kh=d,
        stride_vb=page * hkv * d,
        stride_vt=hkv * d,
        stride_vh=d,
        stride_tb=256,
        stride_ot=group * hkv * d,
        stride_oh=d,
        num_seqs=3,
        HEAD_DIM=d,
        GROUP=group,
        BLOCK_Q=block_m // group,
        BLOCK_M=block_m,
        BLOCK_D=d,
        BLOCK_N=block_n,
        PAGE=page,
        DOT_PRECISION="ieee" if dtype == "fp32" else "tf32",
        UPCAST=False,
    )


# --- main ---------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default=None)
    parser.add_argument("--quick", action="store_true", help="a reduced grid")
    parser.add_argument(
        "--sweep", action="store_true", help="only time launch shapes at the target point (CUDA)"
    )
    parser.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default=None)
    parser.add_argument("--peak-tbs", type=float, default=None, help="peak bandwidth, TB/s")
    parser.add_argument("--out", type=Path, default=BENCH / "results" / "attention_kernels.md")
    args = parser.parse_args()
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda, but torch sees no CUDA device")
    if args.sweep and device != "cuda":
        parser.error("--sweep times compiled kernels: it needs --device cuda")
    if device == "cpu":
        # The kernels load (and Triton imports) on first call; on CPU they must be interpreted.
        os.environ["TRITON_INTERPRET"] = "1"
        # One thread for torch and for numpy's BLAS (the interpreter's tl.dot): on a shared
        # 2-core machine their spinning thread pools made runs up to 300x slower and erratic.
        torch.set_num_threads(1)
        threadpool_limits(1, user_api="blas")
    dtype = getattr(torch, args.dtype or ("bfloat16" if device == "cuda" else "float32"))
    peak = peak_bandwidth(device, args.peak_tbs)
    interpreted = device != "cuda"

    out = ["# Kernels: paged decode attention", ""]
    out += [f"Command: `{hostinfo.command()}`", "", *machine(device), ""]
    if interpreted:
        out += [
            "**GPU figures: pending.** This run had no GPU: the torch baseline is timed on CPU, "
            "the Triton kernels ran in Triton's CPU interpreter (correctness only; interpreter "
            "times say nothing about the GPU). `bench/gpu/gpu_check.sh` takes the GPU figures.",
            "",
        ]
    else:
        ceiling = copy_bandwidth(device)
        peak_text = f"{peak / 1e12:.2f} TB/s (datasheet)" if peak else "unknown"
        out += [
            f"Peak HBM bandwidth: {peak_text}; device-to-device copy measured here: "
            f"{ceiling / 1e12:.2f} TB/s (bytes read + written).",
            "",
        ]

    started = time.perf_counter()
    if args.sweep:
        out += ["## Launch shapes at the target point", "", *sweep(device, dtype, peak), ""]
    else:
        out += report(device, dtype, args.quick, peak)
    out.append(f"Run took {time.perf_counter() - started:.0f} s.")
    text = "\n".join(out) + "\n"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)


def report(device: str, dtype: torch.dtype, quick: bool, peak: float | None) -> list[str]:
    """Correctness, the bandwidth grid and the target verdict; on CPU the sm_90 compile report."""
    interpreted = device != "cuda"
    out: list[str] = []
    out += [
        "## Correctness: kernels against their torch references",
        "",
        f"Kernels {'interpreted on CPU' if interpreted else 'compiled, on ' + device}; "
        "references gather and compute in fp32. Test tolerances (tests/kernels): "
        "fp32 1e-4, fp16 5e-3, bf16 3e-2 (atol = rtol).",
        "",
        *correctness(device, quick),
        "",
    ]
    grid, at_target = bandwidth_grid(device, dtype, quick, peak)
    name = str(dtype).removeprefix("torch.")
    out += [
        f"## Decode attention bandwidth ({name}, cache block size 16)",
        "",
        "MB moved: the least decode must read and write. `splits`: the context split count "
        "the heuristic picks. `triton` and `torch`: eager calls (do_bench, L2 flushed), Python's "
        "launch cost included; `graph`: the same Triton call replayed from a CUDA graph, as the "
        "engine's decode steps run, its kernels' time alone ((L2): the problem is under twice "
        "the L2 cache, which replays may read from). `max abs diff`: Triton against the torch "
        f"baseline on this problem (WRONG above {AGREEMENT}; such a row's timing is not used for "
        "the target).",
        "",
        *grid,
        "",
    ]
    if not interpreted:
        out += [
            f"## Prefill attention ({name}, whole causal prompts, cache block size 16)",
            "",
            "TFLOP/s count the causal half of QK^T and PV. SDPA runs on the same queries, keys "
            "and values laid out contiguous (no paged gather): the dense ceiling.",
            "",
            *prefill_grid(device, dtype, quick),
            "",
        ]
    if at_target and peak:
        out += ["## Target", ""]
        for shape_name, (bw, graph_bw) in at_target.items():
            verdict = "met" if graph_bw >= TARGET["share_of_peak"] * peak else "NOT met"
            out.append(
                f"- {shape_name}: batch {TARGET['batch']}, context {TARGET['context']}: "
                f"replayed from a graph {graph_bw / 1e9:.0f} GB/s = {100 * graph_bw / peak:.0f}% "
                f"of peak (target {100 * TARGET['share_of_peak']:.0f}%): {verdict}; eager "
                f"{bw / 1e9:.0f} GB/s = {100 * bw / peak:.0f}%"
            )
        out.append("")
    if interpreted:
        out += [
            "## sm_90 compile report (compiled here, no GPU)",
            "",
            "Default launch shapes; a decode program handles one (sequence, KV head, split).",
            "",
            *sm90_report_in_subprocess(),
            "",
        ]
    return out


def sm90_report_in_subprocess() -> list[str]:
    """The interpreter is fixed per process at Triton's import, so the compiled report runs in
    a child process with TRITON_INTERPRET=0."""
    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_DEFAULT_FP_FUSION": "1"}
    code = "from gpu import attention_kernels; print('\\n'.join(attention_kernels.sm90_report()))"
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=BENCH,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout.strip().splitlines()


if __name__ == "__main__":
    main()
