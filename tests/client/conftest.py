"""Client tests run on both AnyIO backends: the client is written on AnyIO so that Trio programs
(its first users) and asyncio programs can both embed it.

The rest of the suite runs in pytest-trio's trio_mode, which marks every async test as a Trio
test; for tests marked `anyio` that mark is taken off again, so the anyio plugin runs them once
per backend (test ids end in [trio] and [asyncio]).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from trio_llm.model_files import ModelSource, load_tokenizer

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@pytest.fixture(scope="module", params=["trio", "asyncio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("anyio") is not None:
            item.own_markers[:] = [m for m in item.own_markers if m.name != "trio"]


@pytest.fixture(scope="session")
def tokenizer(default_model: ModelSource) -> PreTrainedTokenizerBase:
    """The default model's real tokenizer (the tiny test model uses the same one)."""
    return load_tokenizer(default_model)
