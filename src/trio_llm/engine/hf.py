"""What the engine reads off transformers' objects, in one place: a model's text config and its
decoder stack.

Why a module of its own: the own forwards, the generic path, LoRA's targets and the per-machine
plans all ask these two questions of a loaded model, and each asked them its own way (a
composite model, a vision-language one say, keeps its language model's fields in a text config
of its own, and names its decoder by a prefix). It sits below every engine folder, importing
nothing of the engine.
"""

from __future__ import annotations

import torch


def text_config(config: object) -> object:
    """The config of the language model in `config`: its text config where it has one (a
    composite model's), else `config` itself."""
    get = getattr(config, "get_text_config", None)
    return get() if callable(get) else config


def decoder_of(model: torch.nn.Module) -> torch.nn.Module:
    """The causal LM's decoder: the base model under its prefix (`model`, `transformer`, ...)."""
    prefix = getattr(model, "base_model_prefix", "model")
    decoder = getattr(model, prefix, None)
    if not isinstance(decoder, torch.nn.Module):
        decoder = model.get_decoder()  # type: ignore[operator]
    return decoder


def language_model_of(model: torch.nn.Module) -> torch.nn.Module:
    """The text decoder: a vision-language model's language model (its decoder holds the
    vision tower beside it), else the decoder itself."""
    decoder = decoder_of(model)
    for name in ("language_model", "text_model"):  # LLaVA's, Idefics3's
        language = getattr(decoder, name, None)
        if isinstance(language, torch.nn.Module):
            return language
    return decoder
