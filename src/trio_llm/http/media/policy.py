"""What a request's pictures may be and where the server may read them from, as the server was
told (vLLM's flag names where vLLM has one).

Why the defaults: data: URLs always work; http(s) URLs are fetched from any domain unless
`--allowed-media-domains` narrows them (vLLM's default too), with a timeout and a size bound so
that one slow or huge URL cannot hold a request slot; file:// URLs are refused unless
`--allowed-local-media-path` names a directory, since they read the server's own disk.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trio_llm.http.flag_values import AddFlag, positive_int, seconds, size


@dataclass(frozen=True, slots=True)
class MediaPolicy:
    allowed_domains: tuple[str, ...] = ()
    """Hosts (and their subdomains) http(s) pictures may come from; empty: any."""
    allowed_local_path: Path | None = None
    """The directory file:// pictures may come from; None: no file:// URL."""
    fetch_timeout: float = 10.0
    """Seconds a fetch of one picture may take, connecting and reading together."""
    max_bytes: int = 20 << 20
    """Largest picture, encoded (a data: URL's decoded bytes, or a fetched body)."""
    max_pixels: int = 4096 * 4096
    """Largest picture, decoded (width times height)."""
    max_images: int = 8
    """Pictures one request may hold (--limit-mm-per-prompt)."""


def add_media_flags(add: AddFlag) -> None:
    defaults = MediaPolicy()
    add(
        "--allowed-media-domains",
        default="",
        help="comma-separated hosts that image URLs may name (their subdomains too); "
        "default: any host",
    )
    add(
        "--allowed-local-media-path",
        default="",
        help="a directory that file:// image URLs may read from; default: no file:// URL",
    )
    add(
        "--media-fetch-timeout",
        default=defaults.fetch_timeout,
        type=seconds,
        help="seconds fetching one image URL may take (default %(default)s)",
    )
    add(
        "--max-image-bytes",
        default=str(defaults.max_bytes),
        type=size,
        help="largest encoded image, fetched or inline (default 20MiB)",
    )
    add(
        "--max-image-pixels",
        default=defaults.max_pixels,
        type=positive_int,
        help="largest decoded image, in pixels (default %(default)s)",
    )
    add(
        "--limit-mm-per-prompt",
        default=str(defaults.max_images),
        help="images a request may hold: a number, or vLLM's JSON '{\"image\": N}' "
        "(default %(default)s)",
    )


def media_policy_of(args: argparse.Namespace) -> MediaPolicy:
    """The policy the parsed flags say; ValueError naming the flag at fault."""
    domains = tuple(d.strip().lower() for d in args.allowed_media_domains.split(",") if d.strip())
    local = None
    if args.allowed_local_media_path:
        local = Path(args.allowed_local_media_path).resolve()
        if not local.is_dir():
            raise ValueError(f"--allowed-local-media-path {str(local)!r} is not a directory")
    return MediaPolicy(
        allowed_domains=domains,
        allowed_local_path=local,
        fetch_timeout=float(args.media_fetch_timeout),
        max_bytes=int(args.max_image_bytes),
        max_pixels=int(args.max_image_pixels),
        max_images=_images_limit(str(args.limit_mm_per_prompt)),
    )


def _images_limit(text: str) -> int:
    try:
        value: Any = json.loads(text)
    except ValueError:
        value = None
    if isinstance(value, dict):
        value = value.get("image", MediaPolicy().max_images)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(
            f"--limit-mm-per-prompt {text!r}: give a number of images or '{{\"image\": N}}'"
        )
    return value
