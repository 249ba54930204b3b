"""Pictures whose pixel values overflow the engine's request ring (a real SmolVLM's processor
makes up to 17 tiles, 54 MB, of an ordinary photo; the ring holds 8 MiB) are refused naming
the picture that overflows and what to change, not as a prompt of too many tokens; fewer
pictures on the same engine still go through."""

from __future__ import annotations

from pathlib import Path

import pytest

from trio_llm import SamplingParams, open_engine
from trio_llm.client.images import InvalidImageError
from trio_llm.model_files import ModelSource, load_tokenizer
from vision_models import build_tiny_llava, picture

pytestmark = pytest.mark.anyio

PICTURE_BYTES = 4 * 3 * 32 * 32  # float32 pixel values of one tiny LLaVA picture


@pytest.fixture(scope="module")
def llava_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer_source: ModelSource) -> Path:
    path = tmp_path_factory.mktemp("tiny-llava")
    build_tiny_llava(path, load_tokenizer(tokenizer_source))
    return path


async def test_pictures_past_the_request_ring_name_the_picture(llava_dir: Path) -> None:
    ring = 64 << 10  # room for 5 of these pictures, not 6
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
            await client.expand_images(text + [marker] * 6, [picture(i) for i in range(6)])
        assert caught.value.index == ring // PICTURE_BYTES  # the sixth: 0-based 5
        assert "processor that makes fewer tiles" in str(caught.value)

        prompt = await client.expand_images(text + [marker] * 2, [picture(0), picture(1)])
        params = SamplingParams(max_tokens=2, temperature=0)
        outputs = [o async for o in client.generate(prompt, params)]
        assert len(outputs[-1].outputs[0].token_ids) == 2
