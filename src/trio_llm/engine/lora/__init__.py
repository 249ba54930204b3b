"""LoRA adapters served on the base model, many at once, batched together.

A layer over whatever computes the base model's projections: the forward runs each projection
as before (its `linear`, shared by every row of the step), then adds, to the rows of each
adapter, that adapter's low-rank update. Modules:

- `targets.py`: which matmuls of the forward adapters may add to, and their shapes;
- `adapter.py`: reading a PEFT adapter and checking it against those;
- `stacks.py`: every slot's weights, stacked per target (allocated once, at start);
- `batch.py`: one step's rows grouped by adapter, and the batched update;
- `modules.py`: the transformers path (Linears wrapped by modules that call the batch);
- `registry.py`: the engine's loaded adapters, their slots and prefix-cache roots.
"""

from trio_llm.engine.lora.adapter import Adapter, LoraLoadError, read_adapter
from trio_llm.engine.lora.batch import LoraBatch
from trio_llm.engine.lora.modules import LoraHook, LoraLinear, wrap_linears
from trio_llm.engine.lora.registry import (
    LoadedAdapter,
    LoraNotFoundError,
    LoraRegistry,
    adapter_root,
)
from trio_llm.engine.lora.stacks import LoraStacks
from trio_llm.engine.lora.targets import Target, fused_targets

__all__ = [
    "Adapter",
    "LoadedAdapter",
    "LoraBatch",
    "LoraHook",
    "LoraLinear",
    "LoraLoadError",
    "LoraNotFoundError",
    "LoraRegistry",
    "LoraStacks",
    "Target",
    "adapter_root",
    "fused_targets",
    "read_adapter",
    "wrap_linears",
]
