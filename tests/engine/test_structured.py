"""Structured outputs in EngineCore on the real default model (fp32): every output matches its
constraint and ends within the token limit, jump-forward gives the same tokens as token-by-token
decoding in fewer steps, an unconstrained neighbour is untouched, and the paths around a
grammar (compile failure, abort while compiling, preemption, prefix caching, logprobs) hold."""

from __future__ import annotations

import json
import re
import threading
import time

import pytest
from engine_helpers import Finished, make_core, request, run

from structured_cases import (
    CHOICES,
    GBNF_GRAMMAR,
    LARK_GRAMMAR,
    REGEXES,
    SCHEMAS,
    assert_valid,
)
from trio_llm.constraint import Constraint
from trio_llm.engine.step.core import EngineCore
from trio_llm.engine.step.scheduler import accept_drafts
from trio_llm.ipc.messages import EngineCoreRequest
from trio_llm.model_files import ModelSource, load_tokenizer

pytestmark = pytest.mark.slow

MAX_TOKENS = 160
"""Every case here closes well within this (compact JSON, bounded strings)."""


@pytest.fixture(scope="module")
def tokenizer(default_model: ModelSource):  # type: ignore[no-untyped-def]
    return load_tokenizer(default_model)


@pytest.fixture(scope="module")
def core(default_model: ModelSource) -> EngineCore:
    return make_core(default_model.path, kv_cache_memory="64MiB")


@pytest.fixture(scope="module")
def plain_core(default_model: ModelSource) -> EngineCore:
    """The same engine without jump-forward: token-by-token decoding under the grammar."""
    return make_core(default_model.path, kv_cache_memory="64MiB", jump_forward=False)


def chat_ids(tokenizer, text: str) -> list[int]:  # type: ignore[no-untyped-def]
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )
    return list(tokenizer.encode(rendered, add_special_tokens=False))


def schema_requests(tokenizer, **params: object) -> list[EngineCoreRequest]:  # type: ignore[no-untyped-def]
    params.setdefault("max_tokens", MAX_TOKENS)
    return [
        request(
            c.name,
            chat_ids(tokenizer, c.prompt),
            constraint=Constraint.json_schema(c.schema),
            **params,
        )
        for c in SCHEMAS
    ]


def text_of(tokenizer, result: Finished) -> str:  # type: ignore[no-untyped-def]
    return tokenizer.decode(result.token_ids, skip_special_tokens=True)


def steps(core: EngineCore, requests: list[EngineCoreRequest]) -> tuple[dict[str, Finished], int]:
    before = core.stats().num_steps
    results = run(core, requests)
    return results, core.stats().num_steps - before


def assert_idle(core: EngineCore) -> None:
    stats = core.stats()
    assert stats.num_free_blocks == stats.num_total_blocks
    assert stats.num_running == stats.num_waiting == 0
    assert not core.requests and not core._compiling


def test_accept_drafts() -> None:
    assert accept_drafts([], [5]) == [5]
    assert accept_drafts([1, 2, 3], [1, 2, 3, 9]) == [1, 2, 3, 9]
    assert accept_drafts([1, 2, 3], [1, 7, 3, 9]) == [1, 7]
    assert accept_drafts([1, 2, 3], [4, 2, 3, 9]) == [4]


def test_schemas_validate_and_jump_forward_equals_token_by_token(
    core: EngineCore, plain_core: EngineCore, tokenizer
) -> None:  # type: ignore[no-untyped-def]
    jumped, jumped_steps = steps(core, schema_requests(tokenizer))
    plain, plain_steps = steps(plain_core, schema_requests(tokenizer))
    for case in SCHEMAS:
        got = jumped[case.name]
        assert got.finish_reason == "stop", (case.name, text_of(tokenizer, got))
        assert_valid(case.schema, json.loads(text_of(tokenizer, got)))
        assert got.token_ids == plain[case.name].token_ids, case.name
    assert jumped_steps < plain_steps
    assert_idle(core)
    assert_idle(plain_core)


def test_sampled_outputs_validate(core: EngineCore, tokenizer) -> None:  # type: ignore[no-untyped-def]
    # A number schema admits endless digits: some seeds draw them to the token limit (3 of
    # seeds 1-12 in bool_number); this one closes every case.
    results = run(core, schema_requests(tokenizer, temperature=0.8, top_p=0.95, seed=4))
    for case in SCHEMAS:
        got = results[case.name]
        assert got.finish_reason == "stop", (case.name, text_of(tokenizer, got))
        assert_valid(case.schema, json.loads(text_of(tokenizer, got)))


