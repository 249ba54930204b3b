"""A sequence's images in the engine: their pixels, their placeholder runs, their features
while the prompt's prefill needs them, and what they add to the prefix cache's block keys.

Invariants:
- An image goes through the vision tower once per prefill: its features are kept from the step
  whose chunk first reaches its placeholders until the chunk that computes its last one, then
  dropped (a preemption, which recomputes the prompt, encodes it again from the pixels kept).
- A block's key is its tokens plus, for every image whose placeholders it holds, the image's
  content digest and where in the image the block starts: two prompts with equal tokens but
  different images never share a block, and the same image in a later request does.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from trio_llm.ipc.messages import ImageInput

if TYPE_CHECKING:
    from trio_llm.engine.models.vision import VisionEncoder


class ImageError(ValueError):
    """A request's images do not fit its prompt or its model."""


@dataclass(slots=True, eq=False)
class ImageSlot:
    offset: int
    length: int
    """The span from its first placeholder to its last (Idefics3 puts row and column tokens
    between a tiled image's runs of placeholders)."""
    placeholders: np.ndarray
    """The placeholders' positions within the span, in order: row k of the features embeds
    position offset + placeholders[k]."""
    pixels: torch.Tensor
    """[C, H, W] or [tiles, C, H, W] float32, on the CPU."""
    digest: bytes
    features: torch.Tensor | None = None
    """[length, hidden] once encoded, until the prefill has passed the image."""

    @property
    def end(self) -> int:
        return self.offset + self.length


def slots_of(
    images: Seq[ImageInput], prompt: Seq[int], vision: VisionEncoder | None
) -> list[ImageSlot]:
    """The engine's slots for a request's images; ImageError when the model takes none, or an
    image is not one its tower reads, or its placeholders are not where the request says."""
    if vision is None:
        raise ImageError("this model does not take images")
    image_token_id = vision.image_token_id
    slots = []
    end = 0
    for i, image in enumerate(images):
        if image.offset < end or image.length < 1 or image.offset + image.length > len(prompt):
            raise ImageError(f"image {i}'s placeholders lie outside the prompt or overlap")
        span = np.asarray(prompt[image.offset : image.offset + image.length])
        placeholders = np.flatnonzero(span == image_token_id)
        if span[0] != image_token_id or span[-1] != image_token_id:
            raise ImageError(f"image {i}'s span does not start and end with placeholders")
        why = vision.check(image.shape, len(placeholders))
        if why is not None:
            raise ImageError(f"image {i}: {why}")
        count = int(np.prod(image.shape))
        if len(image.pixels) != 4 * count:
            raise ImageError(f"image {i} has {len(image.pixels)} bytes of pixels, not {4 * count}")
        pixels = torch.from_numpy(np.frombuffer(image.pixels, "<f4").reshape(image.shape).copy())
        slots.append(ImageSlot(image.offset, image.length, placeholders, pixels, image.digest))
        end = image.offset + image.length
    return slots


def block_key(
    token_ids: Seq[int], images: Seq[ImageSlot], index: int, block_size: int
) -> tuple[object, ...]:
    """Block `index`'s key: its tokens, then (digest, offset into the image) of each image
    whose placeholders it holds."""
    start = index * block_size
    end = start + block_size
    key: tuple[object, ...] = tuple(token_ids[start:end])
    for image in images:
        if image.offset < end and image.end > start:
            key += ((image.digest, start - image.offset),)
    return key


def image_rows(
    images_of: Seq[Seq[ImageSlot]],
    starts: np.ndarray,
    ends: np.ndarray,
    cu: np.ndarray,
    encode: Callable[[torch.Tensor], torch.Tensor],
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The packed rows of a step's image placeholders and the features that embed them
    (sequence i, whose images are `images_of[i]`, computes positions starts[i]:ends[i] at
    rows cu[i]:cu[i+1]): an image is
    encoded when a chunk first reaches it, its features dropped with the chunk that ends it.
    None when no chunk of the step holds a placeholder."""
    rows: list[np.ndarray] = []
    features: list[torch.Tensor] = []
    for i, images in enumerate(images_of):
        start, end = int(starts[i]), int(ends[i])
        for image in images:
            lo, hi = max(start, image.offset), min(end, image.end)
            if lo >= hi:
                continue
            if image.features is None:
                image.features = encode(image.pixels)
            first, last = np.searchsorted(
                image.placeholders, [lo - image.offset, hi - image.offset]
            )
            if first < last:
                at = image.placeholders[first:last] + image.offset
                rows.append(at + (int(cu[i]) - start))
                features.append(image.features[first:last])
            if hi == image.end:
                image.features = None
    if not rows:
        return None
    return torch.from_numpy(np.concatenate(rows)).to(device), torch.cat(features)
