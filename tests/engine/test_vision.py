"""A vision-language model (a tiny random LLaVA: CLIP tower, projector, Llama decoder) served
by the engine gives transformers' own greedy tokens on the same picture (float32): alone,
batched with text requests, with its prompt chunked across steps; two pictures behind the same
text give different tokens; the prefix cache keys an image's blocks by its content."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from engine_helpers import Finished, make_core, request, run

from trio_llm.client.images import ImagePrompts, load_processor
from trio_llm.model_files import ModelSource, UnsupportedModelError, load_tokenizer
from vision_models import IMAGE_TOKENS, build_tiny_idefics3, build_tiny_llava, picture

NEW_TOKENS = 12
TEXT = "Here is a picture: <image> What is in it? Answer in detail please."


class Llava:
    def __init__(self, path: Path, model: Any) -> None:
        self.path = path
        self.model = model
        self.prompts = ImagePrompts(load_processor(path))

    def inputs(self, seed: int, text: str = TEXT) -> tuple[list[int], list[Any]]:
        """The prompt's ids with the picture's placeholders, and the engine's image inputs."""
        tokenizer = self.prompts.processor.tokenizer
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        return self.prompts._expand(ids, [picture(seed)])

    def hf_greedy(self, seed: int, text: str = TEXT) -> list[int]:
        """transformers' own generate on the processor's outputs for the same picture."""
        out = self.prompts.processor(
            text=[text], images=[picture(seed)], add_special_tokens=False, return_tensors="pt"
        )
        with torch.inference_mode():
            tokens = self.model.generate(
                **out, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0
            )
        return tokens[0, out["input_ids"].shape[1] :].tolist()


@pytest.fixture(scope="module")
def llava(tmp_path_factory: pytest.TempPathFactory, tokenizer_source: ModelSource) -> Llava:
    path = tmp_path_factory.mktemp("tiny-llava")
    return Llava(path, build_tiny_llava(path, load_tokenizer(tokenizer_source)))


def _image_request(llava: Llava, rid: str, seed: int, text: str = TEXT) -> Any:
    ids, images = llava.inputs(seed, text)
    req = request(rid, ids, max_tokens=NEW_TOKENS)
    req.images = images
    return req


def test_processor_expands_each_marker_into_the_pictures_placeholders(llava: Llava) -> None:
    ids, images = llava.inputs(0)
    assert len(images) == 1
    image = images[0]
    assert image.length == IMAGE_TOKENS
    assert ids[image.offset : image.offset + image.length] == [llava.prompts.image_token_id] * 16
    assert image.shape == [3, 32, 32]
    assert len(image.pixels) == 4 * 3 * 32 * 32


def test_greedy_tokens_equal_transformers_on_the_same_picture(llava: Llava) -> None:
    core = make_core(llava.path)
    expected = [llava.hf_greedy(0), llava.hf_greedy(1)]
    assert expected[0] != expected[1], "the picture must matter to the tiny model"
    got = run(core, [_image_request(llava, "a", 0)])
    assert got["a"].token_ids == expected[0]
    got = run(core, [_image_request(llava, "b", 1)])
    assert got["b"].token_ids == expected[1], "another picture, the same text"
    assert core.runner.vision is not None and core.runner.vision.images_encoded == 2


def test_batched_with_text_and_chunked_equal_alone(llava: Llava) -> None:
    tokenizer = llava.prompts.processor.tokenizer
    text_ids = tokenizer("A text request without a picture, long enough.")["input_ids"]
    roomy = make_core(llava.path, enable_prefix_caching=False)
    alone = {
        "i0": run(roomy, [_image_request(llava, "i0", 0)])["i0"].token_ids,
        "i1": run(roomy, [_image_request(llava, "i1", 1)])["i1"].token_ids,
        "t": run(roomy, [request("t", text_ids, max_tokens=NEW_TOKENS)])["t"].token_ids,
    }
    batch = [
        _image_request(llava, "i0", 0),
        request("t", text_ids, max_tokens=NEW_TOKENS),
        _image_request(llava, "i1", 1),
    ]
    together = run(roomy, batch)
    assert {k: v.token_ids for k, v in together.items()} == alone
    # 8 tokens a step: each image's placeholders span three steps, encoded once each.
    cramped = make_core(llava.path, max_num_batched_tokens=8, enable_prefix_caching=False)
    chunked = run(cramped, batch)
    assert {k: v.token_ids for k, v in chunked.items()} == alone
    assert cramped.runner.vision is not None and cramped.runner.vision.images_encoded == 2
    # A KV cache too small for the batch: sequences are preempted and recomputed, their
    # pictures encoded again from the pixels they keep.
    block_bytes = roomy.ready.kv_cache_bytes // roomy.ready.num_blocks
    tight = make_core(
        llava.path,
        max_num_batched_tokens=8,
        kv_cache_memory=5 * block_bytes,
        enable_prefix_caching=False,
    )
    preempted = run(tight, batch)
    assert tight.stats().num_preemptions > 0
    assert {k: v.token_ids for k, v in preempted.items()} == alone


