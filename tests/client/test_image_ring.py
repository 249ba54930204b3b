"""A vision model's request ring is sized for its processor's largest pictures (a real
SmolVLM's makes up to 17 tiles, 53 MB, of an ordinary photo; the default ring holds 8 MiB), and
pictures whose pixel values overflow it all the same are refused naming
the picture that overflows and what to change, not as a prompt of too many tokens; fewer
pictures on the same engine still go through."""

from __future__ import annotations

from pathlib import Path

import pytest

from trio_llm import SamplingParams, open_engine
from trio_llm.client.engine_process import PICTURES_IN_RING, request_ring_capacity
from trio_llm.client.images import InvalidImageError
from trio_llm.config import EngineArgs
from trio_llm.model_files import ModelSource, load_tokenizer
from vision_models import build_tiny_llava, picture

pytestmark = pytest.mark.anyio

PICTURE_BYTES = 4 * 3 * 32 * 32  # float32 pixel values of one tiny LLaVA picture


@pytest.fixture(scope="module")
def llava_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer_source: ModelSource) -> Path:
    path = tmp_path_factory.mktemp("tiny-llava")
    build_tiny_llava(path, load_tokenizer(tokenizer_source))
    return path


def test_a_vision_models_request_ring_holds_its_largest_pictures(
    llava_dir: Path, tokenizer_source: ModelSource
) -> None:
    """Sized from what the processor makes of the largest picture (this one: a fixed 32 px
    square), so that a real SmolVLM's 53 MB of tiles fit; a text model's keeps its size."""
    ring = 64 << 10
    wanted = PICTURES_IN_RING * PICTURE_BYTES + (1 << 20)
    assert request_ring_capacity(EngineArgs(model=str(llava_dir), ring_capacity=ring)) == wanted
    text = EngineArgs(model=str(tokenizer_source.path), ring_capacity=ring)
    assert request_ring_capacity(text) == ring


async def test_pictures_past_the_request_ring_name_the_picture(llava_dir: Path) -> None:
    ring = 64 << 10
    capacity = request_ring_capacity(EngineArgs(model=str(llava_dir), ring_capacity=ring))
    fits = capacity // PICTURE_BYTES  # pictures the ring takes; one more overflows
    async with open_engine(
        str(llava_dir),
        ring_capacity=ring,
        num_threads=1,
        kv_cache_memory="16MiB",
        dtype="float32",
    ) as client:
        assert client.images is not None
        marker = client.images.image_token_id
        words = client.images.processor.tokenizer("Look:", add_special_tokens=False)
        text = words["input_ids"]
        with pytest.raises(InvalidImageError, match="request ring") as caught:
            pictures = [picture(i) for i in range(fits + 1)]
            await client.expand_images(text + [marker] * (fits + 1), pictures)
        assert caught.value.index == fits  # the last: 0-based
        assert "processor that makes fewer tiles" in str(caught.value)

        prompt = await client.expand_images(text + [marker] * 2, [picture(0), picture(1)])
        params = SamplingParams(max_tokens=2, temperature=0)
        outputs = [o async for o in client.generate(prompt, params)]
        assert len(outputs[-1].outputs[0].token_ids) == 2
