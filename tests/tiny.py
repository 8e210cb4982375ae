"""Tiny random models and a tokenizer built offline, for the tests (fixed seeds, fp32)."""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import GPT2Config, LlamaConfig, PreTrainedTokenizerFast, Qwen2Config, AutoModelForCausalLM

CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "def mul(a, b):\n    return a * b\n",
    "for i in range(10):\n    print(i)\n",
    "the quick brown fox jumps over the lazy dog. the dog sleeps.",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "import os\nimport sys\nprint(os.path.join('a', 'b'))\n",
    "hello world, hello batch, hello speculative decoding!",
] * 4

PROMPTS = [
    "def add(a, b):",
    "the quick brown fox",
    "for i in range(10):\n    print(",
    "class Point:\n    def __init__(self, x, y):\n        self.x",
    "hello",
    "import os\nimport sys\nprint(os.path.join('a', 'b'))\nfor i in range(3):",
    "x",
    "the dog sleeps. the quick brown fox jumps over the lazy dog. the",
    "def mul(a, b):\n    return a * b\n\ndef add(a, b):\n    return",
    "hello world, hello batch, hello speculative decoding! hello world, hello",
    "print(i)",
    "a b c d e f g h i j k l m n o p q r s t u v w x y z 0 1 2 3 4 5 6 7 8 9",
]


def build_tokenizer(vocab_size: int = 320) -> PreTrainedTokenizerFast:
    """A byte-level BPE trained on CORPUS with <s> (BOS, prepended) and </s> (EOS)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


def model_config(arch: str, vocab_size: int, seed_scale: float = 0.05, layers: int = 2, hidden: int = 64):
    common = dict(vocab_size=vocab_size, bos_token_id=0, eos_token_id=1, pad_token_id=2)
    if arch == "llama":
        return LlamaConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                           initializer_range=seed_scale, tie_word_embeddings=False, **common)
    if arch == "qwen2":
        return Qwen2Config(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                           initializer_range=seed_scale, use_sliding_window=False, tie_word_embeddings=False, **common)
    if arch == "gpt2":
        return GPT2Config(n_embd=hidden, n_layer=layers, n_head=4, n_positions=512,
                          initializer_range=seed_scale * 2, **common)
    raise ValueError(arch)


def save_model(path: Path, arch: str, tokenizer, seed: int, vocab_size: int, eos_ids=(1,), **kw) -> Path:
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(model_config(arch, vocab_size, **kw), dtype=torch.float32)
    model.generation_config.eos_token_id = list(eos_ids) if len(eos_ids) > 1 else eos_ids[0]
    model.generation_config.bos_token_id = 0
    model.generation_config.pad_token_id = 2
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
