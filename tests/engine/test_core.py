"""EngineCore in-process: greedy equivalence with Hugging Face, chunking, preemption, prefix
caching, block accounting, seeds, priority and per-request errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from engine_helpers import hf_greedy, make_core, random_prompts, request, run

from trio_llm.engine.step.core import EngineConfigError, EngineCore
from trio_llm.model_files import ModelSource, load_tokenizer


@pytest.fixture(scope="module")
def hf_tiny(tiny_model_dir: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def core(tiny_model_dir: Path) -> EngineCore:
    return make_core(tiny_model_dir)


def assert_all_blocks_free(core: EngineCore) -> None:
    stats = core.stats()
    assert stats.num_free_blocks == stats.num_total_blocks
    assert stats.num_running == stats.num_waiting == 0
    assert not core.requests


LENGTHS = [1, 3, 9, 16, 17, 31, 64, 100]


def test_greedy_matches_hf_generate(core: EngineCore, hf_tiny: torch.nn.Module) -> None:
    prompts = random_prompts(LENGTHS)
    results = run(core, [request(str(i), p, max_tokens=12) for i, p in enumerate(prompts)])
    for i, prompt in enumerate(prompts):
        expected = hf_greedy(hf_tiny, prompt, 12)
        got = results[str(i)]
        assert got.token_ids == expected, f"prompt {i} ({len(prompt)} tokens)"
        assert got.finish_reason == ("stop" if len(expected) < 12 else "length")
    assert_all_blocks_free(core)


@pytest.mark.slow
def test_greedy_matches_hf_generate_on_the_default_model(default_model: ModelSource) -> None:
    from transformers import AutoModelForCausalLM

    tokenizer = load_tokenizer(default_model)
    texts = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]
    prompts = [tokenizer(t)["input_ids"] for t in texts]
    core = make_core(default_model.path, kv_cache_memory="64MiB", dtype="float32")
    results = run(core, [request(str(i), p, max_tokens=6) for i, p in enumerate(prompts)])
    hf = AutoModelForCausalLM.from_pretrained(default_model.path, dtype=torch.float32).eval()
    for i, prompt in enumerate(prompts):
        assert results[str(i)].token_ids == hf_greedy(hf, prompt, 6), texts[i]


def test_chunked_prefill_equals_unchunked(tiny_model_dir: Path) -> None:
    prompts = random_prompts([150, 7, 90], seed=1)
    reqs = [request(str(i), p, max_tokens=10, ignore_eos=True) for i, p in enumerate(prompts)]
    whole_core = make_core(tiny_model_dir)
    whole_core.pace = None  # whole prompts, even beside decodes
    whole = run(whole_core, reqs)
    chunked_core = make_core(tiny_model_dir, max_num_batched_tokens=16)
    chunked = run(chunked_core, reqs)
    assert chunked_core.stats().num_steps > whole_core.stats().num_steps
    for i in range(len(prompts)):
        assert chunked[str(i)].token_ids == whole[str(i)].token_ids
    assert_all_blocks_free(chunked_core)


def test_too_small_kv_cache_preempts_and_outputs_stay_the_same(
    tiny_model_dir: Path, core: EngineCore
) -> None:
    prompts = random_prompts([40, 35, 30, 45, 20], seed=2)
    reqs = [request(str(i), p, max_tokens=40, ignore_eos=True) for i, p in enumerate(prompts)]
    expected = run(core, reqs)
    block_bytes = core.ready.kv_cache_bytes // core.ready.num_blocks
    # 20 blocks (320 tokens) for five sequences that reach 60-85 tokens (4-6 blocks) each.
    small = make_core(tiny_model_dir, kv_cache_memory=20 * block_bytes)
    got = run(small, reqs)
    assert small.stats().num_preemptions > 0
    for i in range(len(prompts)):
        assert got[str(i)].token_ids == expected[str(i)].token_ids
        assert got[str(i)].finish_reason == "length"
    assert_all_blocks_free(small)


def test_prefix_cache_serves_a_shared_prefix(tiny_model_dir: Path) -> None:
    prefix, tail_a, tail_b = random_prompts([70, 5, 9], seed=3)
    cached = make_core(tiny_model_dir)
    uncached = make_core(tiny_model_dir, enable_prefix_caching=False)
    first = run(cached, [request("a", prefix + tail_a, max_tokens=8, ignore_eos=True)])
    second = run(cached, [request("b", prefix + tail_b, max_tokens=8, ignore_eos=True)])
    assert first["a"].num_cached_tokens == 0
    assert second["b"].num_cached_tokens == 64  # the four full blocks of the shared prefix
    stats = cached.stats()
    assert stats.prefix_cache_hits == 64
    assert stats.prefix_cache_queries == 75 + 79
    reference = run(uncached, [request("b", prefix + tail_b, max_tokens=8, ignore_eos=True)])
    assert second["b"].token_ids == reference["b"].token_ids
    assert reference["b"].num_cached_tokens == 0
    assert_all_blocks_free(cached)


def test_identical_prompts_in_one_batch_share_cached_blocks(tiny_model_dir: Path) -> None:
    """Three identical 40-token prompts admitted in one step: the second and third find the
    first's two full blocks (32 tokens) although the step that fills them has not run yet, and
    compute only their last 8 tokens; all three answer what an uncached engine answers."""
    (prompt,) = random_prompts([40], seed=4)
    shared = make_core(tiny_model_dir)
    for i in range(3):
        shared.add_request(request(str(i), prompt, max_tokens=5))
    first = shared.step()  # all three prefills, in one step
    stats = shared.stats()
    # 3 blocks for the first, then one block each for the others' last 8 tokens.
    assert stats.num_total_blocks - stats.num_free_blocks == 3 + 1 + 1
    assert stats.prefix_cache_hits == 2 * 32
    assert {o.request_id: o.num_cached_tokens for o in first.outputs} == {"0": 0, "1": 32, "2": 32}
    results: dict[str, list[int]] = {o.request_id: list(o.new_token_ids) for o in first.outputs}
    while shared.has_work():
        for out in shared.step().outputs:
            results[out.request_id] += out.new_token_ids
    uncached = make_core(tiny_model_dir, enable_prefix_caching=False)
    expected = run(uncached, [request("u", prompt, max_tokens=5)])["u"].token_ids
    assert results == {str(i): expected for i in range(3)}
    assert_all_blocks_free(shared)


def test_a_failed_step_unpublishes_the_blocks_it_was_to_fill(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Blocks published when their step was scheduled hold no K/V if that step fails: they must
    not serve a later prompt."""
    (prompt,) = random_prompts([40], seed=15)
    engine = make_core(tiny_model_dir)
    real_execute = engine.runner.execute

    def fail_once(*args: object, **kwargs: object) -> object:
        monkeypatch.setattr(engine.runner, "execute", real_execute)
        raise RuntimeError("injected fault")

    monkeypatch.setattr(engine.runner, "execute", fail_once)
    failed = run(engine, [request(str(i), prompt, max_tokens=3) for i in range(2)])
    assert {r.finish_reason for r in failed.values()} == {"error"}
    assert_all_blocks_free(engine)
    again = run(engine, [request("again", prompt, max_tokens=3)])["again"]
    assert again.num_cached_tokens == 0
    uncached = make_core(tiny_model_dir, enable_prefix_caching=False)
    assert again.token_ids == run(uncached, [request("u", prompt, max_tokens=3)])["u"].token_ids


