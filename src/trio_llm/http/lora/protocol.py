"""The bodies of POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's fields, plus
`base_model_name` for a server with several models).

Invariant: nothing here touches Quart or the engine.
"""

from __future__ import annotations

from msgspec import Struct


class LoadLoraAdapterRequest(Struct, kw_only=True):
    lora_name: str
    """The `model` requests will name it by."""
    lora_path: str
    """A PEFT adapter directory on the server's machine."""
    base_model_name: str | None = None
    """The served model to load it on (default: the first with LoRA enabled)."""
    load_inplace: bool = False
    """Replace an adapter of that name loaded already (its requests in flight finish on it)."""


class UnloadLoraAdapterRequest(Struct, kw_only=True):
    lora_name: str
    lora_int_id: int | None = None
    """Accepted for vLLM's clients; adapters are known by name here."""


WIRE_TYPES: tuple[type[Struct], ...] = (LoadLoraAdapterRequest, UnloadLoraAdapterRequest)
