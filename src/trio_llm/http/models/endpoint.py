"""What a client asks about the served models without generating: GET /v1/models and
/v1/models/{id} (OpenAI's), POST /tokenize and /detokenize (vLLM's, same bodies and answers).

The model list answers from what each model was when its engine first came up, so it keeps
answering while a dead engine restarts; tokenization needs a live engine's tokenizer (any
replica of the model: they share it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from quart import Response

from trio_llm.http.conversation import chat_messages, check_template_kwargs, uses_tools
from trio_llm.http.errors import bad_request
from trio_llm.http.models.protocol import (
    DetokenizeRequest,
    DetokenizeResponse,
    ModelCard,
    ModelList,
    TokenizeRequest,
    TokenizeResponse,
)
from trio_llm.http.runtime.bodies import by_body_size, decode_body, json_response, read_body
from trio_llm.http.runtime.state import ModelInfo, current_state
from trio_llm.http.sampling import check_token_ids
from trio_llm.http.tools import plan_tools

if TYPE_CHECKING:
    from trio_llm.client import EngineClient


def _card(model: ModelInfo) -> ModelCard:
    return ModelCard(
        model.name,
        model.created,
        model.max_model_len,
        input_modalities=list(model.input_modalities),
    )


def _cards() -> list[ModelCard]:
    """The served models, then their LoRA adapters (each with its base as `parent`)."""
    state = current_state()
    loras = [
        ModelCard(name, base.created, base.max_model_len, root=path, parent=base.name)
        for base, name, path in state.lora_cards()
    ]
    return [_card(card) for card in state.cards()] + loras


async def list_models() -> Response:
    return json_response(ModelList(_cards()))


async def model_card(model_id: str) -> Response:
    found = next((card for card in _cards() if card.id == model_id), None)
    return json_response(found or _card(current_state().card(model_id)))


def _engine(model: str | None) -> tuple[EngineClient, ModelInfo]:
    """Any model tokenizes, whatever endpoint it serves."""
    lease, info = current_state().lease(model, task=None)
    return lease.client, info


async def tokenize() -> Response:
    raw = await read_body()
    req = await decode_body(TokenizeRequest, raw)
    engine, model = _engine(req.model)
    if (req.prompt is None) == (req.messages is None):
        raise bad_request("give exactly one of prompt or messages", param="prompt")
    if req.prompt is not None:
        add_special = True if req.add_special_tokens is None else req.add_special_tokens
        ids = await engine.encode(req.prompt, add_special_tokens=add_special)
    else:
        assert req.messages is not None
        check_template_kwargs(req.chat_template_kwargs)
        messages = await by_body_size(len(raw), chat_messages, req.messages)
        if uses_tools(messages):  # written out as chat renders them
            parser = getattr(engine, "tool_call_parser", None)
            parser = parser or current_state().config.tool_call_parser
            messages = plan_tools(
                [], None, None, messages, chat_template=engine.chat_template, parser=parser
            ).messages
        ids = await engine.apply_chat_template(
            messages,
            add_generation_prompt=req.add_generation_prompt,
            continue_final_message=req.continue_final_message,
            chat_template_kwargs=req.chat_template_kwargs,
        )
    response = TokenizeResponse(len(ids), model.max_model_len, ids)
    if req.return_token_strs:
        response.token_strs = await engine.vocab_tokens(ids)
    return json_response(response)


async def detokenize() -> Response:
    req = await decode_body(DetokenizeRequest)
    engine, model = _engine(req.model)
    check_token_ids(req.tokens, model.vocab_size, "tokens")
    return json_response(DetokenizeResponse(await engine.decode(req.tokens)))
