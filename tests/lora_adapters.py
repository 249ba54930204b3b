"""LoRA adapters made in the test with PEFT, and PEFT's own answer to compare the engine with.

`make_adapter` wraps a saved transformers model with random LoRA weights (PEFT's
`init_lora_weights=False`: A and B both random, so the adapter changes the output) and saves it
in PEFT's format, the directory the engine loads. `peft_greedy` runs PEFT's merged model
(`merge_and_unload`) with transformers in float32: the reference the engine must equal.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

ALL_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

ADAPTER_PROMPT = [1500, 27, 3021, 88, 412]
ADAPTER_TOKENS = 8
"""The prompt and length the `tiny_adapters` tests compare the engine with PEFT on."""


def make_adapter(
    base: Path | str,
    out: Path,
    *,
    seed: int,
    rank: int = 4,
    alpha: int | None = None,
    targets: Sequence[str] = ALL_PROJECTIONS,
    **config: object,
) -> Path:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    torch.manual_seed(seed)
    lora = LoraConfig(
        r=rank,
        lora_alpha=alpha if alpha is not None else 2 * rank,
        target_modules=list(targets),
        init_lora_weights=False,
        **config,  # type: ignore[arg-type]
    )
    get_peft_model(model, lora).save_pretrained(out)
    return out


def merged_model(base: Path | str, adapter: Path | None) -> torch.nn.Module:
    """The base model with `adapter` merged into its weights by PEFT (None: the base)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    if adapter is None:
        return model
    return PeftModel.from_pretrained(model, adapter).merge_and_unload().eval()


@torch.inference_mode()
def peft_greedy(model: torch.nn.Module, prompt: list[int], max_tokens: int) -> list[int]:
    """Greedy tokens of transformers' own generation loop (no EOS stop)."""
    ids = torch.tensor([prompt])
    out = model.generate(
        ids,
        max_new_tokens=max_tokens,
        min_new_tokens=max_tokens,
        do_sample=False,
        pad_token_id=0,
    )
    return out[0, len(prompt) :].tolist()


@torch.inference_mode()
def peft_logprobs(model: torch.nn.Module, tokens: list[int]) -> torch.Tensor:
    """Log-probabilities of each next position over `tokens`, [len - 1, vocab]."""
    logits = model(torch.tensor([tokens])).logits[0, :-1].float()
    return torch.log_softmax(logits, dim=-1)