def test_aborts_and_finishes_return_every_block(core: EngineCore) -> None:
    prompts = random_prompts([30, 50, 12, 70], seed=5)
    for i, p in enumerate(prompts):
        core.add_request(request(str(i), p, max_tokens=30, ignore_eos=True))
    core.abort_requests(["3"])  # still waiting
    first = core.step()
    assert next((o.request_id, o.finish_reason) for o in first.outputs) == ("3", "abort")
    core.step()
    core.abort_requests(["1", "no-such-request"])  # running
    aborted = core.step()
    assert ("1", "abort") in [(o.request_id, o.finish_reason) for o in aborted.outputs]
    finished = {o.request_id: o.finish_reason for o in aborted.outputs if o.finish_reason}
    while core.has_work():
        finished |= {o.request_id: o.finish_reason for o in core.step().outputs if o.finish_reason}
    assert finished == {"0": "length", "1": "abort", "2": "length"}
    assert_all_blocks_free(core)


def test_a_seeded_request_draws_the_same_tokens_whatever_else_runs(core: EngineCore) -> None:
    prompt, *others = random_prompts([12, 30, 5, 44, 8], seed=6)
    seeded = request("seeded", prompt, temperature=0.9, top_p=0.95, seed=1234, max_tokens=16)
    alone = run(core, [seeded])["seeded"].token_ids
    crowd = [
        request(f"o{i}", p, temperature=1.0, max_tokens=20 + i, ignore_eos=True)
        for i, p in enumerate(others)
    ]
    crowd.append(request("greedy", others[0], max_tokens=3))
    together = run(core, [*crowd[:2], seeded, *crowd[2:]])["seeded"].token_ids
    assert together == alone
    other_seed = request("seeded", prompt, temperature=0.9, top_p=0.95, seed=99, max_tokens=16)
    assert run(core, [other_seed])["seeded"].token_ids != alone


