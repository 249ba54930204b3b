"""The client's errors: each names the fault where it is known.

The HTTP edge translates them once: `InvalidPromptError` (and its `PromptTooLongError`),
`ChatTemplateError`, `UnservableRequestError` and `LoraError` are the caller's fault (400;
`LoraNotFoundError` 404), `EngineDeadError` and `EngineRequestError` the server's (500/503).
`EngineStartError` only comes out of `open_engine`. The router's own: `ModelNotServedError`
(the caller's fault: 404) and `NoLiveReplicaError` (an `EngineDeadError`: 503 until a replica
is back).
"""

from __future__ import annotations


class EngineDeadError(RuntimeError):
    """The engine process is gone (it crashed, was killed, or was shut down).

    `started`: whether the engine had begun the request it fails (produced a token for it);
    False for a request that was still waiting, which the router may run elsewhere."""

    def __init__(self, message: str, *, started: bool = True) -> None:
        super().__init__(message)
        self.started = started


class NoLiveReplicaError(EngineDeadError):
    """Every replica of the model is down (dead or restarting)."""


class ModelNotServedError(LookupError):
    """No served model has that name; the message lists those that are."""


class EngineStartError(RuntimeError):
    """The engine process did not come up; the message is the engine's own account of why."""

    def __init__(self, message: str, *, engine_traceback: str = "") -> None:
        super().__init__(message)
        self.engine_traceback = engine_traceback
        """The engine's traceback, when it reported one."""


def start_error_in(group: BaseExceptionGroup) -> EngineStartError | None:
    """The first `EngineStartError` in `group`, however deeply nested: engines started at once
    (replicas, models) fail their start with it alone, not with the group around it."""
    for exc in group.exceptions:
        found = start_error_in(exc) if isinstance(exc, BaseExceptionGroup) else exc
        if isinstance(found, EngineStartError):
            return found
    return None


class EngineRequestError(RuntimeError):
    """The engine failed this one request (finish_reason 'error'); other requests go on."""


class UnservableRequestError(EngineRequestError):
    """The engine could not go on with this request because of its own parameters: nothing
    they allow can be generated next (its constraint requires a byte the vocabulary cannot
    write, or allows no token that allowed_token_ids does). `param` names the one at fault
    ('constraint', 'allowed_token_ids', ...): the caller's fault, not the engine's."""

    def __init__(self, message: str, *, param: str) -> None:
        super().__init__(message)
        self.param = param


class InvalidPromptError(ValueError):
    """The prompt cannot be served as given; `param` names the field to fix ('prompt')."""

    def __init__(self, message: str, *, param: str = "prompt") -> None:
        super().__init__(message)
        self.param = param


class PromptTooLongError(InvalidPromptError):
    """The prompt plus `max_tokens` does not fit in the model's context; the message names both."""

    def __init__(
        self,
        message: str,
        *,
        param: str,
        prompt_tokens: int,
        max_tokens: int | None,
        max_model_len: int,
    ) -> None:
        super().__init__(message, param=param)
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.max_model_len = max_model_len


class UnsupportedTaskError(ValueError):
    """The model does not serve what was asked: embeddings from a generative model, or
    generation from an embedding model."""


class ChatTemplateError(ValueError):
    """The messages cannot be rendered: no chat template, or the template rejected them."""


class LoraError(ValueError):
    """A LoRA adapter the engine cannot load or serve; the message says why (a base model it
    does not fit, a rank over the bound, no free slot, LoRA not enabled)."""


class LoraNotFoundError(LoraError, LookupError):
    """No LoRA adapter of that name is loaded."""
