"""The OpenAI endpoints bench/serving/serve.py can load, one module per endpoint.

Each module says its `PATH`, the request fields that carry a prompt (`prompt_fields`), the text
one streamed choice adds (`text`), and the prompt's token ids as the server would see them
(`prompt_token_ids`, for compare.py's offline reference). The fields every request shares
(model, max_tokens, greedy, streaming with usage) are serve.py's. A new endpoint benchmark is a
module here and one line in `ENDPOINTS`: serve.py's and compare.py's `--endpoint` offer it.
"""

from __future__ import annotations

from types import ModuleType

from serving.endpoints import chat, completions

ENDPOINTS: dict[str, ModuleType] = {"chat": chat, "completions": completions}
