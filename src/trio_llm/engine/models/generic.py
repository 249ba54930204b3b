"""The generic path: any causal LM that transformers implements, on the engine's paged KV cache.

transformers' own modules compute everything but attention; every attention layer calls the
engine's `paged_attention` (the model is loaded with `attn_implementation="trio_paged"`), which
writes the layer's keys and values into its paged cache and attends over each sequence's blocks.
So prefix caching, chunked prefill, preemption and continuous batching work for any model whose
layers attend through transformers' attention interface, as vLLM's Transformers backend does.
Which models qualify, and what each layer's cache looks like, attention_layers.py finds at
start-up.

The logits are the model's own too: `GenericForward.logits` runs the causal LM's forward on the
given hidden states (its decoder swapped for a stand-in that returns them), so whatever follows
the decoder (a final soft-cap, a logit scale) is applied as transformers applies it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from trio_llm.engine.attention import AttentionMetadata
from trio_llm.engine.hf import decoder_of

if TYPE_CHECKING:
    from trio_llm.engine.lora import LoraBatch, LoraHook
    from trio_llm.engine.models.attention_layers import AttentionLayer


class _HiddenStates(torch.nn.Module):
    """Stands in for the decoder while the causal LM's forward turns hidden states into logits."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden: Tensor | None = None
        from transformers.modeling_outputs import BaseModelOutputWithPast

        class Outputs(BaseModelOutputWithPast):
            """The hidden states; None for whatever else a causal LM reads of its decoder's
            outputs (router logits, cross attentions, ...)."""

            def __getattr__(self, name: str) -> None:
                if name.startswith("__"):
                    raise AttributeError(name)
                return None

        self._outputs = Outputs

    @property
    def decoder(self) -> _HiddenStates:
        """OPT's causal LM calls its base model's `decoder`, not the base model itself."""
        return self

    def forward(self, *args: object, **kwargs: object) -> object:
        return self._outputs(last_hidden_state=self.hidden)


class GenericForward:
    """transformers' modules of a causal LM on the packed row, attention through the paged
    cache: the same call shape as the engine's own forwards (`__call__` for hidden states,
    `logits` for the LM head and what follows it)."""

    def __init__(
        self,
        model: torch.nn.Module,
        layers: Sequence[AttentionLayer],
        k_caches: Sequence[Tensor],
        v_caches: Sequence[Tensor],
        lora_hook: LoraHook | None = None,
    ) -> None:
        """`lora_hook`: where the decoder's wrapped Linears read a step's adapter rows
        (`lora.wrap_linears`), when LoRA is on."""
        self.model = model
        self.lora_hook = lora_hook
        self.decoder = decoder_of(model)
        self._prefix = getattr(model, "base_model_prefix", "model")
        self._stand_in = _HiddenStates()
        self._ids = torch.zeros(1, 1, dtype=torch.long, device=k_caches[0].device)
        for layer, k, v in zip(layers, k_caches, v_caches, strict=True):
            layer.module.k_cache = k  # type: ignore[assignment]
            layer.module.v_cache = v  # type: ignore[assignment]

    def __call__(
        self,
        input_ids: Tensor,
        positions: Tensor,
        attn: AttentionMetadata,
        k_caches: Sequence[Tensor],
        v_caches: Sequence[Tensor],
        lora: LoraBatch | None = None,
        images: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor:
        """Hidden states after the final norm, [T, hidden] (the caches hang on the layers);
        `lora`: the step's adapter rows, if any; `images`: (rows, features), rows whose input
        embeddings are an image's features instead of their placeholder token's."""
        hook = self.lora_hook
        if hook is not None:
            hook.batch = lora
        inputs: dict[str, Tensor] = {"input_ids": input_ids.unsqueeze(0)}
        if images is not None:
            rows, features = images
            embeds = self.model.get_input_embeddings()(input_ids)  # type: ignore[operator]
            embeds[rows] = features.to(embeds.dtype)
            inputs = {"inputs_embeds": embeds.unsqueeze(0)}
        try:
            out = self.decoder(
                **inputs,
                position_ids=positions.unsqueeze(0),
                use_cache=False,
                trio_attn=attn,
            )
        finally:
            if hook is not None:
                hook.batch = None
        return out.last_hidden_state[0]

    def logits(self, hidden: Tensor) -> Tensor:
        """The causal LM's logits of `hidden` rows ([N, hidden] -> [N, vocab])."""
        rows = hidden.shape[0]
        if self._ids.shape[1] < rows:
            self._ids = self._ids.new_zeros(1, rows)
        modules = self.model._modules
        self._stand_in.hidden = hidden.unsqueeze(0)
        modules[self._prefix] = self._stand_in
        try:
            out = self.model(input_ids=self._ids[:, :rows], use_cache=False)
        finally:
            modules[self._prefix] = self.decoder
            self._stand_in.hidden = None
        return out.logits[0]
