"""Quantized weight formats the own forward multiplies by: 4- and 8-bit weights on torch's CPU
kernels (`weights`), and a GGUF file's blocks unpacked into them (`gguf_blocks`, `gguf_file`).

Which weights run quantized, and how a model's forward gets them, is the models' business
(models/quantized.py, models/gguf.py); this package knows formats and kernels only, and imports
nothing else of the engine. Everything but the linear layers' matrices (and the embedding and
LM head) stays float in the activations' dtype: norms, biases, rotary tables, the KV cache.
"""

from trio_llm.engine.quant.weights import (
    NEVER_DENSE,
    Int4Weight,
    Int8Weight,
    QuantizedWeight,
    dispatching,
    embedding,
    is_quantized,
    kernel_dtype,
    quantize_int4,
    quantize_int8,
)

__all__ = [
    "NEVER_DENSE",
    "Int4Weight",
    "Int8Weight",
    "QuantizedWeight",
    "dispatching",
    "embedding",
    "is_quantized",
    "kernel_dtype",
    "quantize_int4",
    "quantize_int8",
]
