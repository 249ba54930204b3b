"""A rendered conversation's pictures made part of its prompt: each one read (http/media), then
decoded and expanded by the model's processor (client/images.py, on a worker thread), its
errors a 400 naming the picture's field. Shared by every endpoint whose conversation may hold
pictures."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from trio_llm.client.images import ImagePrompt, InvalidImageError
from trio_llm.http.conversation import ImageRef
from trio_llm.http.errors import bad_request
from trio_llm.http.media import MediaPolicy, read_image

if TYPE_CHECKING:
    from trio_llm.client import EngineClient


async def with_images(
    engine: EngineClient, token_ids: list[int], images: Sequence[ImageRef], policy: MediaPolicy
) -> ImagePrompt:
    """`token_ids` (one image token per picture, in order) with the pictures' placeholders and
    pixel values."""
    if len(images) > policy.max_images:
        extra = images[policy.max_images].param
        raise bad_request(
            f"{extra}: at most {policy.max_images} images a request (--limit-mm-per-prompt)",
            param=extra,
        )
    pictures = [await read_image(ref.url, policy, ref.param) for ref in images]
    try:
        return await engine.expand_images(token_ids, pictures, max_pixels=policy.max_pixels)
    except InvalidImageError as error:
        param = images[error.index].param if error.index is not None else images[0].param
        raise bad_request(f"{param}: {error}", param=param) from None
