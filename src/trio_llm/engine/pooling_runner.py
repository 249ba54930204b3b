"""The pooling runner: one scheduled batch of whole prompts in, one embedding per prompt out.

What it owns: the loaded base model (no LM head) with the cacheless packed attention, and the
model's `PoolingConfig`. A step packs every prompt of the batch into one row, longest first
(no padding: the linear layers see only real tokens), runs the model once, each sequence
attending over its own tokens only (bidirectionally for an encoder, causally for a decoder),
and pools each sequence's rows (`pooling.pool`). The embeddings leave as raw float32 bytes,
which the frontend sends on as base64, or decodes for JSON floats.

Invariant: no state outlives a step. Every scheduled sequence is a whole prompt from its first
token (the scheduler runs a pooling engine without chunked prefill), so nothing is cached and
the engine allocates no KV cache at all.
"""

from __future__ import annotations

import numpy as np
import torch

from trio_llm.engine.attention.packed import PackedAttentionMetadata
from trio_llm.engine.pooling import PoolingConfig, pool
from trio_llm.engine.sequence import ScheduledBatch


class PoolingRunner:
    def __init__(self, model: torch.nn.Module, config: PoolingConfig, device: torch.device) -> None:
        self.model = model
        self.config = config
        self.device = device
        self.hidden_size = int(model.config.hidden_size)

    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch) -> list[bytes]:
        assert all(
            s.num_computed_tokens == 0 and s.num_tokens == n
            for s, n in zip(batch.seqs, batch.num_tokens)
        )
        # Laid out by length (longest first), so inputs of one length are neighbours and share
        # one attention call; the embeddings go back in the batch's order.
        order = sorted(range(len(batch.seqs)), key=lambda i: -batch.num_tokens[i])
        seqs = [batch.seqs[i] for i in order]
        lengths = np.asarray([batch.num_tokens[i] for i in order], dtype=np.int64)
        cu = np.zeros(len(seqs) + 1, dtype=np.int64)
        np.cumsum(lengths, out=cu[1:])
        ids: list[int] = []
        for s in seqs:
            ids.extend(s.token_ids)
        row_seq = np.repeat(np.arange(len(seqs)), lengths)
        positions = np.arange(int(cu[-1]), dtype=np.int64) - cu[row_seq]
        device = self.device
        hidden = self.model(
            input_ids=torch.tensor(ids, dtype=torch.long, device=device).unsqueeze(0),
            position_ids=torch.from_numpy(positions).to(device).unsqueeze(0),
            use_cache=False,
            trio_attn=PackedAttentionMetadata.build(cu),
        ).last_hidden_state[0]
        pooled = pool(hidden, torch.from_numpy(cu).to(device), self.config).cpu().numpy()
        embeddings: list[bytes] = [b""] * len(order)
        for row, i in zip(pooled, order):
            embeddings[i] = row.tobytes()
        return embeddings
