"""Stored responses: what GET /v1/responses/{id} returns and what previous_response_id
continues, kept in memory and bounded.

A stored response keeps its response object and its conversation: the history it continued
(its own previous response's conversation and output) and its input items, the instructions
left out (OpenAI does not carry them over). The items are immutable and shared, so a chain of
N responses holds N tuples of references, not N copies of the text.

Invariants: at most `capacity` responses are kept; storing one more evicts the least recently
used (stored, retrieved or continued); capacity 0 keeps nothing. Nothing is stored for a
request with `store: false`, nor for one that failed. Everything is lost when the server
stops: it is a cache of conversations, not a database.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from trio_llm.http.errors import ProtocolError
from trio_llm.http.responses.protocol import (
    FunctionCall,
    FunctionCallItem,
    InputItem,
    MessageItem,
    OutputItem,
    OutputMessage,
    ResponseObject,
)


@dataclass(frozen=True, slots=True)
class StoredResponse:
    response: ResponseObject
    conversation: tuple[InputItem, ...]
    """The history and the input items of the request that made `response`."""

    def continued(self) -> tuple[InputItem, ...]:
        """What a request continuing this response starts from: its conversation and its
        output, as input items."""
        return (*self.conversation, *as_input_items(self.response.output))


def as_input_items(output: Iterable[OutputItem]) -> list[InputItem]:
    """Output items as the input items a next request would send back."""
    items: list[InputItem] = []
    for item in output:
        if isinstance(item, OutputMessage):
            items.append(MessageItem(role="assistant", content=list(item.content), id=item.id))
        elif isinstance(item, FunctionCall):
            items.append(
                FunctionCallItem(
                    call_id=item.call_id, name=item.name, arguments=item.arguments, id=item.id
                )
            )
    return items


def not_found(response_id: str, param: str | None = None) -> ProtocolError:
    """OpenAI's 404 for an id it has no response for."""
    which = "Previous response" if param == "previous_response_id" else "Response"
    code = "previous_response_not_found" if param == "previous_response_id" else None
    return ProtocolError(404, f"{which} with id '{response_id}' not found.", param=param, code=code)


class ResponseStore:
    """The stored responses, least recently used first."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._responses: OrderedDict[str, StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        return len(self._responses)

    def put(self, stored: StoredResponse) -> None:
        if self.capacity == 0:
            return
        self._responses[stored.response.id] = stored
        self._responses.move_to_end(stored.response.id)
        while len(self._responses) > self.capacity:
            self._responses.popitem(last=False)

    def get(self, response_id: str, param: str | None = None) -> StoredResponse:
        """The stored response, now the most recently used, or the 404 naming `param`."""
        stored = self._responses.get(response_id)
        if stored is None:
            raise not_found(response_id, param)
        self._responses.move_to_end(response_id)
        return stored

    def delete(self, response_id: str) -> None:
        """Forget the response, or the 404."""
        if self._responses.pop(response_id, None) is None:
            raise not_found(response_id)
