"""`trio-llm run-batch -i in.jsonl -o out.jsonl [--model M]`: a batch file run with no server
(vLLM's run-batch): the engine in this process's nursery (`open_engine`), the app built over it
but never served (`build_app`), and each line answered by its endpoint's handler exactly as
the server's batch runner answers it (lines.py), so its output lines are OpenAI's batch
output lines. Lines of any batch endpoint may mix in one file.

Nothing here is interactive, so the lines run as many at once as the engine runs sequences
(--max-num-seqs); the output is written in the input's order once every line has finished,
with a progress bar (tqdm, which transformers already brings) meanwhile.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import msgspec
import trio

from trio_llm.http.batch.lines import check_input, check_model_on, run_line
from trio_llm.http.batch.protocol import InputLine, OutputLine
from trio_llm.http.config import ServerConfig


def add_run_batch_arguments(parser: argparse.ArgumentParser) -> None:
    """-i, -o and --model, then every `serve` flag (the engine's: dtype, KV cache, threads)."""
    from trio_llm.http.serve_flags import add_serve_arguments

    parser.add_argument("-i", "--input-file", required=True, help="the batch's JSONL lines")
    parser.add_argument("-o", "--output-file", required=True, help="where the answers go")
    parser.add_argument(
        "--model", dest="batch_model", metavar="MODEL", help="the model (default: the default)"
    )
    add_serve_arguments(parser)


def config_of(args: argparse.Namespace) -> ServerConfig:
    from trio_llm.http.config import config_from_args

    if args.batch_model:
        args.model = [args.batch_model]
    return config_from_args(args)


def run(config: ServerConfig, input_file: Path, output_file: Path) -> int:
    from trio_llm.http.runtime.lifespan import setup_logging

    setup_logging("warning" if config.log_level == "info" else config.log_level)
    return trio.run(run_batch, config, input_file, output_file)


async def run_batch(config: ServerConfig, input_file: Path, output_file: Path) -> int:
    """0 once every line has an answer in `output_file` (a line's own error is an answer);
    1, writing nothing, when the input has lines that cannot run (each named on stderr)."""
    from tqdm import tqdm

    from trio_llm.client import open_engine
    from trio_llm.http.app import build_app
    from trio_llm.http.runtime.state import app_state

    content = await trio.Path(input_file).read_bytes()
    async with open_engine(config.engine) as engine:
        app = build_app(engine, config=config)
        lines, errors = check_input(content, None, check_model_on(app_state(app)))
        if errors:
            for error in errors:
                print(f"{input_file}:{error.line}: {error.message}", file=sys.stderr)
            return 1
        answers: dict[str, OutputLine] = {}
        slots = trio.Semaphore(config.engine.max_num_seqs)
        with tqdm(total=len(lines), unit="line", file=sys.stderr) as bar:

            async def answer(line: InputLine) -> None:
                try:
                    answers[line.custom_id] = await run_line(app, line)
                    bar.update()
                finally:
                    slots.release()

            async with trio.open_nursery() as nursery:
                for line in lines:
                    await slots.acquire()
                    nursery.start_soon(answer, line)
    data = b"".join(msgspec.json.encode(answers[ln.custom_id]) + b"\n" for ln in lines)
    await trio.Path(output_file).write_bytes(data)
    return 0
