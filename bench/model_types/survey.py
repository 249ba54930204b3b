"""Which of transformers' causal LM architectures the engine serves: a survey, not a benchmark.

For every model type in transformers' causal-LM mapping, a tiny random-weight model is built
from its config class (the common size fields set small: two layers, hidden 64, a vocabulary of
1000; what the class does not take it ignores), saved, and served by the engine; its greedy
tokens for two prompts are compared with
transformers' own `generate`. Each architecture ends in one of:

- runs: the engine's tokens equal transformers' (the path it took: own or generic);
- refused: the engine refuses it at start-up, with the reason it gives;
- differs: it runs but its tokens differ from transformers' (a fault to fix);
- not surveyed: no tiny model could be built from the config alone (a multimodal or composite
  config, a remote-code model); says nothing about the engine.

Usage: python bench/model_types/survey.py [--only llama,gemma2]
       [--out bench/results/architectures.md]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))  # bench/: bench modules are imported by their path under it

import hostinfo  # noqa: E402

SMALL: dict[str, Any] = {
    "vocab_size": 1000,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 512,
    "initializer_range": 0.2,
    "tie_word_embeddings": False,
    # GPT-2 style and other spellings
    "n_embd": 64,
    "n_layer": 2,
    "n_head": 4,
    "n_positions": 512,
    "d_model": 64,
    "n_layers": 2,
    "n_heads": 4,
    "num_layers": 2,
    "num_heads": 4,
    "ffn_hidden_size": 128,
    # mixtures of experts
    "num_experts": 4,
    "num_local_experts": 4,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}
PROMPTS = [[5, 17, 99, 3, 250, 8], list(range(40, 80))]
NEW_TOKENS = 6


def survey(model_type: str, directory: Path) -> tuple[str, str]:
    """(outcome, detail) for one model type."""
    import transformers
    from transformers import AutoModelForCausalLM
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from trio_llm.config import EngineArgs
    from trio_llm.engine.step.core import EngineCore
    from trio_llm.ipc.messages import EngineCoreRequest
    from trio_llm.model_files import UnsupportedModelError
    from trio_llm.sampling_params import SamplingParams

    try:
        config = CONFIG_MAPPING[model_type](**SMALL)
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
        model.config.architectures = [type(model).__name__]
        model.save_pretrained(directory)
        expected = []
        for prompt in PROMPTS:
            ids = torch.tensor([prompt])
            with torch.inference_mode():
                out = model.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=NEW_TOKENS,
                    do_sample=False,
                    pad_token_id=0,
                )
            expected.append(out[0, len(prompt) :].tolist())
    except Exception as error:  # any failure to build is the survey's, not the engine's
        return "not surveyed", f"{type(error).__name__}: {_short(error)}"
    del transformers
    try:
        core = EngineCore(
            EngineArgs(
                model=str(directory), dtype="float32", kv_cache_memory="16MiB", task="generate"
            )
        )
    except UnsupportedModelError as error:
        said = _short(error).replace(f"{directory.name}: ", "")
        return "refused", said.replace(directory.name, "it")
    except Exception as error:
        return "error at start", f"{type(error).__name__}: {_short(error)}"
    path = core.runner.choice.own or "generic"
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS)
    got: dict[str, list[int]] = {str(i): [] for i in range(len(PROMPTS))}
    try:
        for i, prompt in enumerate(PROMPTS):
            core.add_request(EngineCoreRequest(str(i), prompt, params))
        while core.has_work():
            for out in core.step().outputs:
                got[out.request_id] += out.new_token_ids
                if out.error:
                    return "error while running", out.error
    except Exception as error:
        return "error while running", f"{type(error).__name__}: {_short(error)}"
    if [got[str(i)] for i in range(len(PROMPTS))] != expected:
        return "differs", f"{path}: {got} != {expected}"
    return "runs", path


def _short(error: BaseException) -> str:
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return text if len(text) < 240 else text[:237] + "..."


CHUNK = 16
"""Model types per worker process: one process for all of them grew until the kernel killed it
(every tiny model's modules and kernels stay imported), one each would spend most of the
survey importing transformers."""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--only", default="")
    p.add_argument("--out", type=Path)
    p.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    types = sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    if args.only:
        types = [t for t in types if t in args.only.split(",")]
    if args.worker:  # survey `types` here, one JSON line each
        torch.set_num_threads(1)
        logging.disable(logging.WARNING)
        with args.worker.open("a") as out:
            for model_type in types:
                with tempfile.TemporaryDirectory() as tmp:
                    quiet = io.StringIO()
                    with contextlib.redirect_stderr(quiet), contextlib.redirect_stdout(quiet):
                        outcome, detail = survey(model_type, Path(tmp))
                arch = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]
                out.write(json.dumps([model_type, arch, outcome, detail]) + "\n")
                out.flush()
                print(f"{model_type}: {outcome}: {detail}", file=sys.stderr)
        return
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        results = Path(tmp) / "results.jsonl"
        for start in range(0, len(types), CHUNK):
            chunk = types[start : start + CHUNK]
            subprocess.run(
                [sys.executable, __file__, "--only", ",".join(chunk), "--worker", str(results)],
                check=False,
            )
            done = {json.loads(line)[0] for line in results.read_text().splitlines()}
            with results.open("a") as out:  # a worker that died leaves its rest unsurveyed
                for model_type in chunk:
                    if model_type not in done:
                        arch = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]
                        row = [model_type, arch, "not surveyed", "its worker process died"]
                        out.write(json.dumps(row) + "\n")
        rows = [tuple(json.loads(line)) for line in results.read_text().splitlines()]
    report = render(sorted(rows), time.perf_counter() - t0)  # type: ignore[arg-type]
    print(report)
    if args.out:
        args.out.write_text(report)


def render(rows: list[tuple[str, str, str, str]], seconds: float) -> str:
    import transformers

    counts: dict[str, int] = {}
    for _, _, outcome, _ in rows:
        counts[outcome] = counts.get(outcome, 0) + 1
    lines = [
        "# Which causal LM architectures of transformers the engine serves",
        "",
        f"Command: `{hostinfo.command()}` ({seconds:.0f} s)",
        "",
        f"Machine: {hostinfo.machine()}, transformers {transformers.__version__}.",
        "",
        __doc__.split("\n\n", 1)[1].split("\n\nUsage")[0],
        "",
        "Totals: " + ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items())) + ".",
        "",
        "| model type | architecture | outcome | detail |",
        "|---|---|---|---|",
    ]
    for model_type, arch, outcome, detail in rows:
        lines.append(f"| {model_type} | {arch} | {outcome} | {detail.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
