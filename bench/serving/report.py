"""compare.py's report: the headline table, issue 19's targets as ratios, every level, the plot.

No number is written that was not measured in this run: a missing level reads "not measured".
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import importlib.util
import math
import os
import sys

import hostinfo
from serving import serve  # the load generator
from serving.load import Level
from serving.peers import Server, Skipped
from serving.peers.base import MODEL_NAME
from serving.peers.llama_cpp_server import LABEL as LLAMA_CPP
from serving.peers.transformers_server import LABEL as TRANSFORMERS
from serving.peers.trio_llm_server import LABEL as TRIO_LLM


def machine() -> str:
    return (
        f"{hostinfo.machine()}, transformers {importlib.metadata.version('transformers')}, "
        f"trio-llm {importlib.metadata.version('trio-llm')}"
    )


def load_average() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def find(levels: dict[str, list[Level]], label: str, concurrency: int) -> serve.RunSummary | None:
    return next(
        (lv.summary for lv in levels.get(label, []) if lv.summary.concurrency == concurrency), None
    )


PEER_TARGETS = [
    # what is compared, at which concurrency, RunSummary field, against whom, goal on the ratio
    ("c=32 output tok/s", 32, "output_tokens_per_s", TRANSFORMERS, ">=", 3.0),
    ("c=32 TTFT p99 (ms)", 32, "ttft_p99", TRANSFORMERS, "<=", 0.25),
    ("c=1 ITL p50 (ms)", 1, "itl_p50", TRANSFORMERS, "<=", 0.8),
    ("c=1 ITL p50 (ms)", 1, "itl_p50", LLAMA_CPP, "<=", 1.5),
    ("c=8 output tok/s", 8, "output_tokens_per_s", TRANSFORMERS, ">=", 2.0),
    ("c=8 output tok/s", 8, "output_tokens_per_s", LLAMA_CPP, ">=", 2.0),
]
"""Issue 19's targets against the peers (the c=8 ones are the long-context row's, run with
`--concurrency 8 --input-len 1980 --output-len 128`)."""


def targets_table(
    levels: dict[str, list[Level]], offline: tuple[int, float, float] | None
) -> list[str]:
    """Issue 19's targets for every trio-llm variant; the offline one for the first only."""
    rows = []

    def ratio_row(
        what: str, mine: float | None, theirs: float | None, op: str, bound: float
    ) -> None:
        goal = f"{op} {bound:.2g}"
        if mine is None or theirs is None or math.isnan(mine) or math.isnan(theirs) or not theirs:
            rows.append(f"| {what} | {goal} | not measured in this run | - |")
            return
        ratio = mine / theirs
        met = ratio >= bound if op == ">=" else ratio <= bound
        rows.append(
            f"| {what} | {goal} | {mine:.1f} / {theirs:.1f} = **{ratio:.2f}** | "
            f"{'met' if met else 'missed'} |"
        )

    def get(label: str, c: int, attr: str) -> float | None:
        summary = find(levels, label, c)
        return None if summary is None else getattr(summary, attr)

    for me in [label for label in levels if label.startswith(TRIO_LLM)] or [TRIO_LLM]:
        for what, c, attr, peer, op, bound in PEER_TARGETS:
            ratio_row(f"{what}, {me} / {peer}", get(me, c, attr), get(peer, c, attr), op, bound)
    if offline is not None:
        c, tok_s, _ = offline
        ratio_row(
            f"c={c} output tok/s, trio-llm server / EngineCore offline",
            get(TRIO_LLM, c, "output_tokens_per_s"),
            tok_s,
            ">=",
            0.9,
        )
    return [
        "| target | goal | measured | verdict |",
        "|---|---|---|---|",
        *rows,
    ]


def headline(levels: dict[str, list[Level]], concurrency: list[int]) -> list[str]:
    head = "| server | " + " | ".join(f"c={c} tok/s" for c in concurrency)
    head += " | c=1 ITL p50 | c=32 TTFT p50 | c=32 TTFT p99 |"
    out = [head, "|---" * (len(concurrency) + 4) + "|"]
    for label in levels:
        cells = []
        for c in concurrency:
            s = find(levels, label, c)
            cells.append(f"{s.output_tokens_per_s:.1f}" if s else "-")
        one, c32 = find(levels, label, 1), find(levels, label, 32)
        out.append(
            f"| {label} | "
            + " | ".join(cells)
            + f" | {f'{one.itl_p50:.1f} ms' if one else '-'}"
            + f" | {f'{c32.ttft_p50:.0f} ms' if c32 else '-'}"
            + f" | {f'{c32.ttft_p99:.0f} ms' if c32 else '-'} |"
        )
    return out


