"""Every documented `--dtype` x `--quantization` choice of `trio-llm serve` on the default model,
at one stream and under load, beside the default: no combination may collapse.

A collapse is what the default model's `--dtype float32` once was, unseen for a release: the
int4 kernels' float32 path, 25x slower at c=32 than the default. Each combination is served in
turn by bench/serving/compare.py (same prompts, same closed loop, streaming chat, output length
fixed), and the report gives each one's output tok/s at each concurrency as a ratio to the
default's (the first variant) from the same run, marking those under 0.5x (the issue 39 bound).
A combination the server refuses at start-up is reported as refused, with the server's reason.

Usage: python bench/serving/matrix.py [--concurrency 1 32]
       [--dtypes auto float32 bfloat16 float16] [--quantizations auto none int8 int4 w8a8]
       [--out bench/results/serving_matrix.md]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))  # bench/: bench modules are imported by their path under it

import hostinfo  # noqa: E402

BOUND = 0.5
"""Every combination's tok/s at every concurrency must be at least this share of the default's."""


def variants(dtypes: list[str], quantizations: list[str]) -> list[str]:
    """`trio-llm serve` flags per combination, the default (auto, auto) first."""
    pairs = [(d, q) for d in dtypes for q in quantizations]
    pairs.sort(key=lambda p: p != ("auto", "auto"))
    return [f"--max-num-seqs 64 --dtype {d} --quantization {q}" for d, q in pairs]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    p.add_argument("--dtypes", nargs="+", default=["auto", "float32", "bfloat16", "float16"])
    p.add_argument("--quantizations", nargs="+", default=["auto", "none", "int8", "int4", "w8a8"])
    p.add_argument("--out", type=Path, default=BENCH / "results" / "serving_matrix.md")
    args = p.parse_args()
    flags = variants(args.dtypes, args.quantizations)
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "levels.json"
        run = [
            sys.executable,
            str(BENCH / "serving" / "compare.py"),
            "--servers",
            "trio-llm",
            "--concurrency",
            *map(str, args.concurrency),
            "--offline-concurrency",
            "0",
            "--out",
            str(Path(tmp) / "compare.md"),
            "--json",
            str(data),
            *(f"--trio-llm-args={f}" for f in flags),
        ]
        subprocess.run(run, check=False)
        levels = json.loads(data.read_text()) if data.exists() else {}
        details = (
            (Path(tmp) / "compare.md").read_text() if (Path(tmp) / "compare.md").exists() else ""
        )
    tps: dict[str, dict[int, float]] = {}
    for label, runs in levels.items():
        tps[label] = {
            int(r["summary"]["concurrency"]): float(r["summary"]["output_tokens_per_s"])
            for r in runs
        }
    default = tps.get("trio-llm", {})
    header = "| dtype | quantization | " + " | ".join(
        f"c={c} tok/s (x default)" for c in args.concurrency
    )
    lines = [header + " |", "|---|---|" + "---:|" * len(args.concurrency)]
    collapsed = []
    for i, flag in enumerate(flags):
        words = flag.split()
        dtype, quantization = (
            words[words.index("--dtype") + 1],
            words[words.index("--quantization") + 1],
        )
        label = "trio-llm" if i == 0 else f"trio-llm {flag}"
        cells = []
        for c in args.concurrency:
            got = tps.get(label, {}).get(c)
            base = default.get(c)
            if got is None:
                cells.append("refused or failed (see below)")
            elif not base:
                cells.append(f"{got:.1f}")
            else:
                ratio = got / base
                mark = " **under 0.5x**" if ratio < BOUND else ""
                cells.append(f"{got:.1f} ({ratio:.2f}x){mark}")
                if ratio < BOUND:
                    collapsed.append(f"{dtype} x {quantization} at c={c}")
        lines.append(f"| {dtype} | {quantization} | " + " | ".join(cells) + " |")
    verdict = (
        f"Under {BOUND}x the default: {', '.join(collapsed)}."
        if collapsed
        else f"No combination under {BOUND}x the default at any concurrency measured."
    )
    report = [
        *hostinfo.heading("Every dtype x quantization choice on the default model"),
        "",
        __doc__.split("\n\n")[1].replace("\n", " "),
        "",
        *lines,
        "",
        verdict,
        "",
        "## Each run, as compare.py reported it",
        "",
        details,
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(report))
    print("\n".join(report[:-1]))
    return 1 if collapsed else 0


if __name__ == "__main__":
    sys.exit(main())