def test_lower_priority_value_runs_first_fcfs_among_equals(tiny_model_dir: Path) -> None:
    serial = make_core(tiny_model_dir, max_num_seqs=1, scheduling_policy="priority")
    prompts = random_prompts([5, 6, 7, 8], seed=7)
    order: list[str] = []
    for rid, prio, p in zip(["late", "first", "second", "third"], [5, 0, 1, 1], prompts):
        serial.add_request(request(rid, p, priority=prio, max_tokens=2, ignore_eos=True))
    while serial.has_work():
        order += [o.request_id for o in serial.step().outputs if o.finish_reason]
    assert order == ["first", "second", "third", "late"]


def test_first_come_first_served_refuses_a_priority(tiny_model_dir: Path) -> None:
    """Under fcfs (the default) a priority would let a client jump the queue: it is refused
    for that request alone, as vLLM refuses it without --scheduling-policy priority."""
    core = make_core(tiny_model_dir, max_num_seqs=1)
    [prompt] = random_prompts([5], seed=7)
    results = run(core, [request("jumper", prompt, priority=-(2**31), max_tokens=2),
                         request("fair", prompt, max_tokens=2, ignore_eos=True)])  # fmt: skip
    assert results["jumper"].finish_reason == "error"
    assert "scheduling_policy" in (results["jumper"].error or "")
    assert results["fair"].finish_reason == "length"


def test_bad_requests_fail_alone(core: EngineCore) -> None:
    good = random_prompts([10], seed=8)[0]
    too_long = [5] * core.ready.max_model_len
    reqs = [
        request("good", good, max_tokens=4, ignore_eos=True),
        request("out-of-vocab", [1, 2, core.ready.vocab_size]),
        request("empty", []),
        request("too-long", too_long),
        request("bad-params", good, top_p=0.0),
        request("bad-bias", good, logit_bias={core.ready.vocab_size + 5: 1.0}),
    ]
    results = run(core, reqs)
    assert results["good"].finish_reason == "length"
    assert len(results["good"].token_ids) == 4
    for rid in ["out-of-vocab", "empty", "too-long", "bad-params", "bad-bias"]:
        assert results[rid].finish_reason == "error", rid
        assert results[rid].error
    assert "context" in (results["too-long"].error or "")
    assert "top_p" in (results["bad-params"].error or "")
    assert_all_blocks_free(core)


def test_a_duplicate_request_id_is_refused_and_the_first_continues(core: EngineCore) -> None:
    (prompt,) = random_prompts([10], seed=9)
    core.add_request(request("dup", prompt, max_tokens=3, ignore_eos=True))
    core.add_request(request("dup", prompt, max_tokens=3, ignore_eos=True))
    outs = []
    while core.has_work():
        outs += core.step().outputs
    reasons = [o.finish_reason for o in outs if o.finish_reason]
    assert sorted(reasons, key=str) == ["error", "length"]
    assert sum(len(o.new_token_ids) for o in outs) == 3
    assert_all_blocks_free(core)