def write_report(
    args: argparse.Namespace,
    servers: list[Server],
    skipped: list[Skipped],
    levels: dict[str, list[Level]],
    offline: tuple[int, float, float] | None,
    loads: dict[str, tuple[str, str]],
    seconds: float,
) -> str:
    rows = [lv.summary for mine in levels.values() for lv in mine]
    plot = args.out.with_suffix(".png")
    lines = [
        "# Serving benchmark: trio-llm against its peers, side by side",
        "",
        f"Command: `{hostinfo.command()}`",
        "",
        f"Machine: {machine()}.",
        f"Date: {datetime.datetime.now().isoformat(timespec='minutes')}. Whole run: "
        f"{seconds / 60:.1f} min.",
        "",
        f"Model: {MODEL_NAME} on every server. Load: bench/serving/serve.py closed loop at "
        f"concurrency {', '.join(map(str, args.concurrency))}; at each level "
        f"max({args.min_prompts}, {args.prompts_per_client} x concurrency) streaming "
        f"{args.endpoint} requests (a modest count, to keep a full run short: the percentiles of "
        f"the small levels rest on few requests), each {args.input_len} random words after a "
        f"fixed instruction, {args.output_len} output tokens, greedy, stop-at-EOS off (see "
        "bench/serving/compare.py for how each server is told), after one untimed warm-up "
        "request per level. Percentiles over requests (TTFT, E2E) and over token gaps (ITL); "
        "`server CPU` is cores used by the server's processes during the level, `client CPU` "
        "those of the load generator, which shares the 2 cores.",
        "",
        "Servers:",
        "",
    ]
    for server in servers:
        before, after = loads.get(server.label, ("?", "?"))
        lines.append(
            f"- **{server.label}**: {server.description}. Load average before / after: "
            f"{before} / {after}."
        )
    for skip in skipped:
        lines.append(f"- **{skip.label}**: skipped, {skip.reason}.")
    lines += ["", "## Headline", "", *headline(levels, args.concurrency), ""]
    lines += ["## Targets (issue 19)", "", *targets_table(levels, offline), ""]
    if offline is not None:
        c, tok_s, prompt_tokens = offline
        tokenized = " after the chat template" if args.endpoint == "chat" else ""
        lines += [
            "Offline reference: EngineCore in-process (bench/engine_step/throughput.py "
            f"`run_core`), the c={c} prompts ({prompt_tokens:.0f} prompt tokens on average"
            f"{tokenized}), the first trio-llm's engine settings with max_num_seqs={c}: "
            f"{tok_s:.1f} output tok/s.",
            "",
        ]
    lines += ["## All levels", "", serve.markdown_table(rows).rstrip()]
    lines += ["", "| server | conc. | server CPU (cores) |", "|---|---|---|"]
    for label, mine in levels.items():
        for lv in mine:
            lines.append(f"| {label} | {lv.summary.concurrency} | {lv.server_cpu_cores:.2f} |")
    errors = [r for r in rows if r.errors]
    if errors:
        lines += ["", "Errors:", ""]
        lines += [f"- {r.label} c={r.concurrency}: {r.errors} x {r.first_error}" for r in errors]
    if rows and can_plot():
        lines += ["", f"![output tokens/s and TTFT p99 against concurrency]({plot.name})"]
    return "\n".join(lines) + "\n"


def can_plot() -> bool:
    """Whether matplotlib (the `bench` extra) is here: the plot is optional, the tables not."""
    return importlib.util.find_spec("matplotlib") is not None


def write_plot(args: argparse.Namespace, levels: dict[str, list[Level]]) -> None:
    """The plot beside the report, after the report is written: a failure here loses no
    table."""
    rows = [lv.summary for mine in levels.values() for lv in mine]
    if not rows or not can_plot():
        return
    try:
        serve.plot(rows, args.out.with_suffix(".png"))
    except Exception as error:  # a broken matplotlib must not lose the run
        print(f"the plot failed ({error!r}); the tables are in {args.out}", file=sys.stderr)