LONG = (
    "A long preamble of plain words that fills the first block of the cache on its own, and "
    "then a picture: <image> and a question after it, long enough to fill one more block: what "
    "do you see in the picture, and what colours are there?"
)
"""A block of text, then blocks holding the picture's placeholders, then a full block of text."""


def _cached(core: Any, llava: Llava, rid: str, seed: int) -> Finished:
    return run(core, [_image_request(llava, rid, seed, LONG)])[rid]


def test_prefix_cache_is_keyed_by_the_pictures_content(llava: Llava) -> None:
    core = make_core(llava.path)
    first = _cached(core, llava, "first", 0)
    ids, images = llava.inputs(0, LONG)
    offset = images[0].offset
    assert offset >= 16
    # The same picture again: every full block is found, the image's among them.
    again = _cached(core, llava, "again", 0)
    assert again.num_cached_tokens >= (len(ids) - 1) // 16 * 16 > offset + IMAGE_TOKENS
    assert again.token_ids == first.token_ids
    # Another picture behind the same tokens: only blocks before its placeholders are shared.
    other = _cached(core, llava, "other", 1)
    assert other.num_cached_tokens == offset // 16 * 16
    assert other.token_ids == llava.hf_greedy(1, LONG)
    assert first.token_ids == llava.hf_greedy(0, LONG)


def test_an_image_for_a_text_model_is_refused(tiny_model_dir: Path, llava: Llava) -> None:
    core = make_core(tiny_model_dir)
    req = _image_request(llava, "x", 0)
    req.prompt_token_ids = [t if t < 49152 else 0 for t in req.prompt_token_ids]
    got = run(core, [req])["x"]
    assert got.finish_reason == "error"
    assert got.error is not None and "does not take images" in got.error


def test_a_vision_model_the_engine_cannot_serve_is_refused_at_start(tmp_path: Path) -> None:
    from transformers import Qwen2VLConfig

    config = Qwen2VLConfig(
        text_config={"vocab_size": 1000, "hidden_size": 64, "num_hidden_layers": 2},
        vision_config={"depth": 1, "embed_dim": 32},
    )
    config.architectures = ["Qwen2VLForConditionalGeneration"]
    config.save_pretrained(tmp_path)
    with pytest.raises(UnsupportedModelError, match="Qwen2VLForConditionalGeneration is not"):
        make_core(tmp_path)


def test_a_siglip_tower_equals_transformers_too(
    tmp_path: Path, tokenizer_source: ModelSource
) -> None:
    """SigLIP has no class token: all its positions are the picture's rows (`full`)."""
    siglip = Llava(
        tmp_path, build_tiny_llava(tmp_path, load_tokenizer(tokenizer_source), tower="siglip")
    )
    _ids, images = siglip.inputs(0)
    assert images[0].length == IMAGE_TOKENS
    core = make_core(tmp_path)
    got = run(core, [_image_request(siglip, "s", 0)])["s"]
    assert got.token_ids == siglip.hf_greedy(0)


def test_an_idefics3_tiled_picture_equals_transformers(
    tmp_path: Path, tokenizer_source: ModelSource
) -> None:
    """Idefics3 (SmolVLM): a picture is tiles plus a global view, their placeholder runs
    apart (row and column tokens between): one span, encoded once, whatever the chunks."""
    model = build_tiny_idefics3(tmp_path, load_tokenizer(tokenizer_source))
    idefics = Llava(tmp_path, model)
    _ids, images = idefics.inputs(0)
    assert images[0].shape == [5, 3, 32, 32]  # four tiles and the global view
    expected = [idefics.hf_greedy(0), idefics.hf_greedy(1)]
    assert expected[0] != expected[1]
    core = make_core(tmp_path)
    for seed in (0, 1):
        got = run(core, [_image_request(idefics, f"i{seed}", seed)])[f"i{seed}"]
        assert got.token_ids == expected[seed], f"picture {seed}"
    cramped = make_core(tmp_path, max_num_batched_tokens=8, enable_prefix_caching=False)
    chunked = run(cramped, [_image_request(idefics, f"c{seed}", seed) for seed in (0, 1)])
    assert [chunked[f"c{seed}"].token_ids for seed in (0, 1)] == expected
    assert cramped.runner.vision is not None and cramped.runner.vision.images_encoded == 2