def test_logprobs_and_prompt_logprobs_match_a_full_forward(
    tiny_model_dir: Path, hf_tiny: torch.nn.Module
) -> None:
    (prompt,) = random_prompts([40], seed=10)
    # A 16-token budget splits the prompt into chunks: prompt logprobs come from every chunk.
    chunked = make_core(tiny_model_dir, max_num_batched_tokens=16)
    got = run(chunked, [request("r", prompt, max_tokens=4, logprobs=3, prompt_logprobs=2)])["r"]
    tokens = prompt + got.token_ids
    with torch.inference_mode():
        ref = hf_tiny(torch.tensor([tokens])).logits[0].log_softmax(-1)
    assert got.prompt_logprobs is not None and len(got.prompt_logprobs) == len(prompt)
    assert got.prompt_logprobs[0] is None
    for pos in range(1, len(prompt)):
        lp = got.prompt_logprobs[pos]
        assert lp is not None
        assert lp.token_ids[0] == prompt[pos]
        assert lp.logprobs[0] == pytest.approx(ref[pos - 1, prompt[pos]].item(), abs=1e-4)
        assert lp.token_ids[1:] == ref[pos - 1].topk(2).indices.tolist()
    assert len(got.logprobs) == 4
    for k, lp in enumerate(got.logprobs):
        row = ref[len(prompt) + k - 1]
        assert lp.token_ids[0] == got.token_ids[k] == row.argmax().item()
        assert lp.rank == 1
        assert lp.logprobs[0] == pytest.approx(row.max().item(), abs=1e-4)
        assert lp.token_ids[1:] == row.topk(3).indices.tolist()


def test_stop_token_ids_finish_with_the_stop_reason(core: EngineCore) -> None:
    (prompt,) = random_prompts([12], seed=11)
    free = run(core, [request("free", prompt, max_tokens=8, ignore_eos=True)])["free"].token_ids
    stop_at = next(i for i, t in enumerate(free) if t not in free[:i] and i >= 2)
    stop = free[stop_at]
    got = run(core, [request("s", prompt, max_tokens=8, stop_token_ids=[stop])])["s"]
    assert got.token_ids == free[: stop_at + 1]
    assert (got.finish_reason, got.stop_reason) == ("stop", stop)
    # min_tokens beyond the stop position masks the stop token there.
    late = run(
        core, [request("m", prompt, max_tokens=8, stop_token_ids=[stop], min_tokens=stop_at + 1)]
    )
    assert late["m"].token_ids[stop_at] != stop
    assert len(late["m"].token_ids) > stop_at + 1


def test_the_context_limit_finishes_with_length(tiny_model_dir: Path) -> None:
    short = make_core(tiny_model_dir, max_model_len=20)
    (prompt,) = random_prompts([15], seed=12)
    got = run(short, [request("r", prompt, max_tokens=None, ignore_eos=True)])["r"]
    assert len(got.token_ids) == 5
    assert got.finish_reason == "length"
    assert short.ready.max_model_len == 20


def test_prompt_logprobs_survive_preemption(tiny_model_dir: Path, core: EngineCore) -> None:
    prompts = random_prompts([40, 35, 30, 45], seed=13)
    reqs = [
        request(str(i), p, max_tokens=40, ignore_eos=True, prompt_logprobs=0)
        for i, p in enumerate(prompts)
    ]
    expected = run(core, reqs)
    block_bytes = core.ready.kv_cache_bytes // core.ready.num_blocks
    small = make_core(tiny_model_dir, kv_cache_memory=16 * block_bytes)
    got = run(small, reqs)
    assert small.stats().num_preemptions > 0
    for i, p in enumerate(prompts):
        lps = got[str(i)].prompt_logprobs
        assert lps is not None and len(lps) == len(p)
        assert got[str(i)].token_ids == expected[str(i)].token_ids


