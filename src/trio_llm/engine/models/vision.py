"""Images on the generic path: a vision-language model's tower and projector, run once per
image, whose outputs replace the decoder's input embeddings at the image's placeholder tokens.

What it owns: which vision-language architectures the engine serves (`ARCHITECTURES`), the
refusal of any other at start-up, and `VisionEncoder`, the one call that turns an image's pixel
values into its placeholder rows. The decoder itself is the generic path's (`generic.py`): once
the rows are embedded it reads and writes the paged cache as for text, so chunked prefill,
prefix caching and preemption need nothing of their own here beyond the image's content in the
block keys (`engine/step/images.py`).

Why only LLaVA first: its processor expands one `<image>` into a fixed run of placeholder tokens
and its tower sees a fixed-size image, so an image is one tensor in and one run of rows out.
Families whose tower takes patches of any size (Qwen2-VL's grid, with its own rotary positions
over the image) need more than an embedding swap and are refused with the reason.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from trio_llm.model_files import UnsupportedModelError

if TYPE_CHECKING:
    from transformers import PretrainedConfig

ARCHITECTURES = frozenset({"LlavaForConditionalGeneration"})
"""The vision-language models the engine serves (a fixed-size tower, one run of placeholder
tokens per image, the decoder's ordinary positions)."""


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
    if not isinstance(layer, int):
        raise UnsupportedModelError(
            f"{name}: features from several vision layers ({layer}) are not supported"
        )


class VisionEncoder:
    """A loaded vision-language model's tower and projector: pixel values of one image in,
    the rows its placeholder tokens get out."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        config = model.config
        self.image_token_id = int(config.image_token_id)  # type: ignore[union-attr]
        self._layer = config.vision_feature_layer  # type: ignore[union-attr]
        self._strategy = config.vision_feature_select_strategy  # type: ignore[union-attr]
        self.device = next(model.parameters()).device
        self.dtype = model.get_input_embeddings().weight.dtype  # type: ignore[operator,union-attr]
        self.images_encoded = 0
        """Images run through the tower (once each, however their prompt is chunked)."""

    def check(self, shape: list[int], length: int) -> str | None:
        """Why pixel values of `shape` behind `length` placeholders are not an image this
        tower reads (checked when the request arrives, not when its chunk runs), or None."""
        vision = self.model.config.vision_config  # type: ignore[union-attr]
        size, patch = int(vision.image_size), int(vision.patch_size)
        expected = [int(getattr(vision, "num_channels", 3)), size, size]
        if list(shape) != expected:
            return f"pixel values of shape {list(shape)}; this model's tower reads {expected}"
        # The tower's positions: CLIP's patches and a class token, SigLIP's patches alone;
        # the `default` strategy drops the first (CLIP's class token).
        embeddings = getattr(self.model.model.vision_tower, "embeddings", None)  # type: ignore[union-attr]
        positions = getattr(embeddings, "num_positions", (size // patch) ** 2)
        tokens = int(positions) - (self._strategy == "default")
        if length != tokens:
            return f"{length} placeholder tokens; this model's images take {tokens}"
        return None

    @torch.inference_mode()
    def encode(self, pixels: Tensor) -> Tensor:
        """[C, H, W] pixel values (as the model's processor made them) -> [N, hidden] rows,
        in the decoder's dtype."""
        base = self.model.model  # type: ignore[union-attr]
        out = base.get_image_features(  # type: ignore[operator]
            pixel_values=pixels.unsqueeze(0).to(self.device, self.dtype),
            vision_feature_layer=self._layer,
            vision_feature_select_strategy=self._strategy,
        )
        features = out.pooler_output if hasattr(out, "pooler_output") else out
        if isinstance(features, list | tuple):
            features = features[0]
        self.images_encoded += 1
        return features.reshape(-1, features.shape[-1]).to(self.dtype)


def encoder_of(model: torch.nn.Module) -> VisionEncoder | None:
    """The model's vision encoder, or None for a text-only model."""
    return VisionEncoder(model) if type(model).__name__ in ARCHITECTURES else None
