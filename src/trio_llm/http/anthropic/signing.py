"""Thinking blocks' `signature`: an HMAC-SHA256 of the thinking under the server's secret, so a
thinking block a client passes back is known to be one this server wrote, unedited.

Anthropic's signatures are opaque and verified on the way back in (an edited block is a 400);
these are too. The key is `--thinking-secret` (TRIO_LLM_THINKING_SECRET) where it is given,
else random per process: without a secret, signatures do not survive a restart and are not
shared by several frontends behind one router, so a conversation carried across either gets a
400 naming its thinking block. Invariant: verification takes constant time in the signature.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

PROCESS_KEY = secrets.token_bytes(32)
"""The key without --thinking-secret: this process's only."""


def thinking_key(secret: str | None) -> bytes:
    """The key signatures are made with: the configured secret's bytes, or this process's."""
    return secret.encode() if secret else PROCESS_KEY


def sign(thinking: str, key: bytes) -> str:
    digest = hmac.new(key, thinking.encode("utf-8", errors="surrogatepass"), hashlib.sha256)
    return base64.b64encode(digest.digest()).decode("ascii")


def verify(thinking: str, signature: str | None, key: bytes) -> bool:
    """Whether `signature` is what this server signed `thinking` with."""
    return signature is not None and hmac.compare_digest(
        sign(thinking, key).encode(), signature.encode("utf-8", errors="surrogatepass")
    )
