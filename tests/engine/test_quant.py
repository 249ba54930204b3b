"""Quantized weights (engine/quant): GGUF block formats unpacked exactly, the kernels' results
against a float reference, row-exactness at every batch size, a GGUF file's tensors loaded into
the own forward's fused weights (names, Q/K row order, formats), and float checkpoints
quantized at load."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from engine_helpers import make_core, random_prompts, request, run
from gguf import GGML_QUANT_SIZES, GGUFWriter, quants
from gguf import GGMLQuantizationType as Q

from trio_llm.engine.models import gguf_weights
from trio_llm.engine.models.llama import LlamaForward
from trio_llm.engine.ops import row_exact
from trio_llm.engine.quant import (
    Int4Weight,
    Int8Weight,
    dispatching,
    gguf_blocks,
    quantize_int4,
    quantize_int8,
)
from trio_llm.engine.quant.weights import W8A8_FEW_ROWS, int8_matmul_exact, split_int8

BF16 = torch.bfloat16


def random_blocks(kind: Q, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Raw GGUF bytes of a [rows, cols] tensor: random values, with small finite fp16 scales."""
    rng = np.random.default_rng(seed)
    block, size = GGML_QUANT_SIZES[kind]
    raw = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    scale_fields = {Q.Q4_0: [0], Q.Q4_1: [0, 2], Q.Q4_K: [0, 2], Q.Q8_0: [0], Q.Q6_K: [208]}
    for offset in scale_fields[kind]:
        d = (rng.random(raw.shape[:2]) * 0.05).astype(np.float16)
        raw[..., offset : offset + 2] = d.view(np.uint8).reshape(*raw.shape[:2], 2)
    return raw.reshape(rows, -1)


def dense(weight: Int4Weight | Int8Weight) -> torch.Tensor:
    """The float matrix a quantized weight stands for, through its own kernel."""
    eye = torch.eye(weight.shape[1], dtype=BF16)
    return weight.matmul(eye, None).t().float()


@pytest.mark.parametrize("kind", [Q.Q4_0, Q.Q4_1, Q.Q4_K])
def test_four_bit_blocks_unpack_exactly(kind: Q) -> None:
    raw = random_blocks(kind, 6, 512)
    q, scale, zero = gguf_blocks.unpack_int4(kind, raw)
    ours = (q.astype(np.float32) - 8) * np.repeat(scale, 32, 1) + np.repeat(zero, 32, 1)
    np.testing.assert_array_equal(ours, quants.dequantize(raw, kind).reshape(6, 512))


@pytest.mark.parametrize("kind", [Q.Q4_0, Q.Q4_1, Q.Q4_K])
def test_int4_kernel_computes_the_file_values(kind: Q) -> None:
    raw = random_blocks(kind, 48, 256, seed=1)
    q, scale, zero = (torch.from_numpy(a) for a in gguf_blocks.unpack_int4(kind, raw))
    weight = Int4Weight.pack(q, scale, zero, BF16)
    reference = torch.from_numpy(quants.dequantize(raw, kind).reshape(48, 256))
    x = torch.randn(5, 256).to(BF16)
    expected = x.float() @ reference.t()
    got = weight.matmul(x, None).float()
    # bf16 scales (8 bits of mantissa) and a bf16 output: about 1% of the output's scale.
    assert (got - expected).abs().max() <= 0.01 * expected.abs().max()


def test_q8_0_runs_exactly_as_two_int4_planes() -> None:
    raw = random_blocks(Q.Q8_0, 100, 256, seed=4)
    q, d = (torch.from_numpy(a) for a in gguf_blocks.unpack_q8_0(raw))
    weight = split_int8(q, d, BF16)
    reference = torch.from_numpy(quants.dequantize(raw, Q.Q8_0).reshape(100, 256))
    # The planes' values are the file's: only the scales' bf16 rounding differs.
    d16 = d.to(BF16).float().repeat_interleave(32, 1)
    assert torch.equal(weight.dequantize().float(), (q.float() * d16).to(BF16).float())
    assert (weight.dequantize().float() - reference).abs().max() <= 0.01 * reference.abs().max()
    ids = torch.tensor([0, 31, 32, 63, 64, 99])
    assert torch.equal(weight.rows(ids), weight.dequantize()[ids])
    x = torch.randn(3, 256).to(BF16)
    expected = x.float() @ reference.t()
    assert (weight.matmul(x, None).float() - expected).abs().max() < 0.01 * expected.abs().max()


@pytest.mark.parametrize("kind", [Q.Q8_0, Q.Q6_K])
def test_finer_formats_become_int8_rows_within_half_a_step(kind: Q) -> None:
    raw = random_blocks(kind, 32, 256, seed=2)
    values = gguf_blocks.dequantize(kind, raw, (32, 256))
    weight = quantize_int8(values, torch.float32)
    restored = weight.q.float() * weight.scales[:, None]
    assert ((restored - values).abs() <= weight.scales[:, None] * (0.5 + 1e-5)).all()


