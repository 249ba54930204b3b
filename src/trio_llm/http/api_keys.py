"""The server's API keys and what each may do: `--api-key KEY[:ROLE]`, and the checks a role
grants.

Why its own module: a key is no longer only "let in or not". A server with keys has tenants, and
a tenant must not be able to jump the queue of the others by sending a more urgent `priority`:
only keys given the `priority` role may (`KEY:priority`). The parsing and the rule are pure
values here, so the middleware (runtime/middleware.py) only finds the key a request sent and
asks.

Invariants:
- Keys are compared in constant time (`hmac.compare_digest`), every configured key each time,
  so how long a refusal takes tells nothing about which key came close.
- A server without keys has no tenants: every request may do everything, `priority` included
  (as before keys had roles). With keys, a request that sent none of them (on a route that does
  not need one) has no role.
- `priority` follows vLLM: a lower value runs first, 0 is the default. Asking for less urgency
  than the default (a positive value) is anyone's right; only more urgency (a negative value)
  needs the role.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable
from dataclasses import dataclass

from trio_llm.http.errors import ProtocolError

PRIORITY_ROLE = "priority"
"""May ask for a `priority` more urgent (lower) than the default."""
ROLES = (PRIORITY_ROLE,)
DEFAULT_PRIORITY = 0
ALL_ROLES = frozenset(ROLES)
"""What a request to a server without keys may do."""


@dataclass(frozen=True, slots=True)
class ApiKeys:
    """The configured keys, each with the roles it was given."""

    keys: tuple[tuple[bytes, frozenset[str]], ...]

    def roles_of(self, given: Iterable[str]) -> frozenset[str] | None:
        """The roles of the first configured key among `given` (the keys a request sent, in the
        order it sent them); None when it sent none of them."""
        found: frozenset[str] | None = None
        for text in given:
            # A header's value is its bytes read as latin-1: back to those bytes.
            sent = text.strip().encode("latin-1")
            for key, roles in self.keys:
                # Every key is compared, a match or not: the time taken is the same.
                if hmac.compare_digest(sent, key) and found is None:
                    found = roles
        return found


def parse_api_keys(values: str | Iterable[str] | None) -> ApiKeys | None:
    """The keys of `--api-key` (each value one key or a comma-separated list of them, each
    `KEY` or `KEY:ROLE`); None when there are none. ValueError naming the flag for an unknown
    role or an empty key."""
    if values is None:
        return None
    texts = [values] if isinstance(values, str) else list(values)
    keys: dict[bytes, set[str]] = {}
    for text in texts:
        for item in text.split(","):
            item = item.strip()
            if not item:
                continue
            key, colon, role = item.rpartition(":")
            if not colon:
                key, role = item, ""
            elif role not in ROLES:
                # A key may not hold a colon: a misspelt role must not quietly become a key.
                raise ValueError(
                    f"--api-key: unknown role {role!r} after the last ':' "
                    f"(roles: {', '.join(ROLES)}); a key may not contain ':' or ','"
                )
            if not key:
                raise ValueError("--api-key: an empty key")
            roles = keys.setdefault(key.encode("utf-8"), set())
            if role:
                roles.add(role)
    if not keys:
        return None
    return ApiKeys(tuple((key, frozenset(roles)) for key, roles in keys.items()))


def check_priority(priority: int, roles: frozenset[str]) -> None:
    """A 403 naming `priority` when a request whose key has `roles` asks to run ahead of the
    default (a lower value); a later one is anyone's to ask for."""
    if priority >= DEFAULT_PRIORITY or PRIORITY_ROLE in roles:
        return
    raise ProtocolError(
        403,
        f"priority {priority} is more urgent than the default ({DEFAULT_PRIORITY}): only an "
        f"API key given the '{PRIORITY_ROLE}' role (--api-key KEY:{PRIORITY_ROLE}) may ask "
        f"for that; a priority of {DEFAULT_PRIORITY} or more needs no role",
        param="priority",
        code="priority_not_allowed",
    )
