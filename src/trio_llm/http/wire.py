"""What every API's wire types share: the bounded field types, and the decoding of a JSON body
into a request type.

Each API folder's `protocol.py` holds its own request and response types (msgspec Structs, from
which /openapi.json is generated); this module holds the field types they all use and
`decode_request`, the one way a body becomes a request. Invariant: a body that does not decode
ends in a `ProtocolError` naming the parameter (never another exception), and nothing here
touches Quart or the engine, so all of it is tested with plain values.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import msgspec
from msgspec import Meta, Struct

from trio_llm.http.errors import ProtocolError, bad_request
from trio_llm.http.unsupported import refuse_unbuilt
from trio_llm.sampling_params import MAX_LOGPROBS

log = logging.getLogger(__name__)

Int32 = Annotated[int, Meta(ge=-(2**31), le=2**31 - 1)]
Int64 = Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)]
PositiveInt = Annotated[int, Meta(ge=1, le=2**31 - 1)]
NonNegativeInt = Annotated[int, Meta(ge=0, le=2**31 - 1)]
TokenId = Annotated[int, Meta(ge=0, le=2**31 - 1)]
TopLogprobs = Annotated[int, Meta(ge=0, le=MAX_LOGPROBS)]
RequestId = Annotated[str, Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:\-]+$")]
FunctionName = Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")]
"""OpenAI's rule for a function's name (letters, digits, `_`, `-`; `.` too, as vLLM allows)."""

R = TypeVar("R", bound=Struct)

_AT_PATH = re.compile(r" - at `\$\.?([^`]*)`$")
_KEY_IN = re.compile(r" - at `key` in `\$\.?([^`]*)`$")
_MISSING = re.compile(r"^Object missing required field `([^`]*)`")
_UNKNOWN = re.compile(r"^Object contains unknown field `([^`]*)`(?: - at `\$\.?([^`]*)`)?$")
"""A field a request type that forbids unknown fields (Anthropic's) does not know."""
_KEYS_ARE = {"logit_bias": "token ids"}
"""What the keys of a mapping field must be, for its error message."""


def _validation_error(message: str, body: bytes = b"") -> ProtocolError:
    """msgspec's message names the path at its end (`- at `$.messages[0].role``); the 400
    names it first, as `param` and at the start of the message. A bad key or value of a
    top-level mapping (logit_bias) is named too, from the JSON `body`: msgspec does not say
    which it was (a form's fields have no such mappings)."""
    if match := _UNKNOWN.search(message):
        field, at = match.groups()
        param = f"{at}.{field}" if at else field
        return bad_request(f"{param}: Extra inputs are not permitted", param=param)
    if match := _KEY_IN.search(message):
        param = match.group(1) or None
        detail = message[: match.start()]
        what = _KEYS_ARE.get(param or "")
        detail = f"keys must be {what} ({detail})" if what else f"invalid key ({detail})"
        keys = _bad_keys(body, param, lambda k, _: not _is_token_id(k)) if what else []
        if len(keys) == 1:
            detail = f"the key {json.dumps(keys[0])} is not a token id; {detail}"
        elif keys:
            named = ", ".join(json.dumps(k) for k in keys)
            detail = f"the keys {named} are not token ids; {detail}"
    elif match := _AT_PATH.search(message):
        param = match.group(1) or None
        detail = message[: match.start()]
        if param is not None and param.endswith("[...]"):
            mapping = param.removesuffix("[...]")
            keys = _bad_keys(body, mapping, lambda _, v: not _is_number(v))
            if keys:
                named = ", ".join(json.dumps(k) for k in keys)
                which = "value" if len(keys) == 1 else "values"
                param, detail = mapping, f"the {which} for {named}: {detail}"
    elif match := _MISSING.search(message):
        param, detail = match.group(1), "this field is required"
    else:
        param, detail = None, message
    named = f"{param}: {detail}" if param else detail
    return bad_request(f"Invalid request: {named}", param=param)


def _bad_keys(body: bytes, field: str | None, bad: Callable[[str, Any], bool]) -> list[str]:
    """Every key of the body's top-level mapping `field` for which `bad(key, value)`, in the
    body's order: a 400 names them all, not the first only."""
    try:
        raw = json.loads(body)  # the standard library's reads 1e400 (as inf), msgspec's not
    except (ValueError, RecursionError):
        return []
    mapping = raw.get(field) if isinstance(raw, dict) and field else None
    if not isinstance(mapping, dict):
        return []
    return [k for k, v in mapping.items() if bad(k, v)]


def _is_token_id(key: str) -> bool:
    return key.isascii() and key.isdigit() and int(key) <= 2**31 - 1


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def decode_request(body: bytes, kind: type[R]) -> R:
    """Decode and type-check a JSON body; unknown fields are ignored (logged at debug level),
    known ones this server does not build yet are refused (unsupported.py) for the request
    types that say so (`refuses_unbuilt`: chat and text completions)."""
    try:
        request = msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as error:
        raise _validation_error(str(error), body) from None
    except msgspec.DecodeError as error:
        raise bad_request(f"Invalid JSON body: {error}") from None
    except RecursionError:
        raise bad_request("Invalid JSON body: nested too deeply") from None
    if getattr(kind, "refuses_unbuilt", False):
        refuse_unbuilt(body)
    if log.isEnabledFor(logging.DEBUG):
        _log_unknown_fields(body, kind)
    return request


def convert_request(fields: dict[str, Any], kind: type[R]) -> R:
    """Type-check fields that arrived as text (a multipart form's): numbers and booleans are
    read from their text; a field that does not fit is a 400 naming it, as for JSON bodies."""
    try:
        return msgspec.convert(fields, type=kind, strict=False)
    except msgspec.ValidationError as error:
        raise _validation_error(str(error)) from None


def _log_unknown_fields(body: bytes, kind: type[Struct]) -> None:
    try:
        raw = msgspec.json.decode(body)
    except (msgspec.DecodeError, RecursionError):
        return
    if isinstance(raw, dict):
        unknown = sorted(set(raw) - set(kind.__struct_fields__))
        if unknown:
            log.debug("ignoring unknown fields of %s: %s", kind.__name__, ", ".join(unknown))
