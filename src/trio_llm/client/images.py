"""Images in a prompt, on the frontend's side: the model's own processor turns each picture
into pixel values and a run of placeholder tokens, and the prompt's single image markers become
those runs.

What it owns: the processor of a vision-language model (loaded with its tokenizer at start-up),
decoding pictures with Pillow, and the `ImageInput`s a request carries to the engine. All of it
runs on a worker thread (`ImagePrompts.expand`): decoding and resizing a picture takes
milliseconds to seconds, which the event loop streaming everyone else's tokens must not wait
for.

Invariant: a prompt's image markers (the processor's image token, one per picture, where the
chat template rendered each image part) and its pictures are matched in order, one to one; a
count that differs is an `InvalidImageError`, never a silent shift.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio.to_thread
import numpy as np

from trio_llm.client.errors import InvalidPromptError
from trio_llm.ipc.messages import ImageInput

if TYPE_CHECKING:
    from PIL.Image import Image


class InvalidImageError(InvalidPromptError):
    """A picture the model's processor cannot read, or more or fewer pictures than the prompt
    has image markers. `index`: which of the request's pictures, when one is at fault."""

    def __init__(self, message: str, index: int | None = None) -> None:
        super().__init__(message)
        self.index = index


def takes_images(path: Path) -> bool:
    """Whether the model directory's config is a vision-language model's (read as JSON: no
    transformers config class is built for a text model)."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and isinstance(config.get("vision_config"), dict)


PROBE_EDGE = 4096
"""The side of the square picture `largest_pixels_bytes` measures: past every processor's
longest edge, so one that resizes to its longest edge and tiles makes its most tiles of it."""


def largest_pixels_bytes(processor: Any) -> int:
    """Bytes of pixel values (float32, as `image_input` sends them) the processor makes of the
    largest picture: SmolVLM's as downloaded (longest edge 2048, 512 px tiles) makes 17 tiles,
    53 MB, of any large square photo; LLaVA's a fixed 336 px square, 1.3 MB."""
    from PIL import Image

    picture = Image.new("RGB", (PROBE_EDGE, PROBE_EDGE), "white")
    out = processor(
        text=[processor.image_token],
        images=[picture],
        add_special_tokens=False,
        return_tensors="np",
    )
    return int(np.asarray(out["pixel_values"]).size) * 4


def load_processor(path: Path) -> Any:
    """A vision-language model's processor (`takes_images`): its slow, Pillow-based image
    processor (the fast one needs torchvision). ValueError, which refuses the model at
    start-up, when it has no image processor or names no image token."""
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(path, use_fast=False)
    if getattr(processor, "image_processor", None) is None or not getattr(
        processor, "image_token", None
    ):
        raise ValueError(
            f"{path} is a vision-language model without an image processor and an image token "
            "(processor_config.json / preprocessor_config.json): its pictures cannot be read"
        )
    return processor


def decode_image(data: bytes, index: int = 0, max_pixels: int | None = None) -> Image:
    """Pillow's RGB picture of `data` (any format Pillow reads); InvalidImageError for bytes
    that are not a picture, or one of more than `max_pixels` pixels."""
    from PIL import Image, UnidentifiedImageError

    try:
        # Opening reads the header only: the size is known before any pixel is decoded.
        picture = Image.open(io.BytesIO(data))
    except UnidentifiedImageError:
        # Pillow's own message names the in-memory file object (`<_io.BytesIO object at
        # 0x...>`), which means nothing to the client.
        raise InvalidImageError(
            f"cannot read the image: its {len(data)} bytes are not in a format Pillow reads "
            "(PNG, JPEG, WebP, GIF, BMP, ...)",
            index,
        ) from None
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        raise InvalidImageError(f"cannot read the image: {exc}", index) from None
    if max_pixels is not None and picture.width * picture.height > max_pixels:
        raise InvalidImageError(
            f"the image has {picture.width}x{picture.height} pixels, more than the "
            f"{max_pixels} allowed",
            index,
        )
    try:
        return picture.convert("RGB")
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        raise InvalidImageError(f"cannot read the image: {exc}", index) from None


def image_input(
    expansion: Sequence[int], at: int, pixels: np.ndarray, image_token_id: int
) -> ImageInput:
    """One picture as the engine takes it: its pixel values, and the span of its placeholders
    once its `expansion` (the processor's tokens for one image marker) sits at `at`."""
    marks = [k for k, t in enumerate(expansion) if t == image_token_id]
    if not marks:
        raise InvalidImageError("the model's processor gave the image no placeholder tokens")
    data = np.ascontiguousarray(pixels, dtype="<f4").tobytes()
    return ImageInput(
        offset=at + marks[0],
        length=marks[-1] - marks[0] + 1,
        shape=list(pixels.shape),
        pixels=data,
        digest=hashlib.sha256(data).digest(),
    )


@dataclass(frozen=True, slots=True)
class ImagePrompt:
    """A prompt with pictures, as `EngineClient.generate` takes it: the token ids with each
    picture's placeholders (`ImagePrompts.expand`) and the pictures as the engine reads them."""

    token_ids: list[int]
    images: list[ImageInput]


class ImagePrompts:
    """A vision-language model's processor, used off the event loop."""

    def __init__(self, processor: Any) -> None:
        self.processor = processor
        self.image_token: str = processor.image_token
        self.image_token_id: int = int(processor.tokenizer.convert_tokens_to_ids(self.image_token))

    async def expand(
        self,
        prompt: list[int],
        pictures: Sequence[Image | bytes],
        *,
        max_pixels: int | None = None,
    ) -> ImagePrompt:
        """`prompt` (with one image marker per picture) with each marker replaced by its
        picture's placeholders, and the pictures (Pillow's, or encoded bytes) as the engine
        takes them; on a worker thread."""

        def run() -> ImagePrompt:
            decoded = [
                decode_image(p, i, max_pixels) if isinstance(p, bytes | bytearray) else p
                for i, p in enumerate(pictures)
            ]
            return ImagePrompt(*self._expand(prompt, decoded))

        return await anyio.to_thread.run_sync(run)

    def _expand(
        self, prompt: list[int], pictures: list[Image]
    ) -> tuple[list[int], list[ImageInput]]:
        marks = [i for i, t in enumerate(prompt) if t == self.image_token_id]
        if len(marks) != len(pictures):
            raise InvalidImageError(
                f"the prompt has {len(marks)} image markers for {len(pictures)} images"
            )
        ids: list[int] = []
        images = []
        last = 0
        for index, (mark, picture) in enumerate(zip(marks, pictures, strict=True)):
            try:
                # The processor expands one marker into the picture's placeholders (and any
                # tokens its model puts around an image or between its tiles).
                out = self.processor(
                    text=[self.image_token],
                    images=[picture],
                    add_special_tokens=False,
                    return_tensors="np",
                )
            except Exception as exc:  # the processor's refusal of this picture
                raise InvalidImageError(
                    f"the model's processor cannot read it: {exc}", index
                ) from None
            ids += prompt[last:mark]
            expansion = [int(t) for t in out["input_ids"][0]]
            pixels = np.asarray(out["pixel_values"], dtype=np.float32)[0]
            images.append(image_input(expansion, len(ids), pixels, self.image_token_id))
            ids += expansion
            last = mark + 1
        ids += prompt[last:]
        return ids, images