def test_int4_pads_rows_to_the_kernels_tile() -> None:
    w = torch.randn(40, 64)
    weight = quantize_int4(w, BF16)
    assert weight.shape == (40, 64)
    # Half a step of a group whose range is at most twice the largest magnitude, plus bf16.
    assert (dense(weight) - w).abs().max() < w.abs().max() / 15 * 1.1


@pytest.mark.parametrize("make", [quantize_int4, quantize_int8], ids=["int4", "int8"])
def test_quantized_matmuls_are_row_exact_at_every_batch_size(make) -> None:
    """Each row comes out bitwise the same alone or among any number of others: the batch
    invariance that float matmuls give only in tiles."""
    torch.manual_seed(0)
    weight = make(torch.randn(192, 576) * 0.05, BF16)
    x = torch.randn(70, 576).to(BF16)
    alone = torch.cat([weight.matmul(x[i : i + 1], None) for i in range(70)])
    for rows in (2, 3, 8, 17, 33, 64, 70):
        assert torch.equal(weight.matmul(x[:rows], None), alone[:rows]), rows


def test_the_hook_sends_quantized_weights_to_their_kernel_and_floats_to_the_runner() -> None:
    calls = []

    def inner(x, w, b):
        calls.append(w.shape)
        return torch.nn.functional.linear(x, w, b)

    linear = dispatching(inner)
    x = torch.randn(2, 64).to(BF16)
    int8 = quantize_int8(torch.randn(32, 64), BF16)
    linear(x, int8, None)
    assert calls == []
    linear(x, torch.randn(16, 64).to(BF16), None)
    assert calls == [torch.Size([16, 64])]


