"""Reading one picture a request names: a data: URL decoded, an http(s) URL fetched (bounded
in time and size, from the allowed domains), a file:// URL read under the allowed directory.

Invariant: every way a picture cannot be had ends in a 400 naming the request's field
(`messages[1].content[0].image_url`), never a 500 and never a wait past the fetch timeout;
redirects are not followed, so an allowed domain cannot hand the fetch to another.
"""

from __future__ import annotations

import base64
import binascii
from pathlib import Path
from urllib.parse import unquote, urlsplit

import anyio
import anyio.to_thread
import httpx

from trio_llm.http.errors import ProtocolError, bad_request
from trio_llm.http.media.policy import MediaPolicy


async def read_image(url: str, policy: MediaPolicy, param: str) -> bytes:
    """The encoded picture at `url` (not decoded: the model's processor does that)."""
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "data":
        return _data_url(url, policy, param)
    if scheme in ("http", "https"):
        return await _fetch(url, policy, param)
    if scheme == "file":
        return await _local_file(url, policy, param)
    raise bad_request(
        f"{param}: give the image as a data: URL (base64) or an http(s) URL"
        + (" or a file:// URL" if policy.allowed_local_path else ""),
        param=param,
    )


def _too_large(policy: MediaPolicy, param: str) -> ProtocolError:
    return bad_request(f"{param}: the image is larger than {policy.max_bytes} bytes", param=param)


def _data_url(url: str, policy: MediaPolicy, param: str) -> bytes:
    head, comma, data = url.partition(",")
    if not comma or not head.lower().endswith(";base64"):
        raise bad_request(
            f"{param}: a data: URL must be base64 (data:image/png;base64,...)", param=param
        )
    if len(data) * 3 // 4 > policy.max_bytes + 3:
        raise _too_large(policy, param)
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise bad_request(f"{param}: the data: URL is not valid base64", param=param) from None
    if len(raw) > policy.max_bytes:
        raise _too_large(policy, param)
    return raw


def _allowed_host(host: str, domains: tuple[str, ...]) -> bool:
    return not domains or any(host == d or host.endswith("." + d) for d in domains)


async def _fetch(url: str, policy: MediaPolicy, param: str) -> bytes:
    host = (urlsplit(url).hostname or "").lower()
    if not _allowed_host(host, policy.allowed_domains):
        raise bad_request(
            f"{param}: the host {host!r} is not among the allowed media domains "
            "(--allowed-media-domains)",
            param=param,
        )
    body = bytearray()
    try:
        with anyio.fail_after(policy.fetch_timeout):
            async with (
                httpx.AsyncClient(timeout=policy.fetch_timeout, follow_redirects=False) as client,
                client.stream("GET", url) as response,
            ):
                if response.status_code != 200:
                    raise bad_request(
                        f"{param}: fetching the image answered HTTP {response.status_code}",
                        param=param,
                    )
                async for chunk in response.aiter_bytes():
                    body += chunk
                    if len(body) > policy.max_bytes:
                        raise _too_large(policy, param)
    except TimeoutError:
        raise bad_request(
            f"{param}: fetching the image timed out after {policy.fetch_timeout:g} s", param=param
        ) from None
    except httpx.HTTPError as error:
        raise bad_request(f"{param}: cannot fetch the image: {error}", param=param) from None
    return bytes(body)


async def _local_file(url: str, policy: MediaPolicy, param: str) -> bytes:
    root = policy.allowed_local_path
    if root is None:
        raise bad_request(
            f"{param}: file:// URLs are not allowed (--allowed-local-media-path)", param=param
        )
    parts = urlsplit(url)
    if parts.netloc not in ("", "localhost"):
        raise bad_request(f"{param}: a file:// URL names no other host", param=param)

    def read() -> bytes:
        path = Path(unquote(parts.path)).resolve()
        if not path.is_relative_to(root):
            raise bad_request(
                f"{param}: the file is outside the allowed local media path", param=param
            )
        try:
            if path.stat().st_size > policy.max_bytes:
                raise _too_large(policy, param)
            return path.read_bytes()
        except OSError as error:
            raise bad_request(
                f"{param}: cannot read the file: {error.strerror}", param=param
            ) from None

    return await anyio.to_thread.run_sync(read)
