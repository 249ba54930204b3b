"""The request fields this server knows but does not build yet: the one list of refusals.

Each field here would change the output (beam search, legacy functions, documents, ...), so a
request that asks for it gets a 400 naming the field rather than a 200 with the wrong behaviour.
When an issue builds one of these features, it removes the field's row here and gives the field
its real type in protocol.py. Fields in neither place are unknown and stay ignored, as OpenAI's
API ignores them.

Invariants: a field is refused only when its value asks for the feature (`use_beam_search:
false`, `function_call: "none"` and empty `functions` pass),
and the check reads only these fields of the body (a msgspec Struct made from this list), so
the request types in protocol.py stay what the server implements.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from trio_llm.http.errors import bad_request, not_supported


@dataclass(frozen=True, slots=True)
class Unbuilt:
    field: str
    what: str
    """The feature, as the 400 names it: "<what> is not supported yet by this server"."""
    asks: Callable[[Any], bool]
    """Whether the field's JSON value asks for the feature."""


def _given(value: Any) -> bool:
    return value is not None


def _true(value: Any) -> bool:
    return value is True


def _false(value: Any) -> bool:
    return value is False


def _non_empty(value: Any) -> bool:
    return value is not None and value != [] and value != {} and value != ""


def _tool_choice(value: Any) -> bool:
    return value not in (None, "none", "auto")


def _not_only_text(value: Any) -> bool:
    return value is not None and value != ["text"]


UNBUILT: tuple[Unbuilt, ...] = (
    Unbuilt("use_beam_search", "Beam search", _true),
    Unbuilt("structural_tag", "Structured outputs (structural_tag)", _given),
    # The legacy function-calling fields (tools and tool_choice replace them).
    Unbuilt("functions", "Function calling (the legacy functions; use tools)", _non_empty),
    Unbuilt("function_call", "Function calling (function_call; use tool_choice)", _tool_choice),
    # Prompts and templates.
    Unbuilt("chat_template", "A chat template given in the request", _given),
    Unbuilt("documents", "Documents for the chat template", _non_empty),
    Unbuilt("prompt_embeds", "Prompt embeddings", _given),
    Unbuilt("suffix", "suffix (insertion)", _non_empty),
    # Outputs.
    Unbuilt("logprob_token_ids", "logprob_token_ids", _given),
    Unbuilt("return_tokens_as_token_ids", "return_tokens_as_token_ids", _true),
    Unbuilt("spaces_between_special_tokens", "spaces_between_special_tokens false", _false),
    Unbuilt("logits_processors", "Custom logits processors", _non_empty),
    Unbuilt("repetition_detection", "repetition_detection", _given),
    Unbuilt("watermarking", "Watermarking", _true),
    Unbuilt("modalities", "Output modalities other than text", _not_only_text),
    Unbuilt("audio", "Audio output", _given),
    Unbuilt("web_search_options", "Web search", _given),
)

_Fields = msgspec.defstruct(
    "UnbuiltFields",
    [(u.field, Any, None) for u in UNBUILT],
    kw_only=True,
)
"""Reads only the listed fields of a body; the rest is skipped."""


def refuse_unbuilt(body: bytes) -> None:
    """Raise the 400 of the first listed field whose value asks for its feature."""
    try:
        fields = msgspec.json.decode(body, type=_Fields)
    except RecursionError:
        raise bad_request("Invalid JSON body: nested too deeply") from None
    except msgspec.DecodeError as error:  # the request's own decode passed: not expected
        raise bad_request(f"Invalid JSON body: {error}") from None
    for unbuilt in UNBUILT:
        if unbuilt.asks(getattr(fields, unbuilt.field)):
            raise not_supported(unbuilt.field, unbuilt.what)
