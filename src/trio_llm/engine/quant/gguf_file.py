"""A GGUF file's tensor directory, read without parsing its metadata values.

Why not `gguf.GGUFReader`: it decodes every metadata field into numpy views, and the tokenizer's
fields (49,152 tokens and their merges for the default model) took 15 s of a 17 s load here;
the weights need only the tensors' names, formats, shapes and offsets, and the architecture.
Values are skipped by their lengths; the tensor data is a read-only memory map.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

_MAGIC = b"GGUF"
_SCALARS = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
"""GGUF metadata value types of fixed size: their byte counts (uint8 ... float64)."""
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    tensor_type: GGMLQuantizationType
    shape: tuple[int, ...]
    """ggml's order: the innermost (input) dimension first."""
    data: np.ndarray
    """The raw bytes, [rows, bytes per row] (uint8, memory-mapped)."""


@dataclass(frozen=True, slots=True)
class GGUFFile:
    tensors: dict[str, TensorInfo]
    architecture: str


def _u32(f: BinaryIO) -> int:
    return int(struct.unpack("<I", f.read(4))[0])


def _u64(f: BinaryIO) -> int:
    return int(struct.unpack("<Q", f.read(8))[0])


def _string(f: BinaryIO) -> bytes:
    return f.read(_u64(f))


def _skip_value(f: BinaryIO, kind: int) -> None:
    if kind in _SCALARS:
        f.seek(_SCALARS[kind], 1)
    elif kind == _STRING:
        f.seek(_u64(f), 1)
    elif kind == _ARRAY:
        item, count = _u32(f), _u64(f)
        if item in _SCALARS:
            f.seek(_SCALARS[item] * count, 1)
        else:
            for _ in range(count):
                _skip_value(f, item)
    else:
        raise ValueError(f"unknown GGUF metadata type {kind}")


def read(path: Path) -> GGUFFile:
    with open(path, "rb") as f:
        if f.read(4) != _MAGIC:
            raise ValueError(f"{path} is not a GGUF file")
        version = _u32(f)
        if version < 2:
            raise ValueError(f"{path}: GGUF version {version} is not supported")
        num_tensors, num_fields = _u64(f), _u64(f)
        architecture, alignment = "", 32
        for _ in range(num_fields):
            key, kind = _string(f), _u32(f)
            if key == b"general.architecture" and kind == _STRING:
                architecture = _string(f).decode()
            elif key == b"general.alignment" and kind == 4:
                alignment = _u32(f)
            else:
                _skip_value(f, kind)
        infos = []
        for _ in range(num_tensors):
            name = _string(f).decode()
            dims = tuple(_u64(f) for _ in range(_u32(f)))
            infos.append((name, dims, GGMLQuantizationType(_u32(f)), _u64(f)))
        start = -(-f.tell() // alignment) * alignment
    mapped = np.memmap(path, dtype=np.uint8, mode="r")
    tensors = {}
    for name, dims, kind, offset in infos:
        block, size = GGML_QUANT_SIZES[kind]
        row_bytes = dims[0] // block * size
        rows = int(np.prod(dims[1:], dtype=np.int64)) if len(dims) > 1 else 1
        data = mapped[start + offset : start + offset + rows * row_bytes].reshape(rows, row_bytes)
        tensors[name] = TensorInfo(name, kind, dims, data)
    return GGUFFile(tensors, architecture)
