"""Structured outputs: what the grammar engine costs and what jump-forward saves.

Sections, each run on its own and written into its own part of --out (the others are kept):
  libraries  llguidance against xgrammar on the default model's vocabulary (compile, mask at 1
             and 32 rows, footprint): the table the choice of grammar engine rests on
             (structured_libraries.py, beside this file).
  engine     EngineCore in this process on the default model: the step time at 32 running
             sequences, all constrained against none (interleaved pairs), and engine steps per
             output token over the schema set with jump-forward and without.
  serving    constrained chat completions (response_format json_schema) at c=1 and c=8, trio-llm
             (with jump-forward and without) against llama-cpp-python's server
             (structured_serving.py).

Usage: python bench/apis/structured.py libraries|engine|serving
       [--out bench/results/structured.md]
       libraries: [--rounds 4] [--wheels DIR]   engine: [--rounds 4] [--steps 20]
       serving: [--concurrency 1,8] [--trio-llm-args FLAGS ...]; llama-cpp-python from
       bench/serving/setup_peers.sh (ONLY=llama), found in $TRIO_LLM_PEERS_DIR or ../peers
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))  # bench/: bench modules are imported by their path under it
sys.path.insert(0, str(BENCH.parent / "tests"))  # the schemas the tests use

import hostinfo  # noqa: E402
from structured_cases import SCHEMAS  # noqa: E402


def uptime() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def write_section(out: Path, name: str, body: str) -> None:
    """Replace the section `name` of `out` (between its markers), or append it."""
    text = out.read_text() if out.exists() else "# Structured outputs\n"
    start, end = f"<!-- {name} -->", f"<!-- /{name} -->"
    block = f"{start}\n{body.strip()}\n{end}"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else f"{text}\n{block}\n"
    out.write_text(text)


def libraries(args: argparse.Namespace) -> str:
    from apis.structured_libraries import measure, report
    from trio_llm import model_files
    from trio_llm.engine.models import loader

    source = model_files.resolve_model(args.model)
    tokenizer = model_files.load_tokenizer(source)
    config = loader.load_config(source)
    eos = sorted(loader.eos_token_ids(source, config))
    before = uptime()
    results = measure(
        tokenizer, int(config.vocab_size), eos, [c.schema for c in SCHEMAS], args.rounds
    )
    wheels = Path(args.wheels) if args.wheels else None
    return (
        f"## Grammar engines on {source.name}'s vocabulary ({config.vocab_size} tokens)\n\n"
        f"Command: `{hostinfo.command()}`\n\n"
        f"{hostinfo.describe()}. Load average when it started: {before}. "
        f"{args.rounds} rounds, alternating the libraries.\n\n" + report(results, wheels, uptime)
    )


def engine(args: argparse.Namespace) -> str:
    from apis.structured_engine import measure

    return (
        f"## The engine on the default model\n\nCommand: `{hostinfo.command()}`\n\n"
        f"{hostinfo.describe()}.\n\n"
        + measure(args.model, args.dtype, args.rounds, args.steps, uptime)
    )


def serving(args: argparse.Namespace) -> str:
    from apis.structured_serving import measure

    peers = Path(os.environ.get("TRIO_LLM_PEERS_DIR") or BENCH.parent.parent / "peers")
    levels = [int(c) for c in args.concurrency.split(",")]
    return (
        f"## Constrained serving\n\nCommand: `{hostinfo.command()}`\n\n"
        f"{hostinfo.describe()}; peers from {peers}.\n\n"
        + measure(peers, args.trio_llm_args, levels, uptime)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("section", choices=["libraries", "engine", "serving"])
    parser.add_argument("--out", default=str(BENCH / "results" / "structured.md"))
    parser.add_argument("--model", default=None)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--wheels", default=None, help="a folder of `pip download`ed wheels")
    parser.add_argument("--steps", type=int, default=20, help="engine: timed steps per round")
    parser.add_argument("--dtype", default="auto", help="engine: the engine's dtype")
    parser.add_argument("--concurrency", default="1,8", help="serving: client counts")
    parser.add_argument(
        "--trio-llm-args",
        nargs="+",
        default=["--max-num-seqs 64", "--max-num-seqs 64 --no-jump-forward"],
        help="serving: one trio-llm server per string of flags",
    )
    args = parser.parse_args()
    sections = {"libraries": libraries, "engine": engine, "serving": serving}
    body = sections[args.section](args)
    print(body)
    write_section(Path(args.out), args.section, body)


if __name__ == "__main__":
    main()