def test_seeded_sampling_reproduces(core: EngineCore, tokenizer) -> None:  # type: ignore[no-untyped-def]
    case = SCHEMAS[10]
    prompt = chat_ids(tokenizer, case.prompt)

    def once(rid: str) -> list[int]:
        constraint = Constraint.json_schema(case.schema)
        req = request(rid, prompt, constraint=constraint, temperature=1.0, seed=3, max_tokens=120)
        return run(core, [req])[rid].token_ids

    assert once("a") == once("b")


def test_regex_choice_grammar_and_json_object(core: EngineCore, tokenizer) -> None:  # type: ignore[no-untyped-def]
    reqs, checks = [], {}
    for case in REGEXES:
        reqs.append(
            request(
                case.name,
                chat_ids(tokenizer, case.prompt),
                constraint=Constraint.regex(case.pattern),
                max_tokens=60,
            )
        )
        checks[case.name] = lambda text, p=case.pattern: re.fullmatch(p, text) is not None
    for i, (prompt, choices) in enumerate(CHOICES):
        name = f"choice{i}"
        reqs.append(
            request(
                name,
                chat_ids(tokenizer, prompt),
                constraint=Constraint.choice(choices),
                max_tokens=20,
            )
        )
        checks[name] = lambda text, c=choices: text in c
    for name, grammar, pattern in (
        ("lark", LARK_GRAMMAR, r"SELECT (name|age|\*) FROM (users|orders)"),
        ("gbnf", GBNF_GRAMMAR, r"The answer is [0-9]\."),
    ):
        reqs.append(
            request(
                name,
                chat_ids(tokenizer, "Write a query."),
                constraint=Constraint.grammar(grammar),
                max_tokens=40,
            )
        )
        checks[name] = lambda text, p=pattern: re.fullmatch(p, text) is not None
    reqs.append(
        request(
            "object",
            chat_ids(tokenizer, "Describe a cat as JSON."),
            constraint=Constraint.json_object(),
            max_tokens=MAX_TOKENS,
        )
    )
    checks["object"] = lambda text: isinstance(json.loads(text), dict)
    results = run(core, reqs)
    for name, check in checks.items():
        text = text_of(tokenizer, results[name])
        assert results[name].finish_reason == "stop", (name, text)
        assert check(text), (name, text)


def test_an_unconstrained_neighbour_is_untouched(core: EngineCore, tokenizer) -> None:  # type: ignore[no-untyped-def]
    prompt = chat_ids(tokenizer, "Tell me about the sea.")
    alone = run(core, [request("free", prompt, max_tokens=24)])["free"]
    together = run(core, [request("free", prompt, max_tokens=24), *schema_requests(tokenizer)[:6]])
    assert together["free"].token_ids == alone.token_ids
    assert together["free"].finish_reason == alone.finish_reason


def test_logprobs_come_for_every_token_with_jump_forward(core: EngineCore, tokenizer) -> None:  # type: ignore[no-untyped-def]
    case = SCHEMAS[14]  # $ref points: many forced keys
    req = request(
        "lp",
        chat_ids(tokenizer, case.prompt),
        constraint=Constraint.json_schema(case.schema),
        logprobs=2,
        max_tokens=MAX_TOKENS,
    )
    got = run(core, [req])["lp"]
    assert got.outputs < len(got.token_ids)  # some steps committed several tokens
    assert [lp.token_ids[0] for lp in got.logprobs] == got.token_ids
    assert all(len(lp.token_ids) == 3 for lp in got.logprobs)


def test_a_grammar_that_does_not_compile_fails_its_request_alone(
    core: EngineCore, tokenizer
) -> None:  # type: ignore[no-untyped-def]
    prompt = chat_ids(tokenizer, "hi")
    results = run(
        core,
        [
            request("bad", prompt, constraint=Constraint.regex("a(b")),
            request("good", prompt, constraint=Constraint.regex("(yes|no)"), max_tokens=8),
        ],
    )
    assert results["bad"].finish_reason == "error"
    assert "does not compile" in (results["bad"].error or "")
    assert results["good"].finish_reason == "stop"
    assert_idle(core)


