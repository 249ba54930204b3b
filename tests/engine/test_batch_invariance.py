"""Batch invariance (engine/plans/invariance.py) on this machine's real matmuls: a request gets
the same tokens alone, in any company, however its prompt is chunked, after a preemption, from a
prefix-cache hit on blocks that decodes filled, with jump-forward drafts, and as one of n
choices; and each CPU class's choice, with faked flags.

The requests ask for their tokens' logprobs, compared bitwise: a row computed two ways shows
there even where the tiny model's token does not flip (in float32 it seldom would)."""

from __future__ import annotations

from pathlib import Path

import architectures
import engine_helpers
import numpy as np
import pytest
import torch
import transformers
from engine_helpers import random_prompts, request, run

from trio_llm.constraint import Constraint
from trio_llm.engine.attention import StepLayout
from trio_llm.engine.attention.torch_backend import TorchAttentionMetadata
from trio_llm.engine.models import loader
from trio_llm.engine.models.gguf_weights import weights_nbytes
from trio_llm.engine.ops import (
    bf16_rows,
    f32_rows,
    int4_rows,
    int_rows,
    matmul,
    paged_decode,
    threads,
)
from trio_llm.engine.ops.matmul import (
    BF16_AMX,
    BF16_AVX512,
    BF16_PLAIN,
    BF16_STRIPS,
    FP32_ONEDNN,
    FP32_STRIPS,
    PADDED,
    Matmul,
    MatmulPlan,
)
from trio_llm.engine.plans import invariance, invariant_modules
from trio_llm.engine.step.core import EngineConfigError, EngineCore
from trio_llm.ipc.messages import EngineCoreRequest

LENGTHS = [5, 17, 33, 65, 90, 120, 1, 45] * 4
"""Prompt lengths: with a budget of 64 tokens a step, 65 ends in a one-token chunk that runs as a
decode does; 1 is a prompt computed as a decode."""
AVX2_ONLY = frozenset({"avx", "avx2", "fma"})
AVX512_BF16 = AVX2_ONLY | {"avx512f", "avx512bw", "avx512_bf16"}
AMX = AVX512_BF16 | {"amx_tile", "amx_bf16"}
DTYPES = ["bfloat16", "float32"]


def make_core(model_dir: Path, **kwargs: object) -> EngineCore:
    """On the CPU whatever this machine has: batch invariance is built for the CPU path (on
    CUDA `on` is refused and `auto` is off, test_unavailable_reasons)."""
    kwargs.setdefault("device", "cpu")
    return engine_helpers.make_core(model_dir, **kwargs)


def requests(n: int = 32, max_tokens: int = 12) -> list[EngineCoreRequest]:
    """Greedy and seeded-sampling requests (alternating) of mixed prompt lengths."""
    out = []
    for i, prompt in enumerate(random_prompts(LENGTHS[:n], seed=21)):
        params = {"temperature": 0.8, "top_p": 0.95, "seed": 100 + i} if i % 2 else {}
        out.append(ask(str(i), prompt, max_tokens=max_tokens, **params))
    return out


def ask(request_id: str, prompt: list[int], **params: object) -> EngineCoreRequest:
    """A request for `max_tokens` tokens (EOS ignored) with their logprobs."""
    params.setdefault("ignore_eos", True)
    return request(request_id, prompt, logprobs=0, **params)


Output = tuple[list[int], list[float]]


def tokens(core: EngineCore, reqs: list[EngineCoreRequest]) -> dict[str, Output]:
    """Each request's tokens and their logprobs."""
    return {
        k: (v.token_ids, [lp.logprobs[0] for lp in v.logprobs]) for k, v in run(core, reqs).items()
    }


def alone(core: EngineCore, reqs: list[EngineCoreRequest]) -> dict[str, Output]:
    out: dict[str, Output] = {}
    for r in reqs:
        out.update(tokens(core, [r]))
    return out


