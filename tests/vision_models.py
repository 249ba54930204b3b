"""Tiny random-weight vision-language models for tests, saved with a real processor: the
default tokenizer plus an `<image>` token, and a slow (Pillow, no torchvision) image processor
at 32x32, so a test image becomes 16 placeholder tokens and a [3, 32, 32] tensor."""

from __future__ import annotations

from pathlib import Path
from typing import Any

IMAGE_SIZE = 32
PATCH = 8
IMAGE_TOKENS = (IMAGE_SIZE // PATCH) ** 2


def build_tiny_llava(path: Path, tokenizer: Any, *, seed: int = 0, tower: str = "clip") -> Any:
    """A LLaVA (a CLIP or SigLIP tower, two-layer projector, Llama decoder) saved at `path`
    with its LlavaProcessor; the model back, float32 and in eval mode."""
    import torch
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
        SiglipImageProcessor,
        SiglipVisionConfig,
    )

    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    image_token_id = tokenizer.convert_tokens_to_ids("<image>")
    # CLIP has a class token that the `default` strategy drops; SigLIP has none (`full`).
    clip = tower == "clip"
    strategy = "default" if clip else "full"
    if clip:
        images: Any = CLIPImageProcessor(
            size={"shortest_edge": IMAGE_SIZE},
            crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
        )
    else:
        images = SiglipImageProcessor(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    processor = LlavaProcessor(
        image_processor=images,
        tokenizer=tokenizer,
        patch_size=PATCH,
        vision_feature_select_strategy=strategy,
        image_token="<image>",
        num_additional_image_tokens=1 if clip else 0,
    )
    text = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=2048,
        # A wide init spreads the logits (few near-ties); an untied head keeps a random model
        # from repeating its last token whatever it attends to.
        initializer_range=0.2,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    vision = (CLIPVisionConfig if clip else SiglipVisionConfig)(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=IMAGE_SIZE,
        patch_size=PATCH,
        initializer_range=0.2,
    )
    config = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_id=image_token_id,
        vision_feature_select_strategy=strategy,
        vision_feature_layer=-2,
    )
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(config).eval()
    model.config.architectures = [type(model).__name__]
    model.save_pretrained(path)
    processor.save_pretrained(path)
    return model


def picture(seed: int, size: tuple[int, int] = (40, 50)) -> Any:
    """A random RGB picture (PIL) of `size` (height, width)."""
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def build_tiny_idefics3(path: Path, tokenizer: Any, *, seed: int = 0) -> Any:
    """An Idefics3 (SmolVLM's architecture: a SigLIP-like tower, a pixel-shuffle connector, a
    Llama decoder) saved at `path` with its Idefics3Processor, which splits a picture into
    32x32 tiles plus a global view, each 4 placeholders between row and column tokens; the
    model back, float32 and in eval mode."""
    import torch
    from transformers import (
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3ImageProcessor,
        Idefics3Processor,
        Idefics3VisionConfig,
        LlamaConfig,
    )

    specials = ["<fake_token_around_image>", "<image>", "<global-img>", "<end_of_utterance>"]
    tokenizer.add_special_tokens({"additional_special_tokens": specials})
    images = Idefics3ImageProcessor(
        size={"longest_edge": 2 * IMAGE_SIZE},
        max_image_size={"longest_edge": IMAGE_SIZE},
        do_image_splitting=True,
    )
    processor = Idefics3Processor(image_processor=images, tokenizer=tokenizer, image_seq_len=4)
    text = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=2048,
        initializer_range=0.2,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    vision = Idefics3VisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=IMAGE_SIZE,
        patch_size=PATCH,
        initializer_range=0.2,
    )
    config = Idefics3Config(
        vision_config=vision.to_dict(),
        text_config=text.to_dict(),
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        scale_factor=2,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = Idefics3ForConditionalGeneration(config).eval()
    model.config.architectures = [type(model).__name__]
    model.save_pretrained(path)
    processor.save_pretrained(path)
    return model
