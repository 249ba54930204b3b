"""Perplexity of each weight format against llama.cpp's on the same GGUF file and tokens.

The text is tests/data/perplexity_text.txt (the Apache License 2.0, 2,224 tokens), cut into
512-token windows (engine/perplexity.py). For each GGUF file: trio-llm in-process in its
own formats (quantization auto, bf16 activations) and dequantized (quantization none, bf16 and
fp32), and llama.cpp through llama-cpp-python (the peers' venv, bench/serving/setup_peers.sh) on the
same token ids. Files other than the default one are made from it with llama.cpp's quantizer:
first a float file (the default file's tensors dequantized, its metadata kept), then each
format from that, so every format starts from the same weights.

Usage: python bench/weights/quant_quality.py [--formats Q4_1 Q4_0 Q8_0 Q4_K Q6_K] [--threads 2]
       [--peers-dir ../peers] [--out bench/results/quant_quality.md]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from trio_llm.config import EngineArgs
from trio_llm.engine.perplexity import perplexity, windows
from trio_llm.engine.step.core import EngineCore
from trio_llm.model_files import default_gguf_path, load_tokenizer, resolve_model

BENCH = Path(__file__).resolve().parents[1]
REPO = BENCH.parent
TEXT = REPO / "tests" / "data" / "perplexity_text.txt"
LLAMA_CPP_PPL = REPO / "tests" / "data" / "perplexity_llama_cpp.json"
"""llama.cpp's perplexity of the default file on the text, which the test compares with."""
sys.path.insert(0, str(BENCH))  # bench/: bench modules are imported by their path under it

import hostinfo  # noqa: E402

# What runs in the peers' venv: llama.cpp's perplexity over the same windows, and its quantizer.
LLAMA_SCRIPT = r"""
import json, math, sys
import numpy as np
import llama_cpp
job = json.load(open(sys.argv[1]))
if job["kind"] == "quantize":
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, "LLAMA_FTYPE_MOSTLY_" + job["format"])
    params.nthread = job["threads"]
    rc = llama_cpp.llama_model_quantize(job["src"].encode(), job["dst"].encode(), params)
    sys.exit(rc)
llm = llama_cpp.Llama(job["model"], n_ctx=job["window"], logits_all=True,
                      n_threads=job["threads"], n_batch=job["window"], verbose=False)
nll = []
for chunk in job["windows"]:
    llm.reset()
    llm.eval(chunk)
    logits = np.asarray(llm.scores[: len(chunk)], dtype=np.float64)
    logits -= logits.max(axis=1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    nll += [-logp[i, chunk[i + 1]] for i in range(len(chunk) - 1)]
print(json.dumps({"ppl": math.exp(sum(nll) / len(nll))}))
"""


def llama_cpp(python: Path, job: dict[str, object]) -> dict[str, float]:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(job, f)
    out = subprocess.run(
        [str(python), "-c", LLAMA_SCRIPT, f.name], capture_output=True, text=True, check=True
    )
    os.unlink(f.name)
    return json.loads(out.stdout.strip().splitlines()[-1]) if out.stdout.strip() else {}


