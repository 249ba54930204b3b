"""How fast one row reads a float32 model's weights: the default model's matrices (30 layers'
seven, then the tied LM head) multiplied by one row with MKL (`F.linear`, `torch.mv`), beside
the machine's read rate (`torch.sum` over one contiguous GiB), on one thread and two; and the
engine's own float32 strip kernel (engine/ops/f32_rows.py) over the same matrices.

Why: `--dtype float32 --quantization none` serves a lone stream at a quarter of the default's
tok/s (bench/results/serving_matrix_epyc.md). Earlier notes put that down to memory bandwidth
(538 MB of weights a token). This benchmark asks whether the weights are read at the rate the
memory gives, or at the rate one-row products over many small matrices reach.

Usage: python bench/weights/float32_gemv.py [--repeats 9] [--out bench/results/float32_gemv.md]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from trio_llm.engine.ops import f32_rows
from trio_llm.engine.ops.f32_rows import F32StripWeight

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))  # bench/: bench modules are imported by their path under it

import hostinfo  # noqa: E402
from timing import medians_us  # noqa: E402

LAYER = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]
"""SmolLM2-135M's q, k, v, o, gate, up and down projections (out, in)."""
SHAPES = LAYER * 30 + [(49152, 576)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--out", type=Path, default=BENCH / "results" / "float32_gemv.md")
    args = p.parse_args()
    gen = torch.Generator().manual_seed(0)
    weights = [torch.randn(o, i, generator=gen) for o, i in SHAPES]
    nbytes = sum(w.numel() * w.element_size() for w in weights)
    rows = {i: torch.randn(1, i, generator=gen) for i in (576, 1536)}
    block = torch.ones(256 * 1024 * 1024)  # 1 GiB of float32

    def linear() -> None:
        for w in weights:
            F.linear(rows[w.shape[1]], w)

    def mv() -> None:
        for w in weights:
            torch.mv(w, rows[w.shape[1]][0])

    strips = [F32StripWeight.pack(w) for w in weights] if f32_rows.available() else []

    def strip_kernel() -> None:
        for w in strips:
            w.matmul(rows[w.shape[1]])

    cases = {
        "F.linear, one row, every matrix": (linear, nbytes),
        "torch.mv, every matrix": (mv, nbytes),
        **({"strip kernel, one row, every matrix": (strip_kernel, nbytes)} if strips else {}),
        "torch.sum over 1 GiB (the read rate)": (block.sum, block.numel() * 4),
    }
    lines = [
        *hostinfo.heading("One row against a float32 model's weights"),
        "",
        f"The default model's {len(SHAPES)} matrices in float32 ({nbytes / 1e6:.0f} MB, what "
        "one decode step of a float32 model reads), median of "
        f"{args.repeats} passes after a warm-up, the cases taking turns pass by pass.",
        "",
        "| threads | case | ms | GB/s |",
        "|---|---|---|---|",
    ]
    threads = torch.get_num_threads()
    for count in (1, 2):
        torch.set_num_threads(count)
        medians = medians_us({name: call for name, (call, _) in cases.items()}, args.repeats)
        for name, (_, size) in cases.items():
            seconds = medians[name] / 1e6
            lines.append(f"| {count} | {name} | {seconds * 1e3:.1f} | {size / seconds / 1e9:.1f} |")
    torch.set_num_threads(threads)
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.write_text(text)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
