"""Images on the generic path: a vision-language model's tower and projector, run once per
image, whose outputs replace the decoder's input embeddings at the image's placeholder tokens.

What it owns: which vision-language architectures the engine serves (`ARCHITECTURES`), the
refusal of any other at start-up, and `VisionEncoder`, the one call that turns an image's pixel
values into its placeholder rows. The decoder itself is the generic path's (`generic.py`): once
the rows are embedded it reads and writes the paged cache as for text, so chunked prefill,
prefix caching and preemption need nothing of their own here beyond the image's content in the
block keys (`engine/step/images.py`).

Which families: LLaVA (a CLIP or SigLIP tower on one fixed-size image, one run of placeholder
tokens) and Idefics3 / SmolVLM (the same tower on tiles of the picture plus a global view,
their runs of placeholders apart, row and column tokens between): in both an image is one
tensor in and one block of rows out, in placeholder order, at the decoder's ordinary
positions. Families whose tower takes patches of any size with rotary positions over the image
(Qwen2-VL's grid and its M-RoPE) need more than an embedding swap and are refused with the
reason.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from trio_llm.model_files import UnsupportedModelError

if TYPE_CHECKING:
    from transformers import PretrainedConfig

ARCHITECTURES = frozenset({"LlavaForConditionalGeneration", "Idefics3ForConditionalGeneration"})
"""The vision-language models the engine serves: towers of a fixed input size (an Idefics3 /
SmolVLM image is tiles of that size), placeholders that take the decoder's ordinary
positions."""


def is_vision(config: PretrainedConfig) -> bool:
    """Whether the checkpoint's config is a vision-language model's (served or not)."""
    return getattr(config, "vision_config", None) is not None


def check_config(config: PretrainedConfig, name: str) -> None:
    """Refuse, before any weight is read, a vision-language model the engine cannot serve."""
    archs = list(getattr(config, "architectures", None) or [])
    if not set(archs) & ARCHITECTURES:
        raise UnsupportedModelError(
            f"{name}: the vision-language architecture {', '.join(archs) or '(none given)'} is "
            f"not served; the engine runs images through {', '.join(sorted(ARCHITECTURES))}"
        )
    if getattr(config, "image_token_id", None) is None:
        raise UnsupportedModelError(f"{name}: its config names no image token (image_token_id)")
    layer = getattr(config, "vision_feature_layer", -1)
    if layer is not None and not isinstance(layer, int):
        raise UnsupportedModelError(
            f"{name}: features from several vision layers ({layer}) are not supported"
        )


class VisionEncoder:
    """A loaded vision-language model's tower and projector: pixel values of one image in,
    the rows its placeholder tokens get out, in prompt order."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        config = model.config
        self.image_token_id = int(config.image_token_id)  # type: ignore[union-attr]
        self.llava = type(model).__name__ == "LlavaForConditionalGeneration"
        """LLaVA's tower reads one fixed-size image; Idefics3's one or more tiles of it."""
        self._features: dict[str, object] = {}
        if self.llava:
            self._features = {
                "vision_feature_layer": config.vision_feature_layer,  # type: ignore[union-attr]
                "vision_feature_select_strategy": config.vision_feature_select_strategy,  # type: ignore[union-attr]
            }
        self.device = next(model.parameters()).device
        self.dtype = model.get_input_embeddings().weight.dtype  # type: ignore[operator,union-attr]
        self.images_encoded = 0
        """Images run through the tower (once each, however their prompt is chunked)."""

    def check(self, shape: list[int], placeholders: int) -> str | None:
        """Why pixel values of `shape` behind `placeholders` placeholder tokens are not an
        image this tower reads (checked when the request arrives, not when its chunk runs),
        or None."""
        vision = self.model.config.vision_config  # type: ignore[union-attr]
        size, patch = int(vision.image_size), int(vision.patch_size)
        image = [int(getattr(vision, "num_channels", 3)), size, size]
        if self.llava:
            expected, tiles = image, 1
            # The tower's positions: CLIP's patches and a class token, SigLIP's patches
            # alone; the `default` strategy drops the first (CLIP's class token).
            embeddings = getattr(self.model.model.vision_tower, "embeddings", None)  # type: ignore[union-attr]
            positions = getattr(embeddings, "num_positions", (size // patch) ** 2)
            per_tile = int(positions) - (
                self._features["vision_feature_select_strategy"] == "default"
            )
        else:  # Idefics3: tiles, each pixel-shuffled by the connector's scale factor
            tiles = shape[0] if len(shape) == 4 else 0
            expected = [tiles, *image]
            scale = int(self.model.config.scale_factor)  # type: ignore[union-attr]
            per_tile = (size // patch) ** 2 // scale**2
        if list(shape) != expected or tiles < 1:
            return f"pixel values of shape {list(shape)}; this model's tower reads {expected}"
        if placeholders != tiles * per_tile:
            return (
                f"{placeholders} placeholder tokens; this model's image of {tiles} tile(s) "
                f"takes {tiles * per_tile}"
            )
        return None

    @torch.inference_mode()
    def encode(self, pixels: Tensor) -> Tensor:
        """One image's pixel values (as the model's processor made them: [C, H, W], or
        [tiles, C, H, W]) -> [N, hidden] rows, in the decoder's dtype. Idefics3 gets no pixel
        mask: its processor resizes a picture to whole tiles, so one image alone has no
        padding for a mask to hide (transformers then takes every pixel, as here)."""
        base = self.model.model  # type: ignore[union-attr]
        out = base.get_image_features(  # type: ignore[operator]
            pixel_values=pixels.unsqueeze(0).to(self.device, self.dtype), **self._features
        )
        features = out.pooler_output if hasattr(out, "pooler_output") else out
        if isinstance(features, list | tuple):
            features = features[0]
        self.images_encoded += 1
        return features.reshape(-1, features.shape[-1]).to(self.dtype)


def encoder_of(model: torch.nn.Module) -> VisionEncoder | None:
    """The model's vision encoder, or None for a text-only model."""
    return VisionEncoder(model) if type(model).__name__ in ARCHITECTURES else None
