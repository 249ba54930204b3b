"""float32 weights kept as a GGUF file's blocks (engine/ops/f32_rows.py's `F32BlockWeight`, what
`--dtype float32 --quantization none` runs on a Q4_0, Q4_1 or Q8_0 file) against the dense
float32 strips they replace (`F32StripWeight`), by rows per call, on the default model's matmul
shapes: its layers in Q4_1, its LM head in Q8_0, as the default file stores them. Both give the
same bits (tests/engine/test_f32_blocks.py); this measures what reading 1.25 bytes a weight and
dequantizing them costs against reading 4.

Each case multiplies --matrices distinct matrices of the shape in turn (a model's layers), so
each call reads its weight from memory, as a decode step does. The two variants take turns call
by call (timing.py's `medians_us`); medians of --repeats passes, per matrix.

Usage: python bench/weights/f32_blocks.py [--threads 2] [--repeats 7] [--matrices 30]
       [--out bench/results/f32_blocks.md]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType as Q
from gguf import quants

from trio_llm.engine.ops import f32_rows
from trio_llm.engine.ops.f32_rows import F32BlockWeight, F32StripWeight
from trio_llm.engine.quant import gguf_blocks

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))  # bench/: bench modules are imported by their path under it

import hostinfo  # noqa: E402
from timing import medians_us  # noqa: E402
from weights.quant_kernels import SHAPES  # noqa: E402

ROWS = (1, 2, 6, 12, 13, 32, 128, 512)
"""Around the kernel's switch from dequantizing in registers (up to 12 rows with AVX-512) to a
buffer a block of rows reads."""


def matrix(
    n: int, k: int, kind: Q, rng: np.random.Generator
) -> tuple[F32BlockWeight, F32StripWeight]:
    raw = quants.quantize((rng.standard_normal((n, k)) * 0.05).astype(np.float32), kind)
    q, d, m = gguf_blocks.unpack_float_blocks(kind, raw)
    blocks = F32BlockWeight.pack_blocks(
        torch.from_numpy(q), torch.from_numpy(d), None if m is None else torch.from_numpy(m)
    )
    return blocks, F32StripWeight.pack(blocks.dequantize())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--matrices", type=int, default=30)
    p.add_argument("--out", type=Path, default=BENCH / "results" / "f32_blocks.md")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if not f32_rows.available():
        raise SystemExit("the float32 strip kernel is not built here (no C++ compiler or FMA)")
    lines = [
        *hostinfo.heading(
            "float32 weights from a GGUF's blocks against dense float32 strips",
            f"Threads {args.threads}; load average at the start "
            f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}.",
        ),
        "",
        "Microseconds per matrix, median of the passes; the ratio: the blocks' time over the "
        "dense strips' (below 1: faster). Both give the same bits.",
        "",
        "| shape | format | rows | dense strips | blocks | ratio |",
        "|---|---|---|---|---|---|",
    ]
    rng = np.random.default_rng(0)
    for name, (n, k) in SHAPES.items():
        head = name.startswith("LM head")
        kind = Q.Q8_0 if head else Q.Q4_1
        count = 1 if head else args.matrices
        pairs = [matrix(n, k, kind, rng) for _ in range(count)]
        for rows in ROWS:
            x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))
            fns: dict[str, Callable[[], object]] = {
                "dense": lambda x=x, ws=pairs: [dense.matmul(x) for _, dense in ws],
                "blocks": lambda x=x, ws=pairs: [blocks.matmul(x) for blocks, _ in ws],
            }
            t = {key: us / count for key, us in medians_us(fns, args.repeats).items()}
            lines.append(
                f"| {name} | {kind.name} | {rows} | {t['dense']:.0f} | {t['blocks']:.0f} | "
                f"{t['blocks'] / t['dense']:.2f} |"
            )
            print(lines[-1], flush=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
