"""Every architecture of `architectures.CONFIGS` served by the engine gives transformers' own
greedy tokens (float32, the same weights): alone and batched with other requests, with chunked
prefill off and on, after a prefix-cache hit, after a preemption; and `--model-impl` says which
forward each took.

One tiny model per architecture (module scope), two engines on it: a roomy one (whole prompts in
a step, prompts alone then together, then a prompt that shares a cached prefix) and a cramped
one (8 tokens a step and a KV cache too small for the batch, so prompts are chunked and sequences
preempted and recomputed)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from architectures import COMMON, CONFIGS, VOCAB, WINDOW, build
from engine_helpers import hf_greedy, make_core, random_prompts, request, run

from trio_llm.config import EngineArgs
from trio_llm.engine.step.core import EngineCore
from trio_llm.model_files import UnsupportedModelError

NEW_TOKENS = 24
PROMPTS = random_prompts([5, 23, 41], seed=7, vocab=VOCAB)
SHARED = PROMPTS[2][:32] + random_prompts([6], seed=8, vocab=VOCAB)[0]
"""Shares two full blocks (32 tokens) with the longest prompt: a prefix-cache hit after it."""
assert max(map(len, PROMPTS)) > 2 * WINDOW  # the windows matter
OWN = {"llama", "qwen2", "mistral"}
MIXTURES = {"qwen3_moe", "mixtral", "olmoe"}
"""The architectures `--model-impl auto` runs on an own forward."""


@dataclass
class Case:
    name: str
    path: Path
    expected: list[list[int]]
    """transformers' greedy tokens for PROMPTS, then for SHARED."""


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Case]:
    """Each architecture's tiny model and transformers' tokens, built once for the module."""
    built: dict[str, Case] = {}

    def case(name: str) -> Case:
        if name not in built:
            path = tmp_path_factory.mktemp(name)
            model = build(name, path)
            expected = [hf_greedy(model, p, NEW_TOKENS) for p in [*PROMPTS, SHARED]]
            built[name] = Case(name, path, expected)
        return built[name]

    return case


RUNS = [(name, "auto") for name in sorted(CONFIGS)] + [(n, "transformers") for n in sorted(OWN)]
"""Every architecture as `--model-impl auto` runs it, and those auto runs on an own forward on
transformers' modules too."""


def _requests(prompts: list[list[int]], tag: str) -> list:
    return [request(f"{tag}{i}", p, max_tokens=NEW_TOKENS) for i, p in enumerate(prompts)]


@pytest.mark.parametrize(("name", "impl"), RUNS)
def test_alone_batched_and_after_a_prefix_hit(
    cases: Callable[[str], Case], name: str, impl: str
) -> None:
    case = cases(name)
    core = make_core(case.path, model_impl=impl)
    alone = run(core, _requests(PROMPTS[:1], "alone"))
    assert alone["alone0"].token_ids == case.expected[0], "alone"
    together = run(core, _requests(PROMPTS, "batch"))
    for i in range(len(PROMPTS)):
        assert together[f"batch{i}"].token_ids == case.expected[i], f"batched, prompt {i}"
    hit = run(core, [request("hit", SHARED, max_tokens=NEW_TOKENS)])["hit"]
    assert hit.num_cached_tokens >= 32
    assert hit.token_ids == case.expected[-1], "after a prefix-cache hit"
    if name == "gemma4":  # local and global layers' caches differ in head dim
        assert set(core.runner.spec.layers) == {(2, 16), (2, 32)}
    if name in MIXTURES:
        # Each expert computes its routed tokens in one grouped call, not every token.
        assert core.runner.model.config._experts_implementation == "grouped_mm"


@pytest.mark.parametrize(("name", "impl"), RUNS)
def test_chunked_and_preempted(cases: Callable[[str], Case], name: str, impl: str) -> None:
    case = cases(name)
    roomy = make_core(case.path)
    block_bytes = roomy.ready.kv_cache_bytes // roomy.ready.num_blocks
    # Eight blocks for a batch that reaches 14: sequences are preempted and recomputed.
    core = make_core(
        case.path, max_num_batched_tokens=8, kv_cache_memory=8 * block_bytes, model_impl=impl
    )
    got = run(core, _requests([*PROMPTS, SHARED], "c"))
    assert core.stats().num_preemptions > 0
    for i, expected in enumerate(case.expected):
        assert got[f"c{i}"].token_ids == expected, f"chunked and preempted, prompt {i}"


@pytest.mark.parametrize(
    ("impl", "name", "own"),
    [
        ("auto", "llama", "LlamaForward"),
        ("auto", "gemma2", None),
        ("transformers", "llama", None),
    ],
)
def test_model_impl_says_which_forward_and_why(
    tmp_path: Path, impl: str, name: str, own: str | None
) -> None:
    build(name, tmp_path)
    stages: list[str] = []
    args = EngineArgs(model=str(tmp_path), dtype="float32", kv_cache_memory="8MiB", model_impl=impl)
    core = EngineCore(args, on_stage=stages.append)
    choice = core.runner.choice
    assert choice.own == own
    assert f"forward: {choice.describe()}" in stages
    if impl == "transformers":
        assert "--model-impl transformers" in choice.reason
    elif own is None:
        assert "no own forward covers Gemma2ForCausalLM" in choice.reason
        assert "Gemma2ForCausalLM is not of the Llama family" in choice.reason


def test_model_impl_own_refuses_a_model_no_own_forward_covers(tmp_path: Path) -> None:
    build("gpt2", tmp_path)
    with pytest.raises(UnsupportedModelError, match="--model-impl own: no own forward for GPT2"):
        make_core(tmp_path, model_impl="own")


@pytest.mark.parametrize(
    ("config", "overrides", "reason"),
    [
        ("GptOssConfig", {"num_local_experts": 4, "head_dim": 16}, "needs attention sinks"),
        ("BloomConfig", {"n_layer": 2, "n_head": 4}, "computes its attention itself"),
        ("Llama4TextConfig", {"head_dim": 16}, "chunked_attention"),
        (
            "Qwen3NextConfig",
            {"head_dim": 16, "num_experts": 4, "linear_num_key_heads": 2},
            "linear_attention",
        ),
        ("FuyuConfig", {}, "composite .multimodal. config"),
    ],
)
def test_what_the_paged_attention_cannot_run_is_refused_at_start_with_the_reason(
    tmp_path: Path, config: str, overrides: dict[str, object], reason: str
) -> None:
    import transformers

    cfg = getattr(transformers, config)(**{**COMMON, "num_experts_per_tok": 2, **overrides})
    cfg.architectures = [transformers.AutoModelForCausalLM._model_mapping[type(cfg)].__name__]
    if config == "GptOssConfig":  # refused only once its layers are seen: it needs weights
        transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path)
    else:
        cfg.save_pretrained(tmp_path)
    with pytest.raises(UnsupportedModelError, match=reason):
        make_core(tmp_path)
