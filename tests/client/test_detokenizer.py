"""Incremental detokenization and stop-string helpers, on the default model's real tokenizer."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_llm.client.detokenizer import DecodedTokens, IncrementalDetokenizer
from trio_llm.client.stop_strings import find_stop, held_back

MULTIBYTE = "Héllo 世界 🎉 café, naïve Ελληνικά — 日本語のテキスト 🚀🔥 done"


class _NoBackend:
    """The same tokenizer seen without its Rust backend: forces the prefix/read-offset path."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


@pytest.fixture(params=["decode_stream", "offsets"])
def detok_tokenizer(request: pytest.FixtureRequest, tokenizer: Any) -> Any:
    return tokenizer if request.param == "decode_stream" else _NoBackend(tokenizer)


def _stream(tok: Any, prompt: list[int], output: list[int], skip: bool = True) -> list[str]:
    detok = IncrementalDetokenizer(tok, prompt, skip_special_tokens=skip)
    return [detok.step(t) for t in output]


def test_multibyte_characters_split_across_tokens_stream_without_replacement(
    detok_tokenizer: Any, tokenizer: Any
) -> None:
    output = tokenizer.encode(MULTIBYTE, add_special_tokens=False)
    # The test is only meaningful if some character really spans several tokens.
    assert any("\ufffd" in tokenizer.decode([t]) for t in output)
    pieces = _stream(detok_tokenizer, tokenizer.encode("Say it:"), output)
    assert "".join(pieces) == MULTIBYTE
    assert not any("\ufffd" in piece for piece in pieces)
    assert "" in pieces  # some tokens completed no character and emitted nothing


def test_output_after_prompt_matches_whole_decode(detok_tokenizer: Any, tokenizer: Any) -> None:
    prompt = tokenizer.encode("The capital of France is")
    output = tokenizer.encode(" Paris. It is 🎉 lovely", add_special_tokens=False)
    full = tokenizer.decode(prompt + output)
    expected = full[len(tokenizer.decode(prompt)) :]
    assert "".join(_stream(detok_tokenizer, prompt, output)) == expected


def test_skip_special_tokens(detok_tokenizer: Any, tokenizer: Any) -> None:
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    output = [*tokenizer.encode("Hi", add_special_tokens=False), end]
    assert "".join(_stream(detok_tokenizer, [1], output, skip=True)) == "Hi"
    assert "".join(_stream(detok_tokenizer, [1], output, skip=False)) == "Hi<|im_end|>"


def test_decoded_tokens_show_partial_characters_as_bytes(tokenizer: Any) -> None:
    texts = DecodedTokens(tokenizer)
    ids = tokenizer.encode("世", add_special_tokens=False)
    assert len(ids) > 1
    shown = [texts(t) for t in ids]
    assert all(s.startswith("bytes:") for s in shown)
    raw = b"".join(bytes.fromhex(s[len("bytes:") :].replace("\\x", "")) for s in shown)
    assert raw.decode() == "世"
    (paris,) = tokenizer.encode(" Paris", add_special_tokens=False)
    assert texts(paris) == " Paris"
    assert texts(tokenizer.convert_tokens_to_ids("<|im_end|>")) == "<|im_end|>"


def test_find_stop_finds_the_earliest_match_reaching_new_text() -> None:
    assert find_stop("Hello world. Bye", 8, ["Bye", "world"]) == (6, "world")
    assert find_stop("Hello world", 11, ["world"]) is None  # nothing new
    assert find_stop("ab", 1, ["ab"]) == (0, "ab")  # starts in old text, ends in new
    assert find_stop("Hello", 0, ["xyz"]) is None


def test_held_back_is_the_longest_suffix_that_starts_a_stop_string() -> None:
    assert held_back("Hello wor", ["world"]) == 3
    assert held_back("Hello w", ["world", "wx"]) == 1
    assert held_back("Hello", ["world"]) == 0
    assert held_back("Hello world", ["world"]) == 0  # a whole match is not held, it is cut
    assert held_back("a<|", ["<|end|>", "|x"]) == 2


@given(
    text=st.text(alphabet="ab<|", max_size=12),
    stops=st.lists(st.text(alphabet="ab<|", min_size=1, max_size=6), min_size=1, max_size=3),
)
def test_held_back_agrees_with_trying_every_prefix(text: str, stops: list[str]) -> None:
    every = [
        size
        for stop in stops
        for size in range(1, min(len(stop) - 1, len(text)) + 1)
        if text.endswith(stop[:size])
    ]
    assert held_back(text, stops) == max(every, default=0)
