"""The calls a client answers with the model's tokenizer alone, without the engine: tokenize,
detokenize, render a chat template, spell tokens.

What it owns: `TokenizerCalls`, the part of `EngineClient` (engine_client.py) that never
reaches the engine process, so it works on any engine, of any task, and costs no step. The
work is the input processor's (input_processor.py: long inputs off the event loop) and the
confined tokenizer's (confined_tokenizer.py: one thread per tokenizer instance).

Why a mixin: these are `EngineClient` methods (one object per engine, what users call) over its
tokenizer state; `EngineClient` inherits them, and this module declares what it relies on.

Invariant: no call here uses a tokenizer instance off the thread it is confined to; the ones
that must run on the event loop's thread say so.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from trio_llm.client.confined_tokenizer import ConfinedTokenizer
from trio_llm.client.input_processor import InputProcessor
from trio_llm.client.output_processor import OutputProcessor

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class TokenizerCalls:
    """The tokenizer calls of `EngineClient`, which provides what is declared here."""

    tokenizer: PreTrainedTokenizerBase
    _tokenizer: ConfinedTokenizer
    _inputs: InputProcessor
    _outputs: OutputProcessor

    async def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return await self._inputs.encode(text, add_special_tokens=add_special_tokens)

    async def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        """The text of `token_ids` (a long list is decoded off the event loop)."""
        return await self._tokenizer.decode(
            list(token_ids), skip_special_tokens=skip_special_tokens
        )

    async def vocab_tokens(self, token_ids: Sequence[int]) -> list[str]:
        """Each id's entry in the vocabulary, as the tokenizer spells it ('Ġthe')."""
        return await self._tokenizer.vocab_tokens(list(token_ids))

    @property
    def chat_template(self) -> str | None:
        """The model's chat template text (None: it has none, or only named ones)."""
        template = getattr(self.tokenizer, "chat_template", None)
        return template if isinstance(template, str) else None

    async def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        chat_template_kwargs: dict[str, Any] | None = None,
        add_special_tokens: bool = False,
    ) -> list[int]:
        """Render `messages` with the model's chat template and tokenize the result (with
        `add_special_tokens`, the tokenizer's special tokens on top of the template's)."""
        return await self._inputs.apply_chat_template(
            messages,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            chat_template_kwargs=chat_template_kwargs,
            add_special_tokens=add_special_tokens,
        )

    def decoded_tokens(self, token_ids: Sequence[int]) -> list[str]:
        """The text logprobs show for each token (a partial UTF-8 character as `bytes:\\xNN`).
        On the event loop's thread only."""
        return [self._outputs.decoded_token(t) for t in token_ids]
