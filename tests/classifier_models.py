"""Tiny random-weight sequence classifiers, built from transformers' config classes and saved as
Hugging Face directories, for the pooling tests and bench/apis/rerank.py (no downloads):

- a BERT cross-encoder (one label) with all-MiniLM-L6-v2's WordPiece tokenizer, whose pair
  encoding has token types;
- an XLM-R cross-encoder with a small SentencePiece-style (Unigram) tokenizer built here, whose
  pair encoding is `<s> a </s></s> b </s>` with no token types and whose positions start past
  its padding index;
- a Qwen2 classifier (several labels) with the default model's tokenizer, which pools the
  last token.

The weights are random, so the scores mean nothing; what the tests check is that the engine's
numbers are the model's own (transformers' forward, sentence-transformers' `CrossEncoder`).
"""

from __future__ import annotations

import json
from pathlib import Path

from trio_llm.config import DEFAULT_EMBEDDING_MODEL
from trio_llm.model_files import ModelSource, load_tokenizer, resolve_model

_TEXT = (
    "the a of to and in is for on with as by at from that this it an be are was or which "
    "model engine server request token batch memory cache kernel thread process ring shared "
    "python trio quart hypercorn stream latency throughput embedding sentence vector search "
    "query document paragraph river mountain city coffee morning music garden winter summer "
    "quickly slowly carefully never always often running reading writing building measuring "
    "cat dog sat mat paris capital france berlin germany what where is"
)
_WORDS = _TEXT.split()


def _save(model: object, tokenizer: object, path: Path, activation: str | None) -> Path:
    if activation is not None:
        model.config.sentence_transformers = {"activation_fn": activation}  # type: ignore[attr-defined]
    model.save_pretrained(path)  # type: ignore[attr-defined]
    tokenizer.save_pretrained(path)  # type: ignore[attr-defined]
    return path


def build_bert_cross_encoder(
    path: Path, *, num_labels: int = 1, activation: str | None = None, seed: int = 0
) -> Path:
    """`activation`: the sentence-transformers activation to write into the config (a
    `torch.nn` path); None writes none (sigmoid is then the default)."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    tokenizer = load_tokenizer(resolve_model(DEFAULT_EMBEDDING_MODEL))
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=128,
        type_vocab_size=2,
        num_labels=num_labels,
        initializer_range=0.2,
        architectures=["BertForSequenceClassification"],
    )
    torch.manual_seed(seed)
    model = BertForSequenceClassification(config).eval()
    return _save(model, tokenizer, path, activation)


def xlmr_tokenizer() -> object:
    """An XLM-R tokenizer (Unigram pieces, XLM-R's special tokens and pair template) over a
    small vocabulary: every word of the test corpora, and single letters for the rest."""
    from transformers import XLMRobertaTokenizer

    pieces = [("<s>", 0.0), ("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    pieces += [(f"▁{w}", -1.0 - i / 100) for i, w in enumerate(dict.fromkeys(_WORDS))]
    pieces += [(c, -8.0) for c in "abcdefghijklmnopqrstuvwxyz.,?!'"]
    pieces += [("▁", -9.0), ("<mask>", 0.0)]
    return XLMRobertaTokenizer(vocab=pieces)


def build_xlmr_cross_encoder(path: Path, *, seed: int = 0) -> Path:
    import torch
    from transformers import XLMRobertaConfig, XLMRobertaForSequenceClassification

    tokenizer = xlmr_tokenizer()
    config = XLMRobertaConfig(
        vocab_size=len(tokenizer),  # type: ignore[arg-type]
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=130,  # 128 positions past the padding index (1)
        type_vocab_size=1,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        num_labels=1,
        initializer_range=0.2,
        architectures=["XLMRobertaForSequenceClassification"],
    )
    torch.manual_seed(seed)
    model = XLMRobertaForSequenceClassification(config).eval()
    return _save(model, tokenizer, path, None)


QWEN2_LABELS = {0: "negative", 1: "neutral", 2: "positive"}


def build_qwen2_classifier(path: Path, tokenizer_source: ModelSource, *, seed: int = 0) -> Path:
    import torch
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    tokenizer = load_tokenizer(tokenizer_source)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        num_labels=len(QWEN2_LABELS),
        id2label=QWEN2_LABELS,
        label2id={v: k for k, v in QWEN2_LABELS.items()},
        pad_token_id=tokenizer.pad_token_id,
        initializer_range=0.2,
        architectures=["Qwen2ForSequenceClassification"],
    )
    torch.manual_seed(seed)
    model = Qwen2ForSequenceClassification(config).eval()
    return _save(model, tokenizer, path, None)


def write_sentence_bert_config(path: Path, max_seq_length: int) -> None:
    (path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq_length}))