def test_a_max_model_len_the_kv_cache_cannot_hold(
    tiny_model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Asked for, it is refused with the numbers; the model's own (2048) is served shorter,
    said at start-up."""
    with pytest.raises(EngineConfigError, match="max_model_len 2048 does not fit") as refused:
        make_core(tiny_model_dir, kv_cache_memory="256KiB", max_model_len=2048)
    assert "--kv-cache-memory" in str(refused.value) and "--max-model-len" in str(refused.value)
    with caplog.at_level("WARNING", logger="trio_llm.engine.step.build"):
        short = make_core(tiny_model_dir, kv_cache_memory="256KiB")
    capacity = short.ready.num_blocks * short.ready.block_size
    assert short.ready.max_model_len == capacity < 2048
    assert f"max_model_len {capacity}, not the model's 2048" in caplog.text


def test_a_kv_budget_below_one_block_is_refused(tiny_model_dir: Path) -> None:
    with pytest.raises(EngineConfigError, match="kv_cache_memory"):
        make_core(tiny_model_dir, kv_cache_memory=1000)


def test_the_triton_backend_gives_the_same_tokens(tiny_model_dir: Path, core: EngineCore) -> None:
    """The engine's dispatch to trio_llm.kernels (interpreted on a CPU): decodes, first chunks
    and later chunks of a chunked prefill."""
    from trio_llm.engine.attention import triton_available

    if not triton_available():
        pytest.skip("Triton is not installed")
    prompts = random_prompts([5, 20, 37], seed=14)
    reqs = [request(str(i), p, max_tokens=4, ignore_eos=True) for i, p in enumerate(prompts)]
    expected = run(core, reqs)
    triton = make_core(tiny_model_dir, attention_backend="triton", max_num_batched_tokens=16)
    assert triton.ready.attention_backend == "triton"
    got = run(triton, reqs)
    for i in range(len(prompts)):
        assert got[str(i)].token_ids == expected[str(i)].token_ids


def test_single_token_dtype_runs_lone_decodes_on_half_weights(tiny_model_dir: Path) -> None:
    """A stream decoding alone takes the fp16 weight copies; the same stream batched with
    another takes the fp32 weights; both sample what the fp32 engine samples."""
    prompts = random_prompts([20, 20], seed=7)
    exact = run(make_core(tiny_model_dir), [request("a", prompts[0], max_tokens=8, logprobs=0)])
    fast = make_core(tiny_model_dir, single_token_dtype="float16")
    alone = run(fast, [request("a", prompts[0], max_tokens=8, logprobs=0)])
    # One prefill step, then seven single-token decode steps.
    assert fast.runner.single_token_steps == 7
    assert alone["a"].token_ids == exact["a"].token_ids
    for got, want in zip(alone["a"].logprobs, exact["a"].logprobs, strict=True):
        assert abs(got.logprobs[0] - want.logprobs[0]) < 2e-2  # fp16 weights, not fp32
    together = run(fast, [request(k, p, max_tokens=8) for k, p in zip("ab", prompts, strict=True)])
    assert fast.runner.single_token_steps == 7  # two rows a step: the fp32 weights
    assert together["a"].token_ids == exact["a"].token_ids


def test_a_bfloat16_engine_is_as_close_to_float32_as_hugging_faces_own_bfloat16(
    tiny_model_dir: Path, hf_tiny: torch.nn.Module
) -> None:
    """The bf16 path gets its own yardstick: Hugging Face running the same weights in bf16.

    Both round the weights and every activation to bf16 (8 significant bits) and differ only in
    reduction order and in how the batch is packed, so the engine's distance from the fp32
    reference must be of the same size as HF-bf16's: here at most 1.5x its largest per-position
    error and 1.2x its mean. (Measured on the tiny model: the engine's max error was 1.0-1.27x
    HF-bf16's, its mean 0.97-1.03x, over five prompts; HF-bf16's own errors are 0.07-0.1 nats at
    most, 0.025 on average.) A fault that computes in the wrong precision or mixes sequences
    shows up as errors many times larger."""
    from transformers import AutoModelForCausalLM

    hf_bf16 = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16).eval()
    engine = make_core(tiny_model_dir, dtype="bfloat16", max_num_batched_tokens=16)
    assert engine.ready.dtype == "bfloat16"
    for seed in (10, 11, 12):
        (prompt,) = random_prompts([40], seed=seed)
        got = run(engine, [request("r", prompt, max_tokens=8, logprobs=0, prompt_logprobs=0)])
        out = got["r"]
        assert out.prompt_logprobs is not None
        tokens = prompt + out.token_ids
        with torch.inference_mode():
            ids = torch.tensor([tokens])
            ref = hf_tiny(ids).logits[0].log_softmax(-1)
            bf16 = hf_bf16(ids).logits[0].float().log_softmax(-1)
        positions = torch.arange(len(tokens) - 1)
        following = torch.tensor(tokens[1:])
        ref_lp, bf16_lp = ref[positions, following], bf16[positions, following]
        engine_lp = torch.tensor(
            [p.logprobs[0] for p in out.prompt_logprobs[1:] if p is not None]
            + [p.logprobs[0] for p in out.logprobs]
        )
        assert engine_lp.shape == ref_lp.shape
        engine_err, hf_err = (engine_lp - ref_lp).abs(), (bf16_lp - ref_lp).abs()
        assert engine_err.max() <= 1.5 * hf_err.max(), seed
        assert engine_err.mean() <= 1.2 * hf_err.mean(), seed
    assert_all_blocks_free(engine)