@pytest.fixture(scope="module", params=DTYPES)
def dtype(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def solo(wide_model_dir: Path, dtype: str) -> dict[str, Output]:
    """Every request of `requests()` alone, whole prompts in one step: the reference."""
    core = make_core(wide_model_dir, dtype=dtype)
    assert core.runner.invariance.on, core.runner.invariance.reason  # auto is on here
    return alone(core, requests())


def test_32_requests_alone_and_together_get_the_same_tokens(
    wide_model_dir: Path, dtype: str, solo: dict[str, Output]
) -> None:
    # A small step budget chunks the prompts differently together than alone.
    core = make_core(wide_model_dir, dtype=dtype, max_num_batched_tokens=64)
    assert tokens(core, requests()) == solo
    assert alone(core, requests()[:6]) == {k: solo[k] for k in map(str, range(6))}


def test_a_preempted_request_recomputes_the_same_tokens(
    wide_model_dir: Path, dtype: str, solo: dict[str, Output]
) -> None:
    # Too few blocks for all 32 at once: the last ones are preempted and recompute their
    # prompts and outputs as prefills, which a decode computed the first time.
    core = make_core(wide_model_dir, dtype=dtype, kv_cache_memory="160KiB")
    assert tokens(core, requests()) == solo
    assert core.scheduler.num_preemptions > 0


def test_a_prefix_cache_hit_on_decode_filled_blocks_changes_nothing(
    wide_model_dir: Path, dtype: str
) -> None:
    """A second turn finds the first turn's output in the cache (K/V a decode computed); a
    fresh engine computes the same positions in one prefill."""
    (first, question) = random_prompts([40, 11], seed=5)
    warm = make_core(wide_model_dir, dtype=dtype)
    answer = tokens(warm, [ask("t1", first, max_tokens=40)])["t1"][0]
    turn = first + answer + question
    second = [
        ask("g", turn, max_tokens=10),
        ask("s", turn, max_tokens=10, temperature=1.0, seed=9),
    ]
    hits_before = warm.stats().prefix_cache_hits
    hit = tokens(warm, second)
    assert warm.stats().prefix_cache_hits - hits_before >= 2 * 64  # past the prompt tokens
    cold = make_core(wide_model_dir, dtype=dtype, enable_prefix_caching=False)
    assert hit == tokens(cold, second)


def test_n_choices_get_what_each_gets_alone(wide_model_dir: Path, dtype: str) -> None:
    """n > 1 as the frontend fans it out: n requests with one prompt and seeds seed + i, which
    share the prompt's blocks when admitted together."""
    (prompt,) = random_prompts([50], seed=8)
    choices = [ask(f"c{i}", prompt, max_tokens=10, temperature=1.0, seed=40 + i) for i in range(4)]
    core = make_core(wide_model_dir, dtype=dtype)
    together = tokens(core, choices)
    assert together == alone(make_core(wide_model_dir, dtype=dtype), choices)
    assert len({tuple(t) for t, _ in together.values()}) > 1


PATTERN = r'\{"name": "(alice|bob|carol)", "age": [1-9][0-9]?, "tags": \["(a|b)", "(c|d)"\]\}'


def test_structured_outputs_with_jump_forward_get_the_same_tokens(
    wide_model_dir: Path, dtype: str
) -> None:
    """Jump-forward computes a request's forced tokens as drafts in one chunk whose length the
    step's budget decides; the drafts' rows and their samples (seeded ones too) are what
    token-by-token decoding computes."""
    prompts = random_prompts([7, 30, 12, 55, 21, 40], seed=13)
    reqs = [
        ask(
            f"j{i}",
            p,
            max_tokens=60,
            ignore_eos=False,
            constraint=Constraint.regex(PATTERN),
            **({"temperature": 1.0, "seed": 70 + i} if i % 2 else {}),
        )
        for i, p in enumerate(prompts)
    ]
    plain = make_core(wide_model_dir, dtype=dtype, jump_forward=False)
    expected = alone(plain, reqs)
    jumping = make_core(wide_model_dir, dtype=dtype, max_num_batched_tokens=32)
    before = jumping.stats().num_steps
    assert alone(jumping, reqs) == expected
    assert jumping.stats().num_steps - before < plain.stats().num_steps  # drafts were taken
    assert tokens(jumping, reqs) == expected


@pytest.fixture(scope="module")
def gemma3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Gemma 3 (sliding windows of 16 beside full layers, a model no own forward
    covers)."""
    path = tmp_path_factory.mktemp("gemma3")
    architectures.build("gemma3", path)
    return path


def test_the_generic_path_with_sliding_windows_is_invariant(gemma3_dir: Path) -> None:
    prompts = random_prompts([5, 40, 70, 1, 33, 90], seed=4, vocab=architectures.VOCAB)
    reqs = [
        ask(str(i), p, max_tokens=10, **({"temperature": 1.0, "seed": i} if i % 2 else {}))
        for i, p in enumerate(prompts)
    ]
    core = make_core(gemma3_dir, dtype="bfloat16", max_num_batched_tokens=32)
    assert core.runner.invariance.on and core.runner.own is None
    assert tokens(core, reqs) == alone(make_core(gemma3_dir, dtype="bfloat16"), reqs)


@pytest.mark.parametrize(
    ("name", "why"), [("qwen3_moe", "Experts"), ("gpt2", "Conv1D")], ids=["experts", "conv1d"]
)
def test_on_is_refused_for_models_that_multiply_outside_linear_layers(
    tmp_path: Path, name: str, why: str
) -> None:
    """A mixture of experts multiplies the tokens routed to each expert in one grouped call,
    whose rows depend on the whole step's routing; GPT-2 multiplies in Conv1D modules."""
    architectures.build(name, tmp_path)
    with pytest.raises(EngineConfigError, match=f"cannot be kept: .*{why}"):
        make_core(tmp_path, batch_invariant="on")
    decision = make_core(tmp_path).runner.invariance
    assert not decision.on and why in decision.reason


def test_a_final_logit_soft_cap_keeps_invariance_on_one_thread_only() -> None:
    config = architectures.CONFIGS["gemma2"]()
    model = transformers.Gemma2ForCausalLM(config)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert "soft-cap" in (invariant_modules.unsupported_modules(model) or "")
        torch.set_num_threads(1)
        assert invariant_modules.unsupported_modules(model) is None
    finally:
        torch.set_num_threads(before)


def test_the_transformers_path_is_invariant_too(wide_model_dir: Path) -> None:
    """transformers' modules with the engine's matmuls put in place of their Linears."""
    reqs = requests(n=8)
    core = make_core(wide_model_dir, model_impl="transformers", max_num_batched_tokens=64)
    assert core.runner.invariance.on and core.runner.own is None
    linears = [m for m in core.runner.model.modules() if isinstance(m, torch.nn.Linear)]
    assert not linears
    assert tokens(core, reqs) == alone(make_core(wide_model_dir, model_impl="transformers"), reqs)


# -- the pieces -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("window", "softcap"), [(None, None), (40, None), (None, 20.0)], ids=["full", "window", "cap"]
)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("in_place", [True, False], ids=["in-place", "sdpa-buckets"])
def test_a_query_attends_alike_as_a_decode_and_in_any_prefill_chunk(
    dtype: torch.dtype,
    window: int | None,
    softcap: float | None,
    in_place: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Sliding-window and soft-capped layers too (engine/models/generic.py's models); every
    query on the in-place decode kernel where it is built, else on SDPA over key buckets."""
    if in_place and paged_decode.extension() is None:
        pytest.skip("the in-place decode kernel needs a C++ compiler")
    monkeypatch.setenv(paged_decode.ENV, "1" if in_place else "0")
    heads, kv_heads, dim, block = 4, 2, 16, 16
    length = 150
    g = torch.Generator().manual_seed(3)
    cache_shape = (12, block, kv_heads, dim)
    k_cache = torch.randn(cache_shape, generator=g).to(dtype)
    v_cache = torch.randn(cache_shape, generator=g).to(dtype)
    table = np.array([[7, 2, 9, 0, 11, 4, 1, 8, 3, 10]])
    slots = table[0, np.arange(length) // block] * block + np.arange(length) % block
    q = torch.randn(length, heads, dim, generator=g).to(dtype)

    def attend(positions: list[range]) -> torch.Tensor:
        """Rows of `positions`, each range one sequence's chunk (a 1-long range: a decode);
        the single-token chunks go first, as the scheduler orders them."""
        chunks = sorted(positions, key=lambda r: len(r) > 1)
        rows = np.concatenate([np.asarray(r) for r in chunks])
        layout = StepLayout(
            num_decodes=sum(len(r) == 1 for r in chunks),
            block_tables=np.repeat(table, len(chunks), axis=0),
            cu_seqlens_q=np.cumsum([0] + [len(r) for r in chunks]),
            context_lens=np.array([r.stop for r in chunks]),
            slot_mapping=slots[rows],
            key_bucket=invariance.KEY_BUCKET,
        )
        meta = TorchAttentionMetadata.build(layout, k_cache)
        assert (meta.decode is not None and meta.decode.in_place is not None) == in_place
        rows_t = torch.from_numpy(slots[rows])
        k = k_cache.view(-1, kv_heads, dim)[rows_t]  # what is there already: nothing changes
        v = v_cache.view(-1, kv_heads, dim)[rows_t]
        out = meta.forward(
            q[rows], k, v, k_cache, v_cache, dim**-0.5, window=window, softcap=softcap
        )
        return out[np.argsort(rows, kind="stable")]

    whole = attend([range(0, length)])
    as_decodes = torch.cat([attend([range(p, p + 1)]) for p in range(length)])
    assert torch.equal(as_decodes, whole)
    chunked = attend([range(0, 37), range(37, 100), range(100, length)])
    assert torch.equal(chunked, whole)
    mixed = attend([range(5, 6), range(64, 65), range(100, 149), range(149, 150)])
    assert torch.equal(mixed, whole[[5, 64, *range(100, length)]])


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    ("plan", "dtype"),
    [
        (FP32_ONEDNN, torch.float32),
        (FP32_STRIPS, torch.float32),
        (BF16_AVX512, torch.bfloat16),
        (BF16_STRIPS, torch.bfloat16),
        (BF16_AMX, torch.bfloat16),
        (PADDED, torch.bfloat16),
        (PADDED, torch.float32),
    ],
)
def test_a_plan_computes_each_row_as_alone_at_any_offset(
    plan: MatmulPlan, dtype: torch.dtype, threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A oneDNN bf16 plan holds on its CPU class only: oneDNN takes AMX tiles where the CPU
    # has them, and there the AVX512-BF16 plan's call shapes are not row-exact. The strip
    # plan's own kernel sums one way on any machine; every shape here is the kernel's.
    flags = loader.cpu_flags()
    machine = "amx" if "amx_bf16" in flags else "avx512_bf16" if "avx512_bf16" in flags else None
    avx512 = (BF16_AVX512, BF16_STRIPS)
    onednn_class = {BF16_AMX: "amx", BF16_AVX512: "avx512_bf16"}.get(plan)
    if onednn_class not in (None, machine):
        pytest.skip(f"the plan of another CPU class (this one's: {machine})")
    if plan is BF16_STRIPS and int4_rows.path() not in int4_rows.FAST_PATHS:
        pytest.skip("the strip kernel's scalar path (tests/engine/test_bf16_rows.py) is slow")
    if plan is FP32_STRIPS and not f32_rows.available():
        pytest.skip("the float32 strip kernel needs a C++ compiler and FMA")
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        shapes = [(96, 64), (64, 1536), (200, 2100)]
        assert invariance.check_matmul(Matmul(plan), shapes, dtype, torch.device("cpu")) is None
        if plan in avx512:
            # Narrow shapes, and rows enough to see them: oneDNN's plain bf16 matmul summed
            # these rows another way in calls of 2 and of 16 rows on an EPYC (the tiny test
            # model's K and V projections), which 40 rows missed.
            monkeypatch.setattr(invariance, "CHECK_ROWS", 256)
            for narrow in [(32, 64), (48, 64)]:
                cpu = torch.device("cpu")
                assert invariance.check_matmul(Matmul(plan), [narrow], dtype, cpu) is None
    finally:
        torch.set_num_threads(before)


def test_the_check_tries_calls_as_large_as_the_step_budget() -> None:
    """A matmul that blocks calls of 300 rows or more another way (as a library may for
    large calls) passes a check of calls up to 257 rows and fails one of the engine's budget."""

    class BlocksLargeCalls(Matmul):
        def __call__(self, x: torch.Tensor, weight: object, bias: object = None) -> torch.Tensor:
            out = super().__call__(x, weight, bias)  # type: ignore[arg-type]
            return out + 1e-3 if x.shape[0] >= 300 else out

    matmul, shapes = BlocksLargeCalls(PADDED), [(32, 64)]
    cpu = torch.device("cpu")
    assert 512 in invariance.call_sizes(512) and max(invariance.call_sizes(257)) == 257
    assert invariance.check_matmul(matmul, shapes, torch.float32, cpu, max_rows=257) is None
    failed = invariance.check_matmul(matmul, shapes, torch.float32, cpu, max_rows=512)
    assert failed is not None and "calls of 512 rows" in failed


@pytest.mark.parametrize(
    "plan", [FP32_ONEDNN, FP32_STRIPS, BF16_AVX512, BF16_STRIPS, BF16_AMX, PADDED]
)
def test_a_plan_computes_what_a_plain_matmul_does_in_value(plan: MatmulPlan) -> None:
    if plan is BF16_STRIPS and not bf16_rows.available():
        pytest.skip("the strip kernel needs a C++ compiler")
    if plan is FP32_STRIPS and not f32_rows.available():
        pytest.skip("the float32 strip kernel needs a C++ compiler and FMA")
    dtype = torch.float32 if plan in (FP32_ONEDNN, FP32_STRIPS) else torch.bfloat16
    x, w = torch.randn(77, 2100).to(dtype), torch.randn(40, 2100).to(dtype)
    b = torch.randn(40).to(dtype)
    matmul = Matmul(plan)
    weight = matmul.prepare(w)
    plain = torch.nn.functional.linear(x.float(), w.float(), b.float())
    for rows in (slice(None), slice(0, 1), slice(3, 40)):
        got = matmul(x[rows], weight, b).float()
        torch.testing.assert_close(got, plain[rows], rtol=3e-2, atol=0.5)


@pytest.mark.parametrize(
    ("flags", "bf16", "fp32"),
    [
        (AVX2_ONLY, BF16_PLAIN, FP32_STRIPS),
        (AVX512_BF16, BF16_STRIPS, FP32_STRIPS),
        (AMX, BF16_STRIPS, FP32_STRIPS),
    ],
    ids=["avx2-only", "avx512-bf16", "amx"],
)
def test_each_cpu_class_gets_its_plan(
    flags: frozenset[str], bf16: MatmulPlan, fp32: MatmulPlan, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bf16_rows, "available", lambda: True)
    monkeypatch.setattr(f32_rows, "available", lambda: True)
    assert matmul.plan_for(torch.bfloat16, flags) is bf16
    assert matmul.plan_for(torch.float32, flags) is fp32
    assert matmul.plan_for(torch.float16, flags) is None


def test_without_the_strip_kernel_avx512_bf16_takes_onednn(monkeypatch: pytest.MonkeyPatch) -> None:
    """`TRIO_LLM_BF16_ROWS=0`, or no C++ compiler: oneDNN's inner product, lone rows padded;
    with AMX, oneDNN in calls of at most 32 rows."""
    monkeypatch.setenv(bf16_rows.ENV, "0")
    assert matmul.plan_for(torch.bfloat16, AVX512_BF16) is BF16_AVX512
    assert matmul.plan_for(torch.bfloat16, AMX) is BF16_AMX


def test_an_amx_plan_tiles_its_calls(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With an AMX machine's flags and no strip kernel, bf16 matmuls go in calls of at most 32
    rows; this machine's oneDNN computes those row-exactly where no inner dimension passes 1024
    (the tiny model)."""
    monkeypatch.setattr(loader, "cpu_flags", lambda: AMX)
    monkeypatch.setenv(bf16_rows.ENV, "0")
    core = make_core(tiny_model_dir, dtype="bfloat16")
    engine_matmul = core.runner.invariance.matmul
    assert core.runner.invariance.on and engine_matmul.plan is BF16_AMX
    calls: list[int] = []
    monkeypatch.setattr(matmul.F, "linear", lambda x, w, b=None: calls.append(len(x)) or x @ w.T)
    engine_matmul(
        torch.zeros(70, 64, dtype=torch.bfloat16), torch.zeros(8, 64, dtype=torch.bfloat16)
    )
    assert calls == [32, 32, 6]


def test_off_is_off(tiny_model_dir: Path) -> None:
    """Off: no invariant plan; the matmuls on weights packed for oneDNN once where it runs
    (F.linear would repack them every call), with F.linear's products."""
    decision = make_core(tiny_model_dir, batch_invariant="off").runner.invariance
    assert not decision.on
    plan = decision.matmul.plan
    assert plan is None or (plan.packed and not plan.invariant)
    weight = torch.randn(48, 64)
    x = torch.randn(5, 64)
    got = decision.matmul(x, decision.matmul.prepare(weight))
    torch.testing.assert_close(got, torch.nn.functional.linear(x, weight))


def test_auto_turns_off_and_on_falls_back_where_the_check_fails(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        invariance,
        "check_matmul",
        lambda matmul, *_: None if matmul.plan is PADDED else "rows differ in calls of 7",
    )
    auto = make_core(tiny_model_dir).runner.invariance
    assert not auto.on and auto.reason == "rows differ in calls of 7"
    on = make_core(tiny_model_dir, batch_invariant="on").runner.invariance
    assert on.on and on.matmul.plan is PADDED
    monkeypatch.setattr(invariance, "check_matmul", lambda *_: "rows differ in calls of 7")
    with pytest.raises(EngineConfigError, match="cannot be kept: rows differ in calls of 7"):
        make_core(tiny_model_dir, batch_invariant="on")


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"single_token_dtype": "bfloat16"}, "single-token-dtype"),
        ({"attention_backend": "triton"}, "triton attention backend"),
    ],
)
def test_on_is_refused_at_start_where_it_cannot_be_kept(
    tiny_model_dir: Path, kwargs: dict[str, object], reason: str
) -> None:
    if kwargs.get("attention_backend") == "triton":
        pytest.importorskip("triton")
    with pytest.raises(EngineConfigError, match=reason):
        make_core(tiny_model_dir, batch_invariant="on", **kwargs)
    assert not make_core(tiny_model_dir, **kwargs).runner.invariance.on  # auto: off


