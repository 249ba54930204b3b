"""The row-exact kernels against the two kernels a quantized weight otherwise takes, by rows per
call: the float one (engine/ops/int4_rows.py) and the integer one (engine/ops/int_rows.py,
"int", where it is built) beside torch's int4 kernel (row-exact, what `--batch-invariant on`
used for every row before) and oneDNN's bf16 matmul on a dense copy (what calls of many rows
take with invariance off; not row-exact against the int4 kernel).

Same 4-bit weights (groups of 32) for the default model's matmul shapes; bf16 activations;
the median of --repeats calls after a warm-up; the variants take turns per call so that drift
on a shared VM falls on each alike. Where the CPU has AMX the kernel's AVX512-BF16 path is
timed beside it.

Usage: python bench/weights/int4_rows.py [--threads 2] [--repeats 30]
       [--out bench/results/int4_rows.md]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

from trio_llm.engine.ops import int4_rows, int_rows
from trio_llm.engine.ops.int_rows import IntRows
from trio_llm.engine.quant import quantize_int4

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))  # bench/: bench modules are imported by their path under it

import hostinfo  # noqa: E402
from timing import medians_us  # noqa: E402
from weights.quant_kernels import SHAPES  # noqa: E402

ROWS = (1, 4, 8, 16, 32, 64, 128, 512)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--out", type=Path, default=BENCH / "results" / "int4_rows.md")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    ext = int4_rows.KERNEL.extension()
    if ext is None:
        raise SystemExit("the kernel is not built here (no C++ compiler)")
    paths = {"own": True} if int4_rows.path(True) != "amx" else {"own AMX": True, "own AVX": False}
    integer = int_rows.path() is not None
    names = ["oneDNN bf16", "torch int4", *paths, *(["int"] if integer else [])]
    extra = " | int / best other" if integer else ""
    lines = [
        *hostinfo.heading(
            "The row-exact 4-bit kernel by rows per call",
            f"Threads {args.threads}; kernel path here: {int4_rows.path()}; integer kernel's: "
            f"{int_rows.path() or 'not built'}; load average at the "
            f"start {' '.join(f'{x:.1f}' for x in os.getloadavg())}.",
        ),
        "",
        f"Microseconds per call, median of {args.repeats}; the ratio columns: a row-exact kernel "
        "against the faster of torch's int4 kernel and oneDNN bf16 (below 1: faster).",
        "",
        "| shape | rows | " + " | ".join(names) + " | own / best other" + extra + " |",
        "|---|---|" + "---|" * (len(names) + 1 + integer),
    ]
    for name, (n, k) in SHAPES.items():
        w = torch.randn(n, k) * 0.05
        int4 = quantize_int4(w, torch.bfloat16)
        dense = int4.dequantize()
        q, scale, zero = int4.values()
        packed_int = IntRows.pack(q[:n], scale[:n], zero[:n]) if integer else None
        int4.keep_exact()
        e = int4.exact
        assert e is not None
        for rows in ROWS:
            x = torch.randn(rows, k).to(torch.bfloat16)
            fns: dict[str, Callable[[], object]] = {
                "oneDNN bf16": partial(F.linear, x, dense),
                "torch int4": partial(
                    torch.ops.aten._weight_int4pack_mm_for_cpu,
                    x,
                    int4.packed,
                    int4.group,
                    int4.scales_zeros,
                ),
            }
            for label, amx in paths.items():
                fns[label] = partial(
                    ext.int4_linear, x, e.packed, e.scales, e.zeros, e.group, e.rows, amx
                )
            if packed_int is not None:
                fns["int"] = partial(packed_int.matmul, x)
            t = medians_us(fns, args.repeats)
            best = min(t["oneDNN bf16"], t["torch int4"])
            ratios = [t[next(iter(paths))] / best, *([t["int"] / best] if integer else [])]
            lines.append(
                f"| {name} | {rows} | "
                + " | ".join(f"{t[c]:.0f}" for c in names)
                + "".join(f" | {r:.2f}" for r in ratios)
                + " |"
            )
            print(lines[-1], flush=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
