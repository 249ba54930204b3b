"""Thinking blocks' `signature`: the thinking sealed under the server's secret, so a thinking
block a client passes back is known to be one this server wrote, unedited, and a block sent
back empty (`display: "omitted"`) still brings its thinking back, as Anthropic's do.

Anthropic's signatures are opaque and verified on the way back in (an edited block is a 400);
these are too: a random nonce, the thinking XORed with an HMAC-SHA256 keystream, and an
HMAC-SHA256 tag over both (encrypt-then-MAC, the standard library only). The key is
`--thinking-secret` (TRIO_LLM_THINKING_SECRET) where it is given, else random per process:
without a secret, signatures do not survive a restart and are not shared by several frontends
behind one router, so a conversation carried across either gets a 400 naming its thinking
block. Invariant: the tag is compared in constant time.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets

PROCESS_KEY = secrets.token_bytes(32)
"""The key without --thinking-secret: this process's only."""

_NONCE = 16
_TAG = 32


def thinking_key(secret: str | None) -> bytes:
    """The key signatures are made with: the configured secret's bytes, or this process's."""
    return secret.encode() if secret else PROCESS_KEY


def _mac(key: bytes, *parts: bytes) -> bytes:
    return hmac.new(key, b"".join(parts), hashlib.sha256).digest()


def _xor(key: bytes, nonce: bytes, data: bytes) -> bytes:
    """`data` XOR the keystream of (key, nonce): HMAC-SHA256 of a counter, block by block."""
    stream = b"".join(
        _mac(key, b"stream", nonce, i.to_bytes(8, "big")) for i in range(-(-len(data) // 32))
    )
    mixed = int.from_bytes(data, "big") ^ int.from_bytes(stream[: len(data)], "big")
    return mixed.to_bytes(len(data), "big")


def sign(thinking: str, key: bytes) -> str:
    nonce = secrets.token_bytes(_NONCE)
    sealed = _xor(key, nonce, thinking.encode("utf-8", errors="surrogatepass"))
    return base64.b64encode(nonce + sealed + _mac(key, b"tag", nonce, sealed)).decode("ascii")


def unseal(signature: str | None, key: bytes) -> str | None:
    """The thinking `signature` carries when this server made it with `key`; None otherwise
    (not ours, edited, or made under another key)."""
    try:
        raw = base64.b64decode(signature or "", validate=True)
    except (binascii.Error, ValueError):
        return None
    if len(raw) < _NONCE + _TAG:
        return None
    nonce, sealed, tag = raw[:_NONCE], raw[_NONCE:-_TAG], raw[-_TAG:]
    if not hmac.compare_digest(tag, _mac(key, b"tag", nonce, sealed)):
        return None
    try:
        return _xor(key, nonce, sealed).decode("utf-8", errors="surrogatepass")
    except UnicodeDecodeError:
        return None
