"""The strip kernel for plain bf16 weights (engine/ops/bf16_rows.py) against the plan it replaces
under batch invariance (on AVX512-BF16 without AMX oneDNN's inner product on reordered weights,
a lone row padded to two; with AMX oneDNN in calls of at most 32 rows), by rows per call, on
the default model's matmul shapes; where the kernel takes AMX tiles, its `vdpbf16ps` chains
(what it runs without AMX) and oneDNN's whole calls (the plan without invariance) beside
them; with
`--dtype float32`, the float32 strip kernel (engine/ops/f32_rows.py) against float32's plan
(oneDNN's inner product on reordered weights, inner dimensions split at 1,024).

Each case multiplies --matrices distinct matrices of the shape in turn (a model's layers), so
each call reads its weight from memory rather than from a cache the call before warmed, which
is what a decode step does: a lone row is bound by reading the weights. The two variants take
turns call by call (timing.py's `medians_us`), so drift on a shared VM falls on both
alike; medians of --repeats passes, per matrix. The LM head is one matrix (the model has one).

Usage: python bench/weights/bf16_rows.py [--dtype bfloat16|float32] [--threads 2] [--repeats 7]
       [--matrices 30] [--out bench/results/bf16_rows.md (f32_rows.md for float32)]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from trio_llm.engine.ops import bf16_rows, f32_rows, int4_rows
from trio_llm.engine.ops.bf16_rows import StripWeight
from trio_llm.engine.ops.f32_rows import F32StripWeight
from trio_llm.engine.ops.matmul import BF16_AMX, BF16_AVX512, FP32_ONEDNN, PACKED, Matmul

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))  # bench/: bench modules are imported by their path under it

import hostinfo  # noqa: E402
from timing import medians_us  # noqa: E402
from weights.quant_kernels import SHAPES  # noqa: E402

ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 512)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--matrices", type=int, default=30)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    f32 = dtype is torch.float32
    if not (f32_rows.available() if f32 else bf16_rows.available()):
        raise SystemExit("the strip kernel is not built here (no C++ compiler)")
    tiles = not f32 and bf16_rows.tiles()
    onednn = Matmul(FP32_ONEDNN if f32 else BF16_AMX if tiles else BF16_AVX512)
    whole = Matmul(PACKED)
    ext = int4_rows.KERNEL.extension()
    pack = F32StripWeight.pack if f32 else StripWeight.pack
    out = args.out or BENCH / "results" / ("f32_rows.md" if f32 else "bf16_rows.md")
    lines = [
        *hostinfo.heading(
            f"Plain {'float32' if f32 else 'bf16'} weights: the strip kernel against oneDNN's "
            "row-exact plan",
            f"Threads {args.threads}; load average at the start "
            f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}.",
        ),
        "",
        "Microseconds per matrix, median of the passes; the ratio: the strip kernel's time over "
        "oneDNN's (below 1: faster). Both are row-exact: a row's bits do not depend on the call.",
        "",
        "| shape | rows | oneDNN plan | strip kernel | ratio |"
        + (" `vdpbf16ps` chains | oneDNN, whole calls | ratio |" if tiles else ""),
        "|---|---|---|---|---|" + ("---|---|---|" if tiles else ""),
    ]
    gen = torch.Generator().manual_seed(0)
    for name, (n, k) in SHAPES.items():
        count = 1 if name.startswith("LM head") else args.matrices
        plain = [torch.randn(n, k, generator=gen).to(dtype) for _ in range(count)]
        packed = [onednn.prepare(w) for w in plain]
        reordered = [whole.prepare(w) for w in plain] if tiles else []
        strips = [pack(w) for w in plain]
        del plain
        for rows in ROWS:
            x = torch.randn(rows, k, generator=gen).to(dtype)
            fns: dict[str, Callable[[], object]] = {
                "oneDNN": lambda x=x, ws=packed: [onednn(x, w) for w in ws],
                "strips": lambda x=x, ws=strips: [w.matmul(x) for w in ws],
            }
            if tiles:  # the kernel's path without AMX, on this machine
                fns["chains"] = lambda x=x, ws=strips: [
                    ext.bf16_linear(x, w.strips, w.shape[0], False) for w in ws
                ]
                fns["whole"] = lambda x=x, ws=reordered: [whole(x, w) for w in ws]
            t = {name: us / count for name, us in medians_us(fns, args.repeats).items()}
            lines.append(
                f"| {name} | {rows} | {t['oneDNN']:.0f} | {t['strips']:.0f} | "
                f"{t['strips'] / t['oneDNN']:.2f} |"
                + (
                    f" {t['chains']:.0f} | {t['whole']:.0f} | {t['strips'] / t['whole']:.2f} |"
                    if tiles
                    else ""
                )
            )
            print(lines[-1], flush=True)
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
