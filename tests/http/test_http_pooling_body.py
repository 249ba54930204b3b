"""/pooling's body, encoded one vector at a time (so that a worker thread can do it while the
event loop streams), is byte for byte the JSON of the whole response struct."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from trio_llm.http.pooling.build import Head, pooling_body, pooling_response


@pytest.mark.parametrize("as_base64", [False, True])
@pytest.mark.parametrize("count", [0, 1, 5])
def test_the_body_is_the_responses_json(count: int, as_base64: bool) -> None:
    vectors = [np.arange(4, dtype=np.float32) / (i + 3) for i in range(count)]
    head = Head("pool-1", "embed", 1700000000)
    whole = msgspec.json.encode(pooling_response(head, vectors, 7, as_base64=as_base64))
    assert pooling_body(head, vectors, 7, as_base64=as_base64) == whole
