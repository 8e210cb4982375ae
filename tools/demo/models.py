"""The models: Llama (or Qwen2) configs of a given shape, built fresh from a seed, and their sizes."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedModel, Qwen2Config


def model_config(arch: str, vocab_size: int, hidden: int, layers: int, intermediate: int, heads: int, kv_heads: int,
                 max_positions: int):
    """A Llama (the shipped demo) or Qwen2-shaped config (`--arch qwen2`: a second architecture to try tools on)."""
    config_class = {"llama": LlamaConfig, "qwen2": Qwen2Config}[arch]
    return config_class(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=max_positions,
        tie_word_embeddings=True, bos_token_id=0, eos_token_id=1, pad_token_id=2,
    )


def new_model(config, seed: int) -> PreTrainedModel:
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).to(torch.float32)
    model.generation_config.bos_token_id = 0
    model.generation_config.eos_token_id = 1
    model.generation_config.pad_token_id = 2
    return model


def n_params(model: torch.nn.Module) -> int:
    """Unique parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())
