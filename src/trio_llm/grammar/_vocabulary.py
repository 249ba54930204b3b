"""A model's vocabulary as llguidance computes masks over it.

What it owns: `GrammarVocabulary` (llguidance's tokenizer, as wide as the model's logits, with
one placeholder token past them per byte no token of the model produces) and
`unproducible_bytes`, the frontend's cheap view of those same bytes; the byte-level alphabet
both read a vocabulary in; and the non-special added tokens (`<think>`, `</think>`), and the
special ones tool-call and reasoning formats write (`FORMAT_MARKERS`: `[TOOL_CALLS]`, Harmony's
`<|channel|>`...), moved into the vocabulary as text, so a grammar that writes such a tag can
be satisfied by its token.

Invariant: the bytes `unproducible_bytes` names are exactly those `grammar_vocabulary` gives a
placeholder, so the frontend's check and the engine's masks agree on what a model can write.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from copy import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import llguidance

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True, eq=False)
class GrammarVocabulary:
    """llguidance's view of a model's vocabulary (about a second to build: do it once)."""

    tokenizer: llguidance.LLTokenizer
    vocab_size: int
    """The model's: the width of its logits. Tokens from here on are placeholders."""
    unproducible: frozenset[int]
    """The byte values UTF-8 may hold that no token of the model produces (each has a
    placeholder token)."""

    @property
    def mask_words(self) -> int:
        """The int32 words of one bitmask row (placeholders included)."""
        return (self.tokenizer.vocab_size + 31) // 32


def grammar_vocabulary(
    tokenizer: PreTrainedTokenizerBase, vocab_size: int, eos_token_ids: list[int]
) -> GrammarVocabulary:
    """The grammar vocabulary of a model: its tokenizer's tokens, masks as wide as its logits
    (`vocab_size`, which may exceed the tokenizer's), every one of its EOS tokens allowed where
    a grammar may end, and a placeholder past `vocab_size` for each byte no token produces."""
    backend = copy(tokenizer.backend_tokenizer)  # type: ignore[attr-defined]
    backend.no_padding()
    backend.no_truncation()
    spec = json.loads(backend.to_str())
    _added_tokens_as_text(spec, frozenset(eos_token_ids))
    vocab = (spec.get("model") or {}).get("vocab")
    missing = []
    if isinstance(vocab, dict) and _is_byte_level(spec.get("decoder")):
        missing = _missing_bytes(vocab)
        alphabet = _byte_level_alphabet()
        for i, b in enumerate(missing):
            vocab[alphabet[b]] = vocab_size + i
    llg = llguidance.LLTokenizer(
        json.dumps(spec), n_vocab=vocab_size + len(missing), eos_token=sorted(eos_token_ids)
    )
    return GrammarVocabulary(llg, vocab_size, frozenset(missing))


def unproducible_bytes(tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    """The bytes UTF-8 may hold that no token of `tokenizer` produces (the frontend's check
    refuses a constraint that forces one; `grammar_vocabulary` gives each a placeholder)."""
    backend = tokenizer.backend_tokenizer  # type: ignore[attr-defined]
    if not _is_byte_level(json.loads(backend.decoder.__getstate__()) if backend.decoder else None):
        return frozenset()
    return frozenset(_missing_bytes(backend.get_vocab(with_added_tokens=False)))


def _is_byte_level(decoder: Any) -> bool:
    """Whether a tokenizer.json `decoder` maps GPT-2's byte-level alphabet back to bytes."""
    return "ByteLevel" in json.dumps(decoder)


def _missing_bytes(vocab: Mapping[str, int]) -> list[int]:
    """The bytes UTF-8 may hold that have no token of their own in a byte-level `vocab`.
    (Vocabularies with byte fallback hold every byte as `<0xNN>`; grammars match UTF-8 text,
    and llguidance reserves 0xFF.)"""
    alphabet = _byte_level_alphabet()
    return [b for b in _UTF8_BYTES if alphabet[b] not in vocab]


_UTF8_BYTES = [b for b in range(256) if b not in (0xC0, 0xC1) and b < 0xF5]


def _byte_level_alphabet() -> list[str]:
    """GPT-2's byte-level alphabet: the character that stands for each byte in a token's text
    (printable Latin-1 bytes stand for themselves, the others are shifted past U+00FF)."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {b: chr(b) for b in printable}
    shifted = (b for b in range(256) if b not in chars)
    for i, b in enumerate(shifted):
        chars[b] = chr(0x100 + i)
    return [chars[b] for b in range(256)]


FORMAT_MARKERS = frozenset(
    {
        "[TOOL_CALLS]",
        "[ARGS]",
        "[CALL_ID]",
        "[THINK]",
        "[/THINK]",
        "<|tool_call|>",
        "<|channel|>",
        "<|message|>",
        "<|constrain|>",
        "<|start|>",
        "<|end|>",
        "<\uff5ctool\u2581calls\u2581begin\uff5c>",
        "<\uff5ctool\u2581calls\u2581end\uff5c>",
        "<\uff5ctool\u2581call\u2581begin\uff5c>",
        "<\uff5ctool\u2581call\u2581end\uff5c>",
        "<\uff5ctool\u2581sep\uff5c>",
    }
)
"""Special tokens that tool-call and reasoning formats (http/tools, http/reasoning) write as
part of their text: Mistral's control tokens, Granite's, Harmony's channel markers,
DeepSeek's. A grammar writes them, and a lazy grammar's free text must let the model write
them, so they are text to llguidance, as non-special added tokens are."""


def _added_tokens_as_text(spec: dict[str, Any], eos_token_ids: frozenset[int]) -> None:
    """Move the added tokens of tokenizer.json `spec` that are not special (Qwen3's `<think>`
    and `</think>`, DeepSeek-R1's), and the special ones formats write (`FORMAT_MARKERS`, not
    an end of sequence), into its vocabulary, spelled in the byte-level alphabet.
    llguidance takes every added token for a special one, which no text of a grammar matches:
    a grammar that writes `</think>` could then never be satisfied by the token a model closes
    its thinking with. (llguidance then tokenizes such a tag as the text it is, which only
    matters for the tokens it proposes as forced.) Byte-level vocabularies only."""
    vocab = (spec.get("model") or {}).get("vocab")
    added = spec.get("added_tokens") or []
    if not isinstance(vocab, dict) or "ByteLevel" not in json.dumps(spec.get("decoder")):
        return
    alphabet = _byte_level_alphabet()
    kept = []
    for token in added:
        spelled = "".join(alphabet[b] for b in token["content"].encode())
        marker = token["content"] in FORMAT_MARKERS and token["id"] not in eos_token_ids
        if (token.get("special") and not marker) or spelled in vocab:  # an entry already
            kept.append(token)
        else:
            vocab[spelled] = token["id"]
    spec["added_tokens"] = kept