def test_a_character_the_vocabulary_cannot_spell_fails_its_request_alone(
    core: EngineCore, plain_core: EngineCore, tokenizer
) -> None:  # type: ignore[no-untyped-def]
    """U+BFF35 is F2 BF BC B5, and the model has no token for the byte F2. Before, the mask
    let the token for the lone byte BF through and the request failed with llguidance's parser
    state; a character the vocabulary can spell (an emoji) is served beside it."""
    prompt = chat_ids(tokenizer, "hi")
    for engine in (core, plain_core):
        results = run(
            engine,
            [
                request("astral", prompt, constraint=Constraint.regex("\U000bff35")),
                request("emoji", prompt, constraint=Constraint.regex("a\U0001f600b")),
            ],
        )
        astral = results["astral"]
        assert (astral.finish_reason, astral.token_ids) == ("error", [])
        assert astral.error_param == "constraint"
        assert "produces the byte F2" in (astral.error or "")
        assert "<state>" not in (astral.error or "")
        assert results["emoji"].finish_reason == "stop"
        assert text_of(tokenizer, results["emoji"]) == "a\U0001f600b"
        assert_idle(engine)


def test_a_dead_end_fails_its_request_instead_of_sampling_token_0(
    core: EngineCore, tokenizer
) -> None:  # type: ignore[no-untyped-def]
    prompt = chat_ids(tokenizer, "Answer yes or no.")
    yes_no = Constraint.choice(["yes", "no"])
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    results = run(
        core,
        [
            request("greedy", prompt, constraint=yes_no, allowed_token_ids=[5, 6]),
            request("sampled", prompt, constraint=yes_no, allowed_token_ids=[5, 6], temperature=1),
            request("alone", prompt, allowed_token_ids=[eos], min_tokens=3, logprobs=1),
            request("fine", prompt, constraint=yes_no, max_tokens=4),
        ],
    )
    for name, param in (
        ("greedy", "constraint"),
        ("sampled", "constraint"),
        ("alone", "allowed_token_ids"),
    ):
        got = results[name]
        assert (got.finish_reason, got.token_ids, got.error_param) == ("error", [], param)
        assert "allowed_token_ids" in (got.error or ""), got.error
    assert text_of(tokenizer, results["fine"]) in ("yes", "no")
    assert_idle(core)


def test_others_step_while_a_grammar_compiles_and_abort_frees_it(
    core: EngineCore, tokenizer
) -> None:  # type: ignore[no-untyped-def]
    # Hold the compile thread, so that the grammar is still compiling at every check below.
    release = threading.Event()
    core.structured._compiler.submit(release.wait, 10)
    prompt = chat_ids(tokenizer, "hi")
    try:
        core.add_request(request("held", prompt, constraint=Constraint.regex("(yes|no)")))
        core.add_request(request("gone", prompt, constraint=Constraint.regex("[0-9]+")))
        assert not core.has_work() and core.idle_timeout() is not None
        free = run(core, [request("free", prompt, max_tokens=4)])["free"]
        assert free.finish_reason == "length"  # it ran while both grammars waited
        core.abort_requests(["gone"])
        [out] = core.step().outputs
        assert (out.request_id, out.finish_reason) == ("gone", "abort")
        assert list(core._compiling) == ["held"]
    finally:
        release.set()
    results: dict[str, Finished] = {"held": Finished()}
    deadline = time.monotonic() + 30
    while results["held"].finish_reason is None and time.monotonic() < deadline:
        if not core.has_work():
            time.sleep(core.idle_timeout() or 0.001)
            continue
        for output in core.step().outputs:
            results[output.request_id].take(output)
    assert results["held"].finish_reason == "stop"
    assert_idle(core)


def test_preemption_of_constrained_requests(
    default_model: ModelSource, core: EngineCore, tokenizer
) -> None:  # type: ignore[no-untyped-def]
    reqs = schema_requests(tokenizer)[:6]
    expected = run(core, reqs)
    small = make_core(default_model.path, kv_cache_memory="8MiB")  # 11 blocks of 16 tokens
    got = run(small, schema_requests(tokenizer)[:6])
    assert small.stats().num_preemptions > 0
    for name, result in expected.items():
        assert got[name].token_ids == result.token_ids, name
    assert_idle(small)


def test_prefix_caching_serves_a_repeated_constrained_request(core: EngineCore, tokenizer) -> None:  # type: ignore[no-untyped-def]
    case = SCHEMAS[1]
    prompt = chat_ids(tokenizer, case.prompt * 3)  # several full blocks

    def once(rid: str) -> Finished:
        constraint = Constraint.json_schema(case.schema)
        return run(core, [request(rid, prompt, constraint=constraint, max_tokens=MAX_TOKENS)])[rid]

    first, second = once("p1"), once("p2")
    assert second.num_cached_tokens > 0
    assert second.token_ids == first.token_ids
