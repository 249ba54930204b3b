"""The output processor on a 16k-token output: does a token late in the output cost what an
early one did?

    python bench/output_text.py [--tokens 16384] [--before SRC] [--out bench/results/output_text.md]

One request, fed token by token as the engine would (one `EngineCoreOutput` a step), with the
consumer taking each output as it comes (DELTA, as streaming does) or only the final one
(FINAL_ONLY, as a non-streaming response does), with and without a stop string. The tokens are
the default model's real tokenizer's, detokenized for real. Reported: the total time and the
time of the first and last 1,024 tokens; a linear output processor has a last/first ratio near
1, one that copies the whole text per token grows with the output.

`--before SRC` also runs the same measurement with another checkout's `src` directory (say, the
commit before a change) in a child process, so both appear in one table, measured in one
sitting.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import hostinfo  # bench/hostinfo.py

WINDOW = 1024
CASES = [("DELTA", None), ("DELTA", ["\x00" * 3]), ("FINAL_ONLY", None)]
"""The stop string never occurs: it is checked on every token and never ends the output."""


def measure(tokens: int, repeats: int) -> list[dict[str, object]]:
    from trio_llm.client.collector import RequestCollector
    from trio_llm.client.input_processor import InputProcessor
    from trio_llm.client.output_processor import OutputProcessor
    from trio_llm.ipc.messages import EngineCoreOutput
    from trio_llm.model_files import load_tokenizer, resolve_model
    from trio_llm.sampling_params import RequestOutputKind, SamplingParams

    tokenizer = load_tokenizer(resolve_model(None))
    text = Path(__file__).read_text()  # any long, varied text
    ids = tokenizer.encode(text, add_special_tokens=False)
    ids = (ids * (tokens // len(ids) + 1))[:tokens]
    rows = []
    for kind_name, stop in CASES:
        kind = RequestOutputKind[kind_name]
        runs = []
        for _ in range(repeats):
            processor = OutputProcessor(tokenizer)
            params = SamplingParams(max_tokens=tokens, stop=stop, output_kind=kind)
            collector = RequestCollector("r", None, [1], n=1, kind=kind, arrival_time=0.0)
            processor.add_request(
                collector, InputProcessor.engine_requests("r", [1], params, arrival_time=0.0)
            )
            per_token = []
            for k, token in enumerate(ids):
                started = time.perf_counter()
                finish = "length" if k == tokens - 1 else None
                out = EngineCoreOutput(request_id="r", new_token_ids=[token], finish_reason=finish)
                processor.process_outputs([out], 0.0)
                if collector._ready():
                    collector.get_nowait()
                per_token.append(time.perf_counter() - started)
            runs.append((sum(per_token), sum(per_token[:WINDOW]), sum(per_token[-WINDOW - 1 : -1])))
        total, first, last = (statistics.median(r[i] for r in runs) for i in range(3))
        rows.append(
            {
                "case": kind_name + (" + stop" if stop else ""),
                "total_ms": total * 1e3,
                "first_ms": first * 1e3,
                "last_ms": last * 1e3,
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--before", help="another checkout's src/, measured alongside")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default="bench/results/output_text.md")
    args = parser.parse_args()
    if args.json:
        print(json.dumps(measure(args.tokens, args.repeats)))
        return

    def run(src: str) -> list[dict[str, object]]:
        env = {**os.environ, "PYTHONPATH": src, "TOKENIZERS_PARALLELISM": "false"}
        argv = [sys.executable, __file__, "--json", f"--tokens={args.tokens}"]
        argv.append(f"--repeats={args.repeats}")
        result = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
        return json.loads(result.stdout.strip().splitlines()[-1])

    here = str(Path(__file__).resolve().parents[1] / "src")
    trees = [("before", args.before), ("after", here)] if args.before else [("this", here)]
    results = [(label, run(src)) for label, src in trees]
    lines = [
        f"# Output processing of a {args.tokens}-token output",
        "",
        f"Machine: {hostinfo.describe()}",
        "",
        f"Command: `python bench/output_text.py --tokens {args.tokens}"
        + (" --before <the previous commit's src>`" if args.before else "`")
        + f"; medians of {args.repeats} runs.",
        "",
        f"| code | case | total ms | first {WINDOW} tokens ms | last {WINDOW} tokens ms "
        "| last/first |",
        "|---|---|---|---|---|---|",
    ]
    for label, rows in results:
        for row in rows:
            first, last = float(row["first_ms"]), float(row["last_ms"])  # type: ignore[arg-type]
            lines.append(
                f"| {label} | {row['case']} | {float(row['total_ms']):.1f} | {first:.2f} "  # type: ignore[arg-type]
                f"| {last:.2f} | {last / first:.2f} |"
            )
    report = "\n".join(lines) + "\n"
    print(report)
    Path(args.out).write_text(report)


if __name__ == "__main__":
    main()
