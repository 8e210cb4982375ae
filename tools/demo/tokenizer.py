"""The tokenizer: byte-level BPE trained on the train files (`<s>` id 0, prepended; `</s>` id 1; `<pad>` id 2),
the token streams it makes of the corpus, and the chat template it ships with."""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerFast

BOS, EOS, PAD = "<s>", "</s>", "<pad>"  # ids 0, 1, 2
# The demo tokenizer's chat template (so chat jobs run offline, jobs/demo_chat.yaml): the models only
# know Python, so a conversation is written as Python comments and the answer opens "# assistant:".
CHAT_TEMPLATE = """{{- bos_token -}}
{%- for message in messages -%}
# {{ message['role'] }}: {{ message['content'] | replace('\\n', '\\n# ') }}
{% endfor -%}
{%- if add_generation_prompt -%}
# assistant:
{% endif -%}
"""


def train_tokenizer(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE on `texts`; `tokenizer(text)` prepends `<s>`, decoding round-trips any text."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[BOS, EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, 0)]
    )
    assert [tok.token_to_id(t) for t in (BOS, EOS, PAD)] == [0, 1, 2]
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD)


def token_stream(tokenizer: PreTrainedTokenizerFast, texts: list[str]) -> torch.Tensor:
    """All texts as one 1-D tensor, each file as `<s> ... </s>`."""
    ids: list[int] = []
    for enc in tokenizer(texts, add_special_tokens=False)["input_ids"]:
        ids += [tokenizer.bos_token_id, *enc, tokenizer.eos_token_id]
    return torch.tensor(ids, dtype=torch.long)


def load_reused(build: Path) -> tuple[PreTrainedTokenizerFast, PreTrainedModel]:
    """The tokenizer and target of an earlier build (`--reuse-target BUILD`)."""
    tokenizer = PreTrainedTokenizerFast.from_pretrained(build / "target")
    for key in ("is_local", "local_files_only"):  # load-time options: save it as a fresh tokenizer would be
        tokenizer.init_kwargs.pop(key, None)
    reused = AutoModelForCausalLM.from_pretrained(build / "target", dtype=torch.float32)
    return tokenizer, reused
