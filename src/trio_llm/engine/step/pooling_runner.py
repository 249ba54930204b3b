"""The pooling runner: one scheduled batch of whole prompts in, one pooled output per prompt out.

What it owns: the loaded base model (no LM head) with the cacheless packed attention, and
either the model's `PoolingConfig` (an embedding model) or its `ClassifierHead` (a
cross-encoder or classifier). A step packs every prompt of the batch into one row, longest
first (no padding: the linear layers see only real tokens), runs the model once, each sequence
attending over its own tokens only (bidirectionally for an encoder, causally for a decoder),
and pools each sequence's rows: into an embedding (`pooling.pool`), or through the head into
the model's scores or class probabilities (`classifier.ClassifierHead.outputs`). The outputs
leave as raw float32 bytes, which the frontend sends on as base64, or decodes for JSON floats.

A prompt that is a pair of texts (a cross-encoder's input) carries where its second text
starts; a model with token types (BERT) gets type 1 from there on, as its tokenizer's pair
encoding says. Position ids count from the model's `position_offset` (RoBERTa's start past
its padding index).

Invariant: no state outlives a step. Every scheduled sequence is a whole prompt from its first
token (the scheduler runs a pooling engine without chunked prefill), so nothing is cached and
the engine allocates no KV cache at all.
"""

from __future__ import annotations

import numpy as np
import torch

from trio_llm.engine.attention.packed import PackedAttentionMetadata
from trio_llm.engine.models.classifier import ClassifierHead
from trio_llm.engine.models.pooling import PoolingConfig, pool, token_rows
from trio_llm.engine.step.sequence import ScheduledBatch


class PoolingRunner:
    def __init__(
        self,
        model: torch.nn.Module,
        config: PoolingConfig,
        device: torch.device,
        *,
        head: ClassifierHead | None = None,
        position_offset: int = 0,
    ) -> None:
        """`model`: the base model, or with `head` the whole classifier (its base runs)."""
        self.head = head
        self.model = head.base if head is not None else model
        self.config = config
        self.device = device
        self.position_offset = position_offset
        self.hidden_size = int(model.config.hidden_size)
        types = getattr(getattr(self.model, "embeddings", None), "token_type_embeddings", None)
        self.token_types = isinstance(types, torch.nn.Embedding) and types.num_embeddings > 1
        """The model reads token types, so a pair's second text gets type 1."""

    @property
    def output_size(self) -> int:
        """The length of each output: the embedding's, or one per label."""
        return len(self.head.labels) if self.head is not None else self.hidden_size

    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch) -> list[bytes]:
        assert all(
            s.num_computed_tokens == 0 and s.num_tokens == n
            for s, n in zip(batch.seqs, batch.num_tokens)
        )
        # Laid out by length (longest first), so inputs of one length are neighbours and share
        # one attention call; the outputs go back in the batch's order.
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
        extra: dict[str, torch.Tensor] = {}
        if self.token_types:
            second = np.asarray([s.token_type_start for s in seqs], dtype=np.int64)[row_seq]
            types = ((second > 0) & (positions >= second)).astype(np.int64)
            extra["token_type_ids"] = torch.from_numpy(types).to(device).unsqueeze(0)
        hidden = self.model(
            input_ids=torch.tensor(ids, dtype=torch.long, device=device).unsqueeze(0),
            position_ids=torch.from_numpy(positions + self.position_offset).to(device).unsqueeze(0),
            use_cache=False,
            trio_attn=PackedAttentionMetadata.build(cu),
            **extra,
        ).last_hidden_state[0]
        cu_seqlens = torch.from_numpy(cu).to(device)
        if self.head is not None:
            pooled = self.head.outputs(token_rows(hidden, cu_seqlens, self.head.mode))
        else:
            pooled = pool(hidden, cu_seqlens, self.config)
        rows = pooled.cpu().numpy()
        outputs: list[bytes] = [b""] * len(order)
        for row, i in zip(rows, order):
            outputs[i] = row.tobytes()
        return outputs
