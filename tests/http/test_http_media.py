"""Reading the pictures a request names, without a server: data: URLs decoded and bounded,
hosts outside the allowed domains and file:// URLs outside the allowed directory refused, the
flags parsed (vLLM's JSON form of --limit-mm-per-prompt too), and pictures over the pixel
bound refused when decoded. Every refusal is a 400 naming the field it was given."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import pytest

from trio_llm.client.images import InvalidImageError, decode_image
from trio_llm.http.errors import ProtocolError
from trio_llm.http.media import MediaPolicy, read_image
from trio_llm.http.serve_flags import parse_serve_args

PARAM = "messages[1].content[0].image_url"


def _png(width: int = 4, height: int = 3) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (width, height), (200, 10, 10)).save(out, format="PNG")
    return out.getvalue()


async def _refused(url: str, policy: MediaPolicy) -> ProtocolError:
    with pytest.raises(ProtocolError) as caught:
        await read_image(url, policy, PARAM)
    assert (caught.value.status, caught.value.param) == (400, PARAM)
    return caught.value


async def test_a_data_url_is_decoded_and_bounded() -> None:
    png = _png()
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    assert await read_image(url, MediaPolicy(), PARAM) == png
    assert "larger than" in str(await _refused(url, MediaPolicy(max_bytes=10)))
    assert "base64" in str(await _refused("data:image/png,raw", MediaPolicy()))
    assert "not valid base64" in str(await _refused("data:image/png;base64,@@@", MediaPolicy()))


async def test_hosts_schemes_and_local_files(tmp_path: Path) -> None:
    narrow = MediaPolicy(allowed_domains=("example.com",))
    refused = await _refused("http://evil.test/a.png", narrow)
    assert "allowed media domains" in str(refused)
    assert "data: URL" in str(await _refused("ftp://example.com/a.png", narrow))
    assert "--allowed-local-media-path" in str(await _refused("file:///etc/hostname", narrow))
    (tmp_path / "a.png").write_bytes(_png())
    local = MediaPolicy(allowed_local_path=tmp_path)
    assert await read_image(f"file://{tmp_path}/a.png", local, PARAM) == _png()
    outside = await _refused(f"file://{tmp_path}/../a.png", local)
    assert "outside the allowed local media path" in str(outside)


def test_the_flags() -> None:
    config = parse_serve_args(
        ["--limit-mm-per-prompt", '{"image": 2}', "--allowed-media-domains", "a.com, b.org"]
    )
    assert config.media.max_images == 2
    assert config.media.allowed_domains == ("a.com", "b.org")
    assert parse_serve_args(["--limit-mm-per-prompt", "5"]).media.max_images == 5
    with pytest.raises(SystemExit):
        parse_serve_args(["--limit-mm-per-prompt", "many"])


def test_decoding_bounds_pixels_and_names_the_picture() -> None:
    assert decode_image(_png(4, 3)).size == (4, 3)
    with pytest.raises(InvalidImageError, match="more than the 11 allowed") as caught:
        decode_image(_png(4, 3), 2, max_pixels=11)
    assert caught.value.index == 2
    with pytest.raises(InvalidImageError, match="cannot read the image") as caught:
        decode_image(b"GIF89a but not really")
    assert "not in a format Pillow reads" in str(caught.value)
    assert "object at 0x" not in str(caught.value), "no Python repr in a client's error"
