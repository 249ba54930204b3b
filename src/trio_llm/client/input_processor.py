"""Input processing: what a caller asks for becomes engine requests.

What it owns: chat template rendering, tokenization, prompt validation against the model's
context length and vocabulary, and the fan-out of `n > 1` into n engine requests.

Invariants:
- Every check runs before anything reaches the engine, and each error names what to fix
  (`PromptTooLongError` carries both the prompt's token count and `max_tokens`).
- A large input is tokenized (and its chat template rendered) on a worker thread, so one big
  prompt never stalls the event loop that streams everyone else's tokens. A structured-output
  constraint is validated with the grammar library on a worker thread too, unless it was
  validated lately. The tokenizer is
  reached only through `ConfinedTokenizer.run`, which hands each thread its own instance.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import anyio.to_thread
import jinja2
import msgspec

from trio_llm.client.confined_tokenizer import ConfinedTokenizer
from trio_llm.client.errors import ChatTemplateError, InvalidPromptError, PromptTooLongError
from trio_llm.constraint import Constraint
from trio_llm.engine import grammar
from trio_llm.ipc.messages import EngineCoreRequest
from trio_llm.sampling_params import SamplingParams, SamplingParamsError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class InputProcessor:
    def __init__(
        self, tokenizer: ConfinedTokenizer, *, max_model_len: int, vocab_size: int
    ) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size

    async def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return await self.tokenizer.run(len(text), _encode, text, add_special_tokens)

    async def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> list[int]:
        size = sum(len(str(message.get("content") or "")) for message in messages)
        return await self.tokenizer.run(
            size,
            _render_and_encode,
            messages,
            add_generation_prompt,
            continue_final_message,
            chat_template_kwargs or {},
        )

    def check_request(self, prompt_token_ids: Sequence[int], params: SamplingParams) -> None:
        """Raise `SamplingParamsError` or `InvalidPromptError` if the engine must not see this."""
        params.validate()
        params.validate_vocab(self.vocab_size)
        if not prompt_token_ids:
            raise InvalidPromptError("the prompt is empty: give at least one token")
        if min(prompt_token_ids) < 0 or max(prompt_token_ids) >= self.vocab_size:
            raise InvalidPromptError(
                f"the prompt holds token ids outside the vocabulary (size {self.vocab_size})"
            )
        # The wording is OpenAI's ("This model's maximum context length is"), which clients
        # (LiteLLM among them) match to tell a context overflow from other 400s.
        prompt_tokens, max_tokens = len(prompt_token_ids), params.max_tokens
        limit = self.max_model_len
        if prompt_tokens >= limit:
            raise PromptTooLongError(
                f"This model's maximum context length is {limit} tokens, but the prompt has "
                f"{prompt_tokens} tokens (it must leave room for at least one generated token)",
                param="prompt",
                prompt_tokens=prompt_tokens,
                max_tokens=max_tokens,
                max_model_len=limit,
            )
        if max_tokens is not None and prompt_tokens + max_tokens > limit:
            raise PromptTooLongError(
                f"This model's maximum context length is {limit} tokens, but "
                f"{prompt_tokens + max_tokens} were requested ({prompt_tokens} in the prompt, "
                f"{max_tokens} for the completion); shorten the prompt or ask for fewer tokens",
                param="max_tokens",
                prompt_tokens=prompt_tokens,
                max_tokens=max_tokens,
                max_model_len=limit,
            )

    @staticmethod
    async def check_constraint(constraint: Constraint) -> None:
        """Raise `SamplingParamsError` (param "constraint") unless the engine can enforce it."""
        try:
            if grammar.is_checked(constraint):
                grammar.check(constraint)
            else:
                await anyio.to_thread.run_sync(grammar.check, constraint, abandon_on_cancel=True)
        except grammar.ConstraintError as error:
            raise SamplingParamsError("constraint", str(error)) from None

    @staticmethod
    def engine_requests(
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        arrival_time: float,
        priority: int = 0,
    ) -> list[EngineCoreRequest]:
        """One engine request per choice. With n > 1, choice i is its own request with n=1 and,
        when a seed is given, seed + i, so the choices differ yet the whole call reproduces."""
        if params.n == 1:
            children = [(request_id, params)]
        else:
            children = [
                (
                    f"{i}_{request_id}",
                    msgspec.structs.replace(
                        params, n=1, seed=None if params.seed is None else params.seed + i
                    ),
                )
                for i in range(params.n)
            ]
        return [
            EngineCoreRequest(
                request_id=child_id,
                prompt_token_ids=prompt_token_ids,
                sampling_params=child_params,
                arrival_time=arrival_time,
                priority=priority,
            )
            for child_id, child_params in children
        ]


def _encode(tokenizer: PreTrainedTokenizerBase, text: str, add_special_tokens: bool) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=add_special_tokens))


def _render_and_encode(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool,
    continue_final_message: bool,
    chat_template_kwargs: dict[str, Any],
) -> list[int]:
    try:
        text = tokenizer.apply_chat_template(
            messages,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            **chat_template_kwargs,
        )
    except (ValueError, jinja2.TemplateError) as exc:
        raise ChatTemplateError(f"cannot render the chat template: {exc}") from exc
    # The template already wrote the special tokens (BOS and the role markers) as text.
    return _encode(tokenizer, str(text), add_special_tokens=False)