def _llama_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """What llama.cpp's converter does to the Q and K rows of a llama model."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def write_gguf(model: torch.nn.Module, path: Path, kinds: dict[str, Q]) -> Path:
    """The model's tensors as llama.cpp names and orders them, each in `kinds`' format for its
    GGUF name's suffix (attn_q, ffn_down, ...; Q8_0 for the rest of the matrices)."""
    config = model.config
    writer = GGUFWriter(str(path), "llama")
    names = {
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    tensors = {
        "token_embd": model.model.embed_tokens.weight,
        "output_norm": model.model.norm.weight,
    }
    for i, layer in enumerate(model.model.layers):
        for hf, gg in names.items():
            module = layer.get_submodule(hf)
            tensors[f"blk.{i}.{gg}"] = module.weight
    for name, tensor in tensors.items():
        w = tensor.detach().float().numpy()
        if name.endswith("attn_q"):
            w = _llama_permute(w, config.num_attention_heads)
        elif name.endswith("attn_k"):
            w = _llama_permute(w, config.num_key_value_heads)
        if w.ndim == 1:
            writer.add_tensor(f"{name}.weight", w)
            continue
        kind = kinds.get(name.split(".")[-1], Q.Q8_0)
        writer.add_tensor(f"{name}.weight", quants.quantize(w, kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def tiny(tiny_model_dir: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def test_gguf_tensors_load_into_the_fused_layers_in_their_formats(
    tiny: torch.nn.Module, tmp_path: Path
) -> None:
    kinds = {
        "attn_q": Q.Q4_0,
        "attn_k": Q.Q4_0,
        "attn_v": Q.Q4_1,
        "ffn_gate": Q.Q4_1,
        "ffn_up": Q.Q4_1,
        "ffn_down": Q.Q4_0,
        "attn_output": Q.Q8_0,
    }
    path = write_gguf(tiny, tmp_path / "tiny.gguf", kinds)
    weights = gguf_weights.load_weights(path, tiny.config, BF16)
    reference = LlamaForward(tiny, 64)
    for ours, theirs in zip(weights.layers, reference.layers, strict=True):
        assert isinstance(ours.qkv, Int4Weight)  # Q4_0 and Q4_1 share the int4 form
        assert isinstance(ours.gate_up, Int4Weight) and isinstance(ours.down, Int4Weight)
        assert isinstance(ours.o, Int4Weight) and ours.o.split  # Q8_0: two exact planes
        for mine, float_weight in (
            (ours.qkv, theirs.qkv),
            (ours.gate_up, theirs.gate_up),
            (ours.down, theirs.down),
            (ours.o, theirs.o),
        ):
            # Q4 with the 0.2-wide init: a step is about a fifteenth of a group's range.
            error = (dense(mine) - float_weight).abs().max()
            assert error < float_weight.abs().max() / 7, error
    # The tied embedding and LM head: one copy (a Q8_0 vocabulary as int8 rows).
    assert weights.embed is weights.lm_head and isinstance(weights.embed, Int8Weight)
    ids = torch.tensor([0, 5, 63, 64, 200])
    table = tiny.model.embed_tokens.weight[ids]
    assert (weights.embed.rows(ids).float() - table).abs().max() < 0.01 * table.abs().max()
    assert torch.allclose(weights.norm.float(), tiny.model.norm.weight)


def test_the_q_and_k_rows_come_back_in_transformers_order(
    tiny: torch.nn.Module, tmp_path: Path
) -> None:
    """In F32 (no rounding at all), the loaded QKV equals the model's fused QKV exactly."""
    path = tmp_path / "f32.gguf"
    writer_kinds = {n: Q.F32 for n in ("attn_q", "attn_k", "attn_v")}
    write_gguf(tiny, path, writer_kinds)
    weights = gguf_weights.load_weights(path, tiny.config, torch.float32)
    reference = LlamaForward(tiny, 64)
    assert torch.equal(weights.layers[0].qkv, reference.layers[0].qkv)


@pytest.mark.parametrize("kind", ["int8", "int4", "w8a8"])
def test_a_float_checkpoint_quantized_at_load_keeps_its_predictions(
    tiny_model_dir: Path, kind: str
) -> None:
    prompts = random_prompts([12, 30], seed=3)
    reqs = [request(str(i), p, max_tokens=1, prompt_logprobs=0) for i, p in enumerate(prompts)]
    # On the CPU whatever this machine has: the quantized kernels are CPU ones.
    base = run(make_core(tiny_model_dir, dtype="bfloat16", device="cpu"), reqs)
    core = make_core(tiny_model_dir, quantization=kind, dtype="auto", device="cpu")
    own = core.runner.own
    assert own is not None and own.quantized
    assert isinstance(own.lm_head, Int8Weight) and own.embed is own.lm_head
    quantized = run(core, reqs)
    for i in range(len(prompts)):
        a = [lp.logprobs[0] for lp in base[str(i)].prompt_logprobs[1:]]
        b = [lp.logprobs[0] for lp in quantized[str(i)].prompt_logprobs[1:]]
        # Mean absolute change of the prompt tokens' log-probabilities.
        # (bf16 alone moves them by a few hundredths; 4 bits of a random model's gaussian
        # weights by tenths; the real model's perplexity is checked in test_quant_quality.)
        assert np.mean(np.abs(np.subtract(a, b))) < (0.6 if kind == "int4" else 0.1)


@pytest.mark.parametrize("rows", [40, 64, 576])
def test_int4_dequantizes_to_what_its_kernel_multiplies_by(rows: int) -> None:
    weight = quantize_int4(torch.randn(rows, 96), BF16)
    assert torch.equal(weight.dequantize().float(), dense(weight).to(BF16).float())


def test_large_calls_dequantize_and_small_calls_stay_on_the_kernel() -> None:
    seen: list[int] = []

    def inner(x, w, b):
        seen.append(x.shape[0])
        return torch.nn.functional.linear(x, w, b)

    weight = quantize_int4(torch.randn(64, 64) * 0.1, BF16)
    dense_hook, exact_hook = dispatching(inner), dispatching(inner, dense=False)
    big = torch.randn(300, 64).to(BF16)
    expected = big.float() @ weight.dequantize().float().t()
    for hook in (dense_hook, exact_hook):
        assert (
            hook(big, weight, None).float() - expected
        ).abs().max() < 0.05 * expected.abs().max()
    assert seen == [300]  # only the dense hook's large call went to the float matmul
    dense_hook(big[:4], weight, None)
    assert seen == [300]


def test_int8_activations_are_row_exact_and_close_to_the_weight_only_kernel() -> None:
    torch.manual_seed(1)
    w = torch.randn(192, 576) * 0.05
    weight_only = quantize_int8(w, BF16)
    w8a8 = quantize_int8(w, BF16, int8_activations=True)
    x = torch.randn(40, 576).to(BF16)
    alone = torch.cat([w8a8.matmul(x[i : i + 1], None) for i in range(40)])
    assert torch.equal(w8a8.matmul(x, None), alone)
    reference = weight_only.matmul(x, None).float()
    assert (alone.float() - reference).abs().max() < 0.02 * reference.abs().max()


def test_w8a8_calls_of_few_rows_take_the_row_exact_kernel_only_without_invariance() -> None:
    """Without invariance a W8A8 call of fewer than W8A8_FEW_ROWS rows runs on the row-exact
    kernel's packing (torch._int_mm's set-up dominates there), close to the integer matmul;
    with invariance (`dense=False`) every call keeps the integer matmul, row-exact at any
    size."""
    packing = row_exact.kernel(False, BF16) or row_exact.kernel(True, BF16)
    if packing is None:
        pytest.skip("no row-exact kernel on this CPU class")
    if not int8_matmul_exact():
        pytest.skip("torch._int_mm saturates here: every W8A8 call takes the kernel")
    torch.manual_seed(2)
    weight = quantize_int8(torch.randn(192, 576) * 0.05, BF16, int8_activations=True)
    x = torch.randn(W8A8_FEW_ROWS, 576).to(BF16)
    integer = weight.matmul(x, None)
    weight.keep_few_rows(packing)
    assert weight.exact is not None
    few = dispatching(torch.nn.functional.linear)(x[:4], weight, None)
    assert torch.equal(few, weight.exact.matmul(x[:4]))
    assert (few.float() - integer[:4].float()).abs().max() < 0.02 * integer.abs().max().float()
    # At W8A8_FEW_ROWS rows, and with invariance at any size: the integer matmul.
    assert torch.equal(dispatching(torch.nn.functional.linear)(x, weight, None), integer)
    exact_hook = dispatching(torch.nn.functional.linear, dense=False)
    assert torch.equal(exact_hook(x[:4], weight, None), integer[:4])
