"""Input processing: tokenization on and off the event loop, chat templates, validation."""

from __future__ import annotations

import threading
from typing import Any

import anyio
import pytest
import sniffio

from trio_llm.client.background import background_work
from trio_llm.client.confined_tokenizer import INLINE_MAX_COST, ConfinedTokenizer
from trio_llm.client.errors import ChatTemplateError, InvalidPromptError, PromptTooLongError
from trio_llm.client.input_processor import InputProcessor
from trio_llm.sampling_params import SamplingParams, SamplingParamsError

from .tokenizer_probe import watch_tokenizer_use

pytestmark = pytest.mark.anyio


@pytest.fixture
def inputs(tokenizer: Any) -> InputProcessor:
    return InputProcessor(
        ConfinedTokenizer(tokenizer), max_model_len=2048, vocab_size=len(tokenizer)
    )


async def test_runs_on_the_backend_it_is_parametrized_with(anyio_backend: str) -> None:
    assert sniffio.current_async_library() == anyio_backend


async def test_big_inputs_are_tokenized_off_the_event_loop(
    tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    with watch_tokenizer_use(monkeypatch, type(tokenizer)) as use:
        confined = ConfinedTokenizer(tokenizer)
        inputs = InputProcessor(confined, max_model_len=2048, vocab_size=len(tokenizer))
        small, big = "Hello there", "word " * (INLINE_MAX_COST // 4)
        assert await inputs.encode(small) == tokenizer.encode(small)
        loop_thread = threading.get_ident()
        assert use.threads[id(tokenizer)] == {loop_thread}
        assert await inputs.encode(big) == tokenizer.encode(big)
        messages = [{"role": "user", "content": big}]
        expected = tokenizer.encode(
            tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
            add_special_tokens=False,
        )
        assert await inputs.apply_chat_template(messages) == expected
    # Only this processor's own copy: other instances of the class (a session's engine
    # clients in this process) may be busy on their own threads meanwhile.
    worker = id(confined._worker)
    assert use.threads[worker], "the big inputs never reached the worker copy"
    assert loop_thread not in use.threads[worker]
    assert use.threads[id(tokenizer)] == {loop_thread}  # the test's own calls included


async def test_chat_template_renders_roles_and_generation_prompt(
    inputs: InputProcessor, tokenizer: Any
) -> None:
    ids = await inputs.apply_chat_template([{"role": "user", "content": "What is 2+2?"}])
    text = tokenizer.decode(ids)
    assert text.count("<|im_start|>") == 3  # default system prompt, user, assistant
    assert text.endswith("<|im_start|>assistant\n")
    assert ids[0] == tokenizer.convert_tokens_to_ids("<|im_start|>")  # no BOS added twice
    continued = await inputs.apply_chat_template(
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hel"}],
        add_generation_prompt=False,
        continue_final_message=True,
    )
    assert tokenizer.decode(continued).endswith("<|im_start|>assistant\nHel")


async def test_chat_template_errors_are_value_errors(inputs: InputProcessor) -> None:
    with pytest.raises(ChatTemplateError):
        await inputs.apply_chat_template(
            [{"role": "user", "content": "Hi"}],
            add_generation_prompt=True,
            continue_final_message=True,
        )


@pytest.mark.parametrize(
    ("template", "words"),
    [
        ("{{ messages[0]['content'] + 1 }}", "TypeError"),  # jinja lets Python's errors out
        ("{{ 1 // (messages | length - 1) }}", "ZeroDivisionError"),
        ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "RecursionError"),
        ("{{ messages[0]['missing']['deeper'] }}", "has no attribute"),  # jinja's own
    ],
)
async def test_any_exception_in_a_template_is_a_chat_template_error(
    tokenizer: Any, template: str, words: str
) -> None:
    """Before, only ValueError and jinja's own errors were; a TypeError was a 500."""
    import copy

    broken = copy.deepcopy(tokenizer)
    broken.chat_template = template
    inputs = InputProcessor(ConfinedTokenizer(broken), max_model_len=2048, vocab_size=len(broken))
    with pytest.raises(ChatTemplateError, match=words):
        await inputs.apply_chat_template([{"role": "user", "content": "Hi"}])


async def test_what_is_rendered_decides_where_it_renders(
    tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Short contents with large tools (or a long history of calls) are a large render: off
    the event loop, as a long message is."""
    tools = [
        {
            "type": "function",
            "function": {"name": f"f{i}", "parameters": {"description": "x" * 200}},
        }
        for i in range(50)
    ]
    with watch_tokenizer_use(monkeypatch, type(tokenizer)) as use:
        inputs = InputProcessor(
            ConfinedTokenizer(tokenizer), max_model_len=1 << 20, vocab_size=len(tokenizer)
        )
        await inputs.apply_chat_template(
            [{"role": "user", "content": "Hi"}], chat_template_kwargs={"tools": tools}
        )
        loop_thread = threading.get_ident()
    [worker] = [i for i in use.threads if i != id(tokenizer)]
    assert use.threads[worker] and loop_thread not in use.threads[worker]


def test_too_long_names_both_numbers(inputs: InputProcessor) -> None:
    with pytest.raises(PromptTooLongError) as info:
        inputs.check_request([5] * 2000, SamplingParams(max_tokens=100))
    err = info.value
    assert isinstance(err, ValueError)
    assert (err.prompt_tokens, err.max_tokens, err.max_model_len) == (2000, 100, 2048)
    assert "2000" in str(err) and "100" in str(err) and "2048" in str(err)
    assert err.param == "max_tokens"
    with pytest.raises(PromptTooLongError) as info:
        inputs.check_request([5] * 2048, SamplingParams(max_tokens=None))
    assert info.value.param == "prompt"
    inputs.check_request([5] * 1948, SamplingParams(max_tokens=100))  # exactly fits


def test_bad_prompts_and_params_are_refused_before_sending(inputs: InputProcessor) -> None:
    with pytest.raises(InvalidPromptError, match="empty"):
        inputs.check_request([], SamplingParams())
    with pytest.raises(InvalidPromptError, match="vocabulary"):
        inputs.check_request([1, 10**6], SamplingParams())
    with pytest.raises(SamplingParamsError) as info:
        inputs.check_request([1], SamplingParams(temperature=-1))
    assert info.value.param == "temperature"
    with pytest.raises(SamplingParamsError) as info:
        inputs.check_request([1], SamplingParams(stop_token_ids=[10**6]))
    assert info.value.param == "stop_token_ids"


def test_single_choice_keeps_its_request_id_and_params() -> None:
    params = SamplingParams(seed=3)
    (request,) = InputProcessor.engine_requests("abc", [1, 2], params, arrival_time=5.0, priority=2)
    assert (request.request_id, request.sampling_params, request.priority) == ("abc", params, 2)
    assert request.arrival_time == 5.0


async def test_requests_made_in_background_work_are_marked_and_others_not() -> None:
    """The mark follows the task that makes the request and the tasks it starts, not a task
    running beside it (an interactive request handled meanwhile)."""

    def made() -> bool:
        (request,) = InputProcessor.engine_requests("r", [1], SamplingParams(), arrival_time=0.0)
        return request.background

    found: dict[str, bool] = {}
    inside, done = anyio.Event(), anyio.Event()

    async def beside() -> None:
        await inside.wait()
        found["beside"] = made()
        done.set()

    async def child() -> None:
        found["child"] = made()

    async with anyio.create_task_group() as outer:
        outer.start_soon(beside)
        with background_work():
            async with anyio.create_task_group() as inner:
                inner.start_soon(child)
            found["here"] = made()
            inside.set()
            await done.wait()  # it ran while this block was open
    assert found == {"child": True, "here": True, "beside": False} and not made()


async def test_bad_words_become_token_ids_at_a_text_start_and_after_a_space(
    inputs: InputProcessor, tokenizer: Any
) -> None:
    params = SamplingParams(bad_words=["hello", "  New York"], bad_words_token_ids=[[7]])
    resolved = await inputs.with_bad_words_tokenized(params)
    assert resolved.bad_words is None and params.bad_words is not None  # a copy
    words = resolved.bad_words_token_ids
    assert words is not None and words[0] == [7]

    def ids(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    assert ids("hello") in words and ids(" hello") in words
    assert ids("New York") in words and ids(" New York") in words
    assert {tokenizer.decode(w).strip() for w in words[1:]} == {"hello", "New York"}
    plain = SamplingParams()
    assert await inputs.with_bad_words_tokenized(plain) is plain
