"""LoRA adapters at run time (vLLM's routes, behind --allow-runtime-lora-updating as vLLM keeps
them behind VLLM_ALLOW_RUNTIME_LORA_UPDATING): POST /v1/load_lora_adapter and
/v1/unload_lora_adapter. protocol.py holds the bodies, endpoint.py the handlers; an adapter is
then a `model` of /v1/models (with its base as `parent`) that generating requests may name."""
