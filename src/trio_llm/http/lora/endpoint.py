"""POST /v1/load_lora_adapter and /v1/unload_lora_adapter: the handlers (registered only with
--allow-runtime-lora-updating; without it both are 404, as in vLLM).

A load reaches every live replica of the base model, and the adapter is served (listed, and
routed to) only once all have it; one that refuses it fails the load with its reason (400), and
the others unload it again. An unload takes the name out of service at once (new requests get
404) and lets the requests in flight on it finish. Both answer vLLM's plain-text success line.
"""

from __future__ import annotations

from quart import Response

from trio_llm.client.errors import LoraError, LoraNotFoundError
from trio_llm.http.errors import ProtocolError, bad_request
from trio_llm.http.lora.protocol import LoadLoraAdapterRequest, UnloadLoraAdapterRequest
from trio_llm.http.runtime.bodies import decode_body
from trio_llm.http.runtime.state import current_state


def _text(message: str) -> Response:
    return Response(message, status=200, mimetype="text/plain")


def _not_found(name: str) -> ProtocolError:
    return ProtocolError(
        404,
        f"The lora adapter '{name}' cannot be found.",
        param="lora_name",
        code="model_not_found",
    )


async def load_lora_adapter(raw: bytes | None = None) -> Response:
    req = await decode_body(LoadLoraAdapterRequest, raw)
    name, path = req.lora_name.strip(), req.lora_path.strip()
    if not name:
        raise bad_request("lora_name must not be empty", param="lora_name")
    if not path:
        raise bad_request("lora_path must not be empty", param="lora_path")
    state = current_state()
    base = state.lora_base(req.base_model_name)
    router = state.router
    if name in router.names():
        raise bad_request(f"'{name}' is a base model's name", param="lora_name")
    if router.lora_for(name) is not None:
        if not req.load_inplace:
            raise bad_request(
                f"The lora adapter '{name}' has already been loaded.", param="lora_name"
            )
        await router.unload_lora(name)
    try:
        await router.load_lora(name, path, model=base)
    except LoraError as error:
        message = f"Cannot load the lora adapter '{name}': {error}"
        raise bad_request(message, param="lora_path") from None
    return _text(f"Success: LoRA adapter '{name}' added successfully.")


async def unload_lora_adapter(raw: bytes | None = None) -> Response:
    req = await decode_body(UnloadLoraAdapterRequest, raw)
    try:
        await current_state().router.unload_lora(req.lora_name)
    except LoraNotFoundError:
        raise _not_found(req.lora_name) from None
    return _text(f"Success: LoRA adapter '{req.lora_name}' removed successfully.")
