"""Tiny Hugging Face models written on the fly for the tests that train from a pretrained
folder (nothing is downloaded)."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def write_llama(folder: Path) -> LlamaForCausalLM:
    """A 3-block LLaMA with grouped-query attention and seeded random weights, written by
    `save_pretrained` into `folder`; the model, for its state dict."""
    config = LlamaConfig(
        vocab_size=288, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        tie_word_embeddings=False,
    )  # fmt: skip
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
    model.save_pretrained(folder)
    return model
