"""The wire types of the pooling endpoints, as vLLM serves them (and Jina's and Cohere's rerank).

What it owns: the request and response shapes of POST /pooling, /classify, /score and /rerank
(/v1/rerank, /v2/rerank), as msgspec Structs (from which /openapi.json is generated). Pure
values: what the fields mean is plan.py's, nothing here touches Quart or the engine.

Shapes: vLLM's for all four (`id`, `object: "list"`, `data[]`, `usage`); rerank's results are
also Jina's (`results[].index`, `relevance_score`, `document: {text}`) and Cohere's v2 (the
same results, read by its SDK, which ignores what it does not know). A document may be a
string or an object with `text` (Jina's and Cohere's v1 form); other keys of it are ignored.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta, Struct

from trio_llm.http.conversation import ChatMessage
from trio_llm.http.wire import Int32, PositiveInt, RequestId, TokenId

Truncate = Annotated[int, Meta(ge=-1, le=2**31 - 1)]
"""`truncate_prompt_tokens`: cut longer inputs to this many tokens (-1: the model's length)."""

Inputs = str | list[str | TokenId | list[TokenId]]
"""OpenAI's four input forms: a text, texts, token ids, lists of token ids."""

# ---------------------------------------------------------------------------------------------
# Requests


class PoolingFields(Struct, kw_only=True):
    """What every pooling request may carry besides its inputs (vLLM's names)."""

    model: str | None = None
    truncate_prompt_tokens: Truncate | None = None
    user: str | None = None
    priority: Int32 = 0
    request_id: RequestId | None = None


class PoolingRequest(PoolingFields, kw_only=True):
    """`input` or chat `messages` (rendered with the model's template), not both."""

    input: Inputs | None = None
    messages: list[ChatMessage] | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: PositiveInt | None = None
    add_special_tokens: bool | None = None
    """Default: true for `input`, false for `messages` (the template writes its own)."""
    add_generation_prompt: bool = False
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    task: str | None = None
    """vLLM's pooling task: None or the model's own (`embed`, `classify`); another (e.g.
    `token_embed`) is a 400 naming it."""
    normalize: bool | None = None
    """With an embedding model: true L2-normalises the vectors (the engine's already are
    when the model says so); false on a model whose engine normalises is a 400."""
    use_activation: bool | None = None
    """With a classifier: false (raw logits) is a 400: the engine returns activated
    scores."""


class ClassificationRequest(PoolingFields, kw_only=True):
    input: Inputs
    add_special_tokens: bool = True


class ScoreRequest(PoolingFields, kw_only=True):
    """`text_1` against `text_2`: one against one or many, or as many against as many."""

    text_1: str | list[str]
    text_2: str | list[str]


class RerankDocumentIn(Struct):
    """A document given as an object (Jina's, Cohere's v1): its `text` is what is ranked."""

    text: str


class RerankRequest(PoolingFields, kw_only=True):
    query: str
    documents: list[str | RerankDocumentIn]
    top_n: Annotated[int, Meta(le=2**31 - 1)] | None = None
    """The best this many (None, or vLLM's 0: all); more than there are documents means all."""
    return_documents: bool = True
    """Each result carries its document's text (Jina's default; vLLM always does)."""
    max_tokens_per_doc: PositiveInt | None = None
    """Cohere's: each document cut to its first this many tokens before it is paired."""


# ---------------------------------------------------------------------------------------------
# Responses


class PoolingUsage(Struct):
    prompt_tokens: int
    total_tokens: int
    completion_tokens: int = 0


class PoolingData(Struct, kw_only=True):
    index: int
    object: str = "pooling"
    data: list[float] | str
    """The pooled output (an embedding, or a classifier's probabilities) as floats, or with
    encoding_format base64 its little-endian float32 bytes in base64."""


class _ListResponse(Struct, kw_only=True):
    id: str
    object: str = "list"
    created: int
    model: str
    usage: PoolingUsage


class PoolingResponse(_ListResponse, kw_only=True):
    data: list[PoolingData]


class ClassificationData(Struct, kw_only=True):
    index: int
    label: str
    probs: list[float]
    num_classes: int
    object: str = "classify"


class ClassificationResponse(_ListResponse, kw_only=True):
    data: list[ClassificationData]


class ScoreData(Struct, kw_only=True):
    index: int
    object: str = "score"
    score: float


class ScoreResponse(_ListResponse, kw_only=True):
    data: list[ScoreData]


class RerankDocument(Struct):
    text: str


class RerankResult(Struct, kw_only=True, omit_defaults=True):
    index: int
    relevance_score: float
    document: RerankDocument | None = None
    """With return_documents (omitted without)."""


class RerankUsage(Struct):
    prompt_tokens: int
    total_tokens: int


class ApiVersion(Struct):
    version: str


class BilledUnits(Struct):
    search_units: int
    """Cohere's unit: one query over up to 100 documents."""


class RerankMeta(Struct):
    """Cohere's `meta` (its SDK's `ApiMeta`), on its routes /v1/rerank and /v2/rerank."""

    api_version: ApiVersion
    billed_units: BilledUnits


class RerankResponse(Struct, kw_only=True, omit_defaults=True):
    id: str
    model: str
    usage: RerankUsage
    results: list[RerankResult]
    """Best first; ties keep the documents' order."""
    meta: RerankMeta | None = None
    """On Cohere's routes only: vLLM's /rerank has none."""


WIRE_TYPES: tuple[type[Struct], ...] = (
    PoolingRequest,
    ClassificationRequest,
    ScoreRequest,
    RerankRequest,
    PoolingResponse,
    ClassificationResponse,
    ScoreResponse,
    RerankResponse,
)