def test_unavailable_reasons() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    ok = {"backend": "torch", "single_token": False, "model_path": None}
    assert invariance.unavailable_reason(torch.bfloat16, cpu, **ok) is None  # type: ignore[arg-type]
    assert "cuda" in (invariance.unavailable_reason(torch.bfloat16, cuda, **ok) or "")  # type: ignore[arg-type]
    from transformers.pytorch_utils import Conv1D

    model = torch.nn.Sequential(Conv1D(8, 4), torch.nn.Linear(8, 8))
    assert "Conv1D" in (invariant_modules.unsupported_modules(model) or "")
    assert invariant_modules.unsupported_modules(torch.nn.Sequential(torch.nn.Linear(4, 4))) is None


def test_mkl_reproducibility_is_on_in_this_process() -> None:
    """tests/conftest.py sets MKL_CBWR as the engine process sets CNR first thing."""
    assert threads.mkl_reproducible()
    assert threads.enable_reproducible_mkl()


@pytest.mark.parametrize("batch_invariant", ["on", "off"])
def test_the_own_forward_s_weights_are_counted_on_any_plan(
    tiny_model_dir: Path, batch_invariant: str
) -> None:
    """Packed for oneDNN (invariance's fp32 plan, or `PACKED` for speed with it off) a weight
    holds what it held as a tensor: the memory bench/weights/quant_survey.py reports (a tied
    LM head packed is a copy of the embedding of its own)."""
    core = engine_helpers.make_core(tiny_model_dir, batch_invariant=batch_invariant)
    own = core.runner.own
    assert own is not None
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    held = sum(p.numel() * 4 for p in model.parameters())  # tied: the embedding once
    if own.lm_head is not own.embed:
        held += model.lm_head.weight.numel() * 4
    assert weights_nbytes(own) == held