def float_gguf(src: Path, dst: Path) -> None:
    """`src` with every tensor dequantized to F32 (metadata kept): the quantizer's input."""
    from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, quants

    reader = GGUFReader(src)
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    writer = GGUFWriter(str(dst), arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        kind = field.types[0]
        if kind == GGUFValueType.ARRAY:
            sub = field.types[-1]
            if sub == GGUFValueType.STRING:
                values = [bytes(field.parts[i]).decode("utf-8", "replace") for i in field.data]
            else:
                values = [field.parts[i].tolist()[0] for i in field.data]
            writer.add_array(name, values)
        elif kind == GGUFValueType.STRING:
            writer.add_string(name, bytes(field.parts[-1]).decode("utf-8", "replace"))
        else:
            writer.add_key_value(name, field.parts[-1].tolist()[0], kind)
    writer.add_file_type(0)  # ALL_F32; replaces the source's
    for t in reader.tensors:
        values = quants.dequantize(t.data, t.tensor_type)
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        writer.add_tensor(
            t.name,
            np.asarray(values, dtype=np.float32).reshape(shape),
            raw_dtype=GGMLQuantizationType.F32,
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def trio(model: Path, quantization: str, dtype: str, threads: int, tokens: list[int]) -> float:
    core = EngineCore(
        EngineArgs(
            model=str(model),
            quantization=quantization,
            dtype=dtype,
            num_threads=threads,
            kv_cache_memory="64MiB",
            ngram_speculation="off",
        )
    )
    return perplexity(core, tokens)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--formats", nargs="+", default=["Q4_1", "Q4_0", "Q8_0", "Q4_K", "Q6_K"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--peers-dir",
        type=Path,
        default=Path(os.environ.get("TRIO_LLM_PEERS_DIR", REPO.parent / "peers")),
    )
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "trio-llm-quant")
    p.add_argument("--out", type=Path, default=BENCH / "results" / "quant_quality.md")
    args = p.parse_args()
    python = args.peers_dir / "llama" / "bin" / "python"
    if not python.exists():
        sys.exit(
            f"llama-cpp-python is not in {python.parent.parent}: run bench/serving/setup_peers.sh"
        )
    tokens = load_tokenizer(resolve_model(None))(TEXT.read_text())["input_ids"]
    args.work.mkdir(parents=True, exist_ok=True)
    default = default_gguf_path()
    files = {"Q4_1": default}  # the default file is Q4_1 (its embedding Q8_0)
    base = args.work / "SmolLM2-135M-Instruct.F32.gguf"
    if any(f != "Q4_1" for f in args.formats) and not base.exists():
        float_gguf(default, base)
    for fmt in args.formats:
        if fmt not in files:
            files[fmt] = args.work / f"SmolLM2-135M-Instruct.{fmt}.gguf"
            if not files[fmt].exists():
                job = {
                    "kind": "quantize",
                    "src": str(base),
                    "dst": str(files[fmt]),
                    "format": fmt if fmt != "Q4_K" else "Q4_K_M",
                    "threads": args.threads,
                }
                llama_cpp(python, job)
    rows = []
    for fmt in args.formats:
        path = files[fmt]
        t0 = time.perf_counter()
        theirs = llama_cpp(
            python,
            {
                "kind": "ppl",
                "model": str(path),
                "window": 512,
                "threads": args.threads,
                "windows": windows(tokens),
            },
        )["ppl"]
        own = trio(path, "auto", "auto", args.threads, tokens)
        bf16 = trio(path, "none", "bfloat16", args.threads, tokens)
        row = (fmt, path.stat().st_size, theirs, own, bf16)
        rows.append(row)
        print(
            f"{fmt}: llama.cpp {theirs:.4f}, trio-llm own formats {own:.4f} "
            f"({own / theirs - 1:+.2%}), dequantized bf16 {bf16:.4f} "
            f"[{time.perf_counter() - t0:.0f} s]",
            flush=True,
        )
        if path == default:
            LLAMA_CPP_PPL.write_text(json.dumps({"window": 512, "ppl": theirs}) + "\n")
    lines = [
        *hostinfo.heading("Perplexity: each weight format against llama.cpp on the same file"),
        "",
        f"Text: tests/data/perplexity_text.txt ({len(tokens)} tokens), 512-token windows, each "
        "scored from its second token; the same token ids for both engines. llama.cpp: "
        "llama-cpp-python's `Llama.eval` with `logits_all` (the peers' build, "
        "bench/serving/setup_peers.sh). Q4_1 is the default model's file (its token embedding "
        "and LM head Q8_0); the others were made by llama.cpp's quantizer from the default file "
        "dequantized to F32 (Q4_K as Q4_K_M, which also holds Q6_K tensors).",
        "",
        "| file | size (MB) | llama.cpp | trio-llm, own formats | vs llama.cpp | "
        "trio-llm, dequantized to bf16 |",
        "|---|---|---|---|---|---|",
    ]
    for fmt, size, theirs, own, bf16 in rows:
        lines.append(
            f"| {fmt} | {size / 1e6:.1f} | {theirs:.4f} | {own:.4f} | {own / theirs - 1:+.2%} "
            f"| {bf16:.4f} |"
        )
    # Rows of formats this run did not measure stay as an earlier run wrote them.
    if args.out.exists():
        lines += [
            line
            for line in args.out.read_text().splitlines()
            if line.startswith("| Q") and line.split(" | ")[0][2:] not in args.formats
        ]
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
