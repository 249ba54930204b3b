"""A quantized GGUF of a family the own forward does not compute runs quantized in
transformers' modules (engine/models/gguf_modules.py): its matrices in their own formats on the
quantized kernels, predicting what the same file dequantized predicts, with what stays float
named; never silently dequantized.

The files are the tiny models of `architectures.CONFIGS` written as llama.cpp's converter
writes them (`gguf_writer`), their matrices in Q4_0 or Q8_0 (gguf-py's own quantizers), each
family with its own layout: Qwen3 and Gemma 3 as stored, Granite's Q and K rows interleaved
for llama.cpp's rotary, Phi-3's fused QKV, GPT-NeoX's fused QKV regrouped per head, and the
mixtures of experts (Qwen3-MoE, OLMoE, Mixtral) with their expert stacks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from architectures import CONFIGS, VOCAB
from engine_helpers import make_core, random_prompts, request, run
from gguf_writer import write

from trio_llm import model_files
from trio_llm.engine.models import gguf_modules
from trio_llm.engine.ops import int4_rows
from trio_llm.engine.ops.int_rows import IntRows
from trio_llm.engine.quant import Int4Weight

PROMPTS = random_prompts([9, 33], seed=4, vocab=VOCAB)


@pytest.fixture(scope="module")
def isolated_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("trio-llm-cache")


def quantized_file(name: str, kind: str, directory: Path) -> Path:
    import gguf
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(CONFIGS[name](), dtype=torch.float32).eval()
    return write(
        model,
        directory / f"{name}-{kind}.gguf",
        model_files.default_gguf_path(),
        matrices=gguf.GGMLQuantizationType[kind],
        embedding=True,
    )


def prompt_logprobs(path: Path, **kwargs: object) -> list[list[float]]:
    core = make_core(path, dtype="bfloat16", device="cpu", **kwargs)
    reqs = [request(str(i), p, max_tokens=1, prompt_logprobs=0) for i, p in enumerate(PROMPTS)]
    got = run(core, reqs)
    return [[lp.logprobs[0] for lp in got[str(i)].prompt_logprobs[1:]] for i in range(len(reqs))]


@pytest.mark.parametrize(
    ("name", "kind"),
    [("qwen3", "Q4_0"), ("gemma3", "Q4_0"), ("granite", "Q4_0"), ("phi3", "Q8_0"),
     ("gpt_neox", "Q4_0"), ("qwen3_moe", "Q4_0"), ("olmoe", "Q8_0"), ("mixtral", "Q4_0")],
)  # fmt: skip
def test_a_quantized_file_runs_in_its_formats_and_predicts_what_it_dequantized_does(
    name: str,
    kind: str,
    tmp_path: Path,
    isolated_cache: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TRIO_LLM_CACHE", str(isolated_cache))
    path = quantized_file(name, kind, tmp_path)
    core = make_core(path, dtype="bfloat16", device="cpu")
    model = core.runner.model
    weights = gguf_modules.quantized_weights(model)
    # Every decoder matrix quantized, experts included: what stays nn.Linear is at most an LM
    # head kept float, and no 3-D expert stack is left.
    assert weights and all(isinstance(w, Int4Weight) for w in weights)
    linears = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    assert all(n.endswith("lm_head") for n in linears), linears
    assert not any(p.dim() == 3 for p in model.parameters())
    # The token table quantized too (Gemma's scaled one keeps its factor: the predictions
    # below would move with it), and no float copy of it left behind.
    assert isinstance(model.get_input_embeddings(), gguf_modules.QuantizedEmbedding)
    assert not any(isinstance(m, torch.nn.Embedding) for m in model.modules())
    assert not core.runner.invariance.on  # auto: off with quantized weights, as on the own forward
    quantized = prompt_logprobs(path)
    dequantized = prompt_logprobs(path, quantization="none")
    # Where the integer kernel serves few rows (ops/int_rows.py: an AMX machine) the
    # activations are rounded to 8 bits per block of 32 as well, as llama.cpp's are.
    integer = any(isinstance(w.exact, IntRows) for w in weights)
    for a, b in zip(quantized, dequantized, strict=True):
        # The same values on other kernels: bf16 rounding apart, the same predictions. The
        # median, as a mixture's router may flip one token's expert on a rounding (Mixtral's
        # did: one token off by 1.0, the rest by hundredths, 0.07 with 8-bit activations); a
        # wrong weight moves them all.
        error = np.median(np.abs(np.subtract(a, b)))
        assert error < (0.1 if integer else 0.05), (name, np.subtract(a, b))


def test_batch_invariance_on_keeps_every_row_on_the_quantized_kernels(
    tmp_path: Path, isolated_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With `--batch-invariant on` no dense copy is kept and a request gets the same tokens
    alone and beside others."""
    monkeypatch.setenv("TRIO_LLM_CACHE", str(isolated_cache))
    path = quantized_file("qwen3", "Q4_0", tmp_path)
    core = make_core(path, dtype="bfloat16", device="cpu", batch_invariant="on")
    assert core.runner.invariance.on and core.runner.dense_copies is None
    own = core.runner.own
    if own is not None and int4_rows.available():  # AMX or AVX512-BF16: the own kernel
        int4 = [w for w in own.matrices() if isinstance(w, Int4Weight)]
        assert int4 and all(w.exact is not None for w in int4)
    prompts = random_prompts([5, 17, 40, 3, 26], seed=8, vocab=VOCAB)
    reqs = [request(str(i), p, max_tokens=6, logprobs=0) for i, p in enumerate(prompts)]
    together = run(core, reqs)
    for r in reqs:
        alone = run(core, [r])[r.request_id]
        assert alone.token_ids == together[r.request_id].token_ids
        assert [lp.logprobs[0] for lp in alone.logprobs] == [
            lp.logprobs[0] for lp in together[r.request_id].logprobs
        ]


def test_a_layout_it_does_not_know_stays_float_and_is_named(
    tmp_path: Path, isolated_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the row orders it knows, Granite's interleaved Q and K do not match what
    transformers read: they keep their float weights, named, rather than run wrong."""
    monkeypatch.setenv("TRIO_LLM_CACHE", str(isolated_cache))
    path = quantized_file("granite", "Q4_0", tmp_path)
    monkeypatch.setattr(gguf_modules, "_row_orders", lambda *_: [lambda _n: None])
    source = model_files.resolve_model(str(path))
    from trio_llm.engine.models import loader

    model = loader.load_model(source, torch.bfloat16, "cpu")
    kept = gguf_modules.quantize_modules(model, path, torch.bfloat16)
    unknown = {k: n for k, n in kept.items() if "layout" in k}
    assert set(unknown) == {
        "model.layers.self_attn.q_proj float (its file layout is not one this engine knows)",
        "model.layers.self_attn.k_proj float (its file layout is not one this engine knows)",
    }
    assert kept["Q4_0 as int4"] > 0
