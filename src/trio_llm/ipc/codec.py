"""The engine protocol's wire format: msgpack through msgspec, one decoder per direction.

Owns the encoder and the two decoders. Invariant: `decode_frontend_message(encode(m)) == m` for
every `FrontendMessage` m, and likewise for `EngineMessage`; a decoder rejects any message that
does not belong to its direction (`msgspec.ValidationError`), so a request can never be misread
as an output. Decoders accept any buffer (bytes, bytearray, memoryview) without copying it.
"""

from __future__ import annotations

import msgspec

from trio_llm.ipc.messages import EngineMessage, FrontendMessage

__all__ = ["DecodeError", "decode_engine_message", "decode_frontend_message", "encode"]

DecodeError = msgspec.DecodeError
"""Raised for malformed bytes; its subclass `msgspec.ValidationError` for a wrong type."""

_encoder = msgspec.msgpack.Encoder()
_frontend_decoder = msgspec.msgpack.Decoder(FrontendMessage)
_engine_decoder = msgspec.msgpack.Decoder(EngineMessage)

encode = _encoder.encode
"""encode(msg) -> bytes, for any message of either direction."""


def decode_frontend_message(buf: bytes | bytearray | memoryview) -> FrontendMessage:
    """What the engine reads from the request ring."""
    return _frontend_decoder.decode(buf)


def decode_engine_message(buf: bytes | bytearray | memoryview) -> EngineMessage:
    """What the frontend reads from the output ring."""
    return _engine_decoder.decode(buf)