@pytest.mark.parametrize(
    ("float_path", "int_path", "dtype", "on", "exact"),
    [
        ("avx512_bf16", "vnni", "bfloat16", True, True),  # the integer kernel: nearly free
        ("avx512_bf16", None, "bfloat16", True, True),  # the float kernel: the same
        ("avx512_bf16", "vnni", "float32", True, True),  # float32: prefill 0.97-1.02x
        ("generic", "avx2", "float32", True, True),  # the AVX2-only class's default
        ("amx", "vnni", "bfloat16", False, True),  # few rows (prefill 1.7-2.2x with it)
        ("amx", None, "bfloat16", False, False),  # no integer kernel: torch's
    ],
)
def test_auto_keeps_quantized_weights_invariant_where_it_costs_nothing(
    tiny_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    float_path: str,
    int_path: str | None,
    dtype: str,
    on: bool,
    exact: bool,
) -> None:
    """`auto` with quantized weights: on where a row-exact kernel is the default's for every
    row anyway (AVX512-BF16 without AMX, faked here: the integer kernel, or the float one
    without VNNI; AVX2 alone, the integer kernel's AVX2 path, where the dtype is float32) and
    attention reads the cache in place (float32: each prompt query on the decode kernel), every
    row on that kernel and no dense copy; off on AMX, where a prefill would pay for it
    (ops/row_exact.py), its few rows on the integer kernel or torch's."""
    if (
        int4_rows.KERNEL.extension() is None
        or int_rows.KERNEL.extension() is None
        or paged_decode.extension() is None
    ):
        pytest.skip("the row-exact and in-place kernels need a C++ compiler")
    monkeypatch.setattr(int4_rows, "path", lambda allow_amx=True: float_path)
    monkeypatch.setattr(int_rows, "path", lambda best="vnni": int_path)
    core = engine_helpers.make_core(tiny_model_dir, quantization="int4", dtype=dtype, device="cpu")
    assert core.runner.invariance.on == on
    assert (core.runner.dense_copies is None) == on
    own = core.runner.own
    assert own is not None
    assert all(getattr(w, "exact", None) is not None for w in own.matrices()) == exact
    if on:  # a request's tokens alone are its tokens beside others
        prompts = engine_helpers.random_prompts([5, 17, 40], seed=2, vocab=200)
        reqs = [engine_helpers.request(str(i), p, max_tokens=6) for i, p in enumerate(prompts)]
        together = engine_helpers.run(core, reqs)
        for r in reqs:
            assert engine_helpers.run(core, [r])[r.request_id].token_ids == (
                together[r.request_id].token_ids
            )
