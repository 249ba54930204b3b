"""float32 weights kept as a GGUF file's blocks (`--dtype float32 --quantization none`,
engine/ops/f32_rows.py's `F32BlockWeight`): the kernel multiplies by exactly the values the
`gguf` package dequantizes, so every row has the bits the dense float32 strips give, and an
engine on the blocks answers as an engine on a dense copy of the file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from architectures import CONFIGS, VOCAB
from engine_helpers import make_core, random_prompts, request, run
from gguf import GGMLQuantizationType as Q
from gguf import quants
from gguf_writer import write

from trio_llm import model_files
from trio_llm.engine.models import quantized
from trio_llm.engine.models.loader import load_config
from trio_llm.engine.ops import f32_rows
from trio_llm.engine.ops.f32_rows import F32BlockWeight, F32StripWeight
from trio_llm.engine.quant import gguf_blocks

pytestmark = pytest.mark.skipif(
    not f32_rows.available(), reason="the strip kernel needs a C++ compiler and FMA"
)

BLOCK_FORMATS = sorted(gguf_blocks.FLOAT_BLOCK_FORMATS, key=lambda kind: kind.name)


def block_weight(kind: Q, n: int, k: int, seed: int) -> tuple[F32BlockWeight, torch.Tensor]:
    """A random [n, k] matrix stored in `kind`: its blocks, and the `gguf` package's values."""
    values = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32)
    raw = quants.quantize(values, kind)
    dense = torch.from_numpy(np.array(quants.dequantize(raw, kind), dtype=np.float32))
    q, d, m = gguf_blocks.unpack_float_blocks(kind, raw)
    blocks = F32BlockWeight.pack_blocks(
        torch.from_numpy(q), torch.from_numpy(d), None if m is None else torch.from_numpy(m)
    )
    return blocks, dense.reshape(n, k)


@pytest.mark.parametrize("kind", BLOCK_FORMATS, ids=lambda kind: kind.name)
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("n", "k"), [(45, 64), (96, 576), (200, 1536)])
def test_rows_have_the_dense_float32_bits_in_any_call(
    kind: Q, threads: int, n: int, k: int
) -> None:
    """Calls of few rows dequantize in the passes' registers, calls of more into a buffer: both
    must give each row the bits the dense strips give it, alone or in any call."""
    blocks, dense = block_weight(kind, n, k, seed=n + k)
    assert torch.equal(blocks.dequantize(), dense)
    strips = F32StripWeight.pack(dense)
    x = torch.randn(200, k, generator=torch.Generator().manual_seed(k))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for rows in (1, 2, 6, 7, 12, 13, 40, 97, 200):
            got = blocks.matmul(x[:rows])
            assert torch.equal(got, strips.matmul(x[:rows])), rows
            assert torch.equal(got[-1:], blocks.matmul(x[rows - 1 : rows])), rows
    finally:
        torch.set_num_threads(before)


def test_blocks_hold_a_third_of_the_dense_bytes() -> None:
    blocks, dense = block_weight(Q.Q4_1, 96, 576, seed=0)
    # a byte a weight, and a float32 scale and offset a block of 32
    assert blocks.nbytes == 96 * 576 + 2 * 96 * 18 * 4
    assert blocks.nbytes < 0.32 * F32StripWeight.pack(dense).nbytes
    assert blocks.shape == dense.shape and blocks.dtype == torch.float32


@pytest.fixture(scope="module")
def llama_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama as llama.cpp's quantize writes the default model: Q4_1 matrices, the
    token table (tied to the LM head) in Q8_0."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(CONFIGS["llama"](), dtype=torch.float32).eval()
    directory = tmp_path_factory.mktemp("f32-blocks")
    return write(
        model,
        directory / "llama-Q4_1.gguf",
        model_files.default_gguf_path(),
        matrices=Q.Q4_1,
        embedding=True,
    )


def answers(path: Path) -> tuple[list[list[float]], dict[str, list[int]], type]:
    core = make_core(path, dtype="float32", quantization="none", device="cpu")
    head = type(core.runner.own.lm_head) if core.runner.own is not None else type(None)
    prompts = random_prompts([9, 33, 5], seed=7, vocab=VOCAB)
    reqs = [request(str(i), p, max_tokens=8, prompt_logprobs=0) for i, p in enumerate(prompts)]
    got = run(core, reqs)
    logprobs = [[lp.logprobs[0] for lp in got[str(i)].prompt_logprobs[1:]] for i in range(3)]
    return logprobs, {k: v.token_ids for k, v in got.items()}, head


def test_an_engine_on_the_blocks_answers_as_one_on_a_dense_copy(
    llama_file: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TRIO_LLM_CACHE", str(tmp_path))
    blocks = answers(llama_file)
    monkeypatch.setenv(f32_rows.BLOCKS_ENV, "0")
    dense = answers(llama_file)
    assert blocks[2] is F32BlockWeight and dense[2] is F32StripWeight
    assert blocks[:2] == dense[:2]


def test_only_float32_on_the_own_forward_keeps_blocks(
    llama_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = model_files.resolve_model(str(llama_file))
    config = load_config(source)

    def how(dtype: torch.dtype, model_impl: str = "auto") -> str:
        return quantized.plan("none", source, config, "cpu", model_impl, dtype)[0]

    assert how(torch.float32) == "gguf-float32"
    assert how(torch.bfloat16) == "none"
    assert how(torch.float32, model_impl="transformers") == "none"
    monkeypatch.setenv(f32_rows.BLOCKS_ENV, "0")
    assert how(torch.float32) == "none"


def test_a_float_token_table_tied_to_the_head_is_held_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Q4_0 matrices with a float32 token table (not a block format), and no `output.weight`
    (llama.cpp's converter leaves it out of a tied model; this writer writes it, so the file
    is read as if it had not): the layers are blocks, and the tied head is the embedding's own
    dense table, not a second copy."""
    from transformers import AutoModelForCausalLM

    from trio_llm.engine.models import gguf_weights

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(CONFIGS["llama"](), dtype=torch.float32).eval()
    path = write(model, tmp_path / "llama-Q4_0.gguf", model_files.default_gguf_path(), Q.Q4_0)
    has = gguf_weights.GGUFWeights.has
    monkeypatch.setattr(
        gguf_weights.GGUFWeights, "has", lambda g, name: name != "output.weight" and has(g, name)
    )
    weights = gguf_weights.load_weights(path, model.config, torch.float32, float_blocks=True)
    assert weights.lm_head is weights.embed
    assert all(isinstance(layer.qkv, F32BlockWeight) for layer in weights.layers)
    assert torch.equal(weights.embed, model.model.embed_tokens.weight.detach())
