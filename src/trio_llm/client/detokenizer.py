"""Incremental detokenization: a request's output tokens become text one token at a time.

What it owns: turning each new token id into the text it adds, and turning a token id into the
text shown for it in logprobs. Invariant: the concatenation of every `step()` result equals the
text of all tokens decoded at once, minus any trailing incomplete UTF-8 character, which is held
back until a later token completes it; so streamed text of valid output never contains U+FFFD.

Byte-level tokenizers split one character over several tokens (an emoji or a CJK character is often
two or three), so decoding token by token would emit replacement characters. Fast tokenizers use
the `tokenizers` library's `DecodeStream`, which buffers those bytes in Rust; tokenizers without a
Rust backend fall back to the prefix/read-offset method (decode a short window twice and emit the
difference once it no longer ends in U+FFFD).

Both strategies are primed with the end of the prompt, because some decoders (SentencePiece's
leading-space marker) render a token differently at the start of a text than after other text.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from tokenizers.decoders import DecodeStream

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

_REPLACEMENT = "\ufffd"
_PRIME_MIN, _PRIME_MAX = 4, 24
"""The prompt suffix used for priming: the shortest of 4..24 tokens that decodes cleanly."""


class _Stepper(Protocol):
    def step(self, token_id: int) -> str: ...


def _prompt_suffix(tokenizer: PreTrainedTokenizerBase, prompt: Sequence[int]) -> list[int]:
    """A few prompt tokens that end the prompt and start on a character boundary."""
    if len(prompt) <= _PRIME_MIN:
        return list(prompt)
    for length in range(_PRIME_MIN, min(len(prompt), _PRIME_MAX) + 1):
        suffix = list(prompt[-length:])
        if _REPLACEMENT not in tokenizer.decode(suffix, skip_special_tokens=False):
            return suffix
    return list(prompt[-_PRIME_MIN:])


class _StreamStepper:
    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, prime: list[int], skip_special_tokens: bool
    ) -> None:
        self._backend = tokenizer.backend_tokenizer
        self._stream = DecodeStream(prime, skip_special_tokens=skip_special_tokens)

    def step(self, token_id: int) -> str:
        return self._stream.step(self._backend, token_id) or ""


class _OffsetStepper:
    """Keeps only the window since the last emitted character, so each step decodes a few
    tokens, never the whole output."""

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, prime: list[int], skip_special_tokens: bool
    ) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._ids = prime
        self._read = len(prime)
        """Tokens before `_read` have been emitted; those before it form the decoding context."""

    def step(self, token_id: int) -> str:
        self._ids.append(token_id)
        before = self._tokenizer.decode(self._ids[: self._read], skip_special_tokens=self._skip)
        after = self._tokenizer.decode(self._ids, skip_special_tokens=self._skip)
        if len(after) <= len(before) or after.endswith(_REPLACEMENT):
            return ""
        self._ids = self._ids[self._read :]
        self._read = len(self._ids)
        return after[len(before) :]


class IncrementalDetokenizer:
    """One request's output text, grown token by token."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        prompt_token_ids: Sequence[int],
        *,
        skip_special_tokens: bool = True,
    ) -> None:
        prime = _prompt_suffix(tokenizer, prompt_token_ids)
        self._stepper: _Stepper
        if getattr(tokenizer, "backend_tokenizer", None) is not None:
            self._stepper = _StreamStepper(tokenizer, prime, skip_special_tokens)
        else:
            self._stepper = _OffsetStepper(tokenizer, prime, skip_special_tokens)

    def step(self, token_id: int) -> str:
        """The text `token_id` completes: '' while a character is still incomplete, or for a
        skipped special token."""
        return self._stepper.step(token_id)


_BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-to-printable-character table, inverted: how byte-level BPE vocabularies
    spell raw bytes ('Ġ' is a space)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table: dict[str, int] = {chr(b): b for b in printable}
    extra = 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + extra)] = b
            extra += 1
    return table


class DecodedTokens:
    """The text shown for single tokens in logprobs, cached per token id (bounded by the
    vocabulary).

    A token that is only part of a UTF-8 character is shown as `bytes:\\xNN...` (OpenAI's
    convention) rather than as U+FFFD, so a client can still reassemble the bytes.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self._tokenizer = tokenizer
        self._cache: dict[int, str] = {}
        self._byte_level: dict[str, int] | None = None
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is not None and type(backend.decoder).__name__ == "ByteLevel":
            self._byte_level = _byte_level_alphabet()

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            text = self._cache[token_id] = self._render(token_id)
        return text

    def _render(self, token_id: int) -> str:
        text = self._tokenizer.decode([token_id], skip_special_tokens=False)
        if _REPLACEMENT not in text:
            return text
        raw = self._raw_bytes(token_id)
        if raw is None:
            return text
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)

    def _raw_bytes(self, token_id: int) -> bytes | None:
        piece = self._tokenizer.convert_ids_to_tokens(token_id)
        if not isinstance(piece, str):
            return None
        if m := _BYTE_TOKEN.match(piece):
            return bytes([int(m.group(1), 16)])
        if self._byte_level is not None and all(c in self._byte_level for c in piece):
            return bytes(self._byte_level[c] for c in piece)
        return None
