"""The routing table's rows: each served model and its replica slots, and which replica a new
request goes to.

What it owns: `Replica` (one engine's slot: its live `EngineClient`, or None while it is down;
its load; its restarts; the prompt blocks routed to it), `ServedModel` (one model: its
replicas, its config once a replica came up, its LoRA adapters), `ServedModel.pick` (the
choice of replica) and the table's figures (`ReplicaStats`, `aggregate`).

The choice: the live replica holding the longest cached prefix of the prompt, unless load says
otherwise (`PrefixPolicy`, prefix_index.py), else the least loaded, ties taken in round-robin
order. A replica's load is what the frontend has routed there and not yet seen finish: the
sequences its leases hold (lease.py), counted from the moment it is picked, so a burst of
requests spreads at once, before any engine has stepped.

Invariant: `pick` records the prompt's blocks on the replica it picks, so the next request that
shares the prefix is sent where it is cached.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from trio_llm.client.engine_client import EngineClient, EngineStats, ModelConfig
from trio_llm.client.prefix_index import PrefixPolicy, PrefixRecord


@dataclass(eq=False)
class Replica:
    group: int
    index: int
    client: EngineClient | None = None
    load: int = 0
    """Sequences leased here and not yet released."""
    started: bool = False
    """A client was attached once."""
    restarts: int = 0
    """Times a client was attached after the first."""
    retired: bool = False
    """Its supervisor gave up restarting it: it stays out of rotation for good."""
    record: PrefixRecord = field(default_factory=lambda: PrefixRecord(0))
    """The prompt blocks routed here (cache-aware routing), sized to its KV cache once up."""

    @property
    def is_alive(self) -> bool:
        return self.client is not None and self.client.is_alive

    @property
    def label(self) -> str:
        return str(self.index)


@dataclass(eq=False)
class ServedModel:
    """One model and its replicas; `config` is known once a replica first came up."""

    replicas: list[Replica]
    config: ModelConfig | None = None
    loras: dict[str, str] = field(default_factory=dict)
    """The LoRA adapters every replica serves (name -> PEFT directory): those it started with,
    then as `Router.load_lora` / `unload_lora` change them."""
    _cursor: int = 0

    @property
    def name(self) -> str | None:
        return None if self.config is None else self.config.model

    @property
    def task(self) -> str:
        return "generate" if self.config is None else self.config.task

    def live(self) -> list[Replica]:
        return [r for r in self.replicas if r.is_alive]

    def pick(
        self,
        keys: Sequence[int],
        policy: PrefixPolicy,
        exclude: Replica | None = None,
    ) -> Replica | None:
        """The live replica for a prompt whose block keys are `keys`: the one holding its
        longest prefix, unless load says otherwise (`PrefixPolicy`), else the least loaded,
        ties taken in round-robin order. `exclude`: a replica not to pick (a retry's)."""
        count = len(self.replicas)
        order = [self.replicas[(self._cursor + step) % count] for step in range(count)]
        live = [r for r in order if r.is_alive and r is not exclude]
        if not live:
            return None
        chosen = policy.choose(
            [r.load for r in live], [r.record.match(keys) for r in live], len(keys)
        )
        best = live[chosen] if chosen is not None else min(live, key=lambda r: r.load)
        self._cursor = (best.index + 1) % count
        if keys:
            best.record.insert(keys)
        return best


@dataclass(frozen=True, slots=True)
class ReplicaStats:
    model: str
    replica: int
    stats: EngineStats | None
    """None while the replica is down."""
    load: int
    restarts: int = 0


def aggregate(stats: Sequence[EngineStats]) -> EngineStats:
    """Several engines' figures as one: counts and blocks summed, usage over all blocks."""
    total = sum(s.num_total_blocks for s in stats)
    free = sum(s.num_free_blocks for s in stats)
    return EngineStats(
        num_running=sum(s.num_running for s in stats),
        num_waiting=sum(s.num_waiting for s in stats),
        kv_usage=(total - free) / total if total else 0.0,
        num_free_blocks=free,
        num_total_blocks=total,
        prefix_cache_queries=sum(s.prefix_cache_queries for s in stats),
        prefix_cache_hits=sum(s.prefix_cache_hits for s in stats),
        num_preemptions=sum(s.num_preemptions for s in stats),
        num_steps=sum(s.num_steps for s in stats),
        num_requests_in_flight=sum(s.num_requests_in_flight for s in stats),
        block_size=max((s.block_size for s in stats), default=0),
        max_loras=max((s.max_loras for s in stats), default=0),
        running_loras=tuple(dict.fromkeys(n for s in stats for n in s.running_loras)),
        waiting_loras=tuple(dict.fromkeys(n for s in stats for n in s.waiting_loras)),
    )
