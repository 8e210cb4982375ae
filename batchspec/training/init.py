"""A new head for a target, started where training converges fastest.

- `embed_tokens`: the target's input embeddings (frozen; see head.py).
- `lm_head` and `norm`: the target's LM-head rows of the draft vocabulary and its final norm's weight:
  the head's output space starts as the target's own, so training only has to move the hidden state,
  not also learn a vocabulary.
- `fc`: random, then each third (one target layer's hidden states) divided by that layer's RMS.
  Raw residual streams are tens in size (about 30-40 on the demo target) while a fresh layer adds
  updates of about 1: left alone, the token embedding (which only enters through attention) would be
  drowned in the residual until o_proj grew tens of times. Scaling the weights is the same as
  normalising the features, but needs no extra module, so every loader still reads the file.
"""

from __future__ import annotations

import torch

from ..eagle.config import EagleConfig, text_config
from ..eagle.head import EagleHead


def head_for_target(target, *, draft_target_ids: torch.Tensor | None = None,
                    layer_ids: tuple[int, int, int] | None = None) -> EagleHead:
    """A new head shaped like one layer of `target`, with its embeddings and LM-head rows."""
    vocab = text_config(target.config).vocab_size
    ids = torch.arange(vocab) if draft_target_ids is None else draft_target_ids
    head = EagleHead(EagleConfig.for_target(target.config, draft_vocab_size=len(ids), layer_ids=layer_ids))
    head.set_vocab(ids)
    head.set_embeddings(target.get_input_embeddings().weight.detach().float().cpu())
    with torch.no_grad():
        head.lm_head.weight.copy_(target.get_output_embeddings().weight.detach().float().cpu()[ids])
        norm = final_norm(target)
        if norm is not None and norm.shape == head.norm.weight.shape:
            head.norm.weight.copy_(norm)
    return head


def final_norm(target) -> torch.Tensor | None:
    """The weight of the target's final norm (Llama/Qwen2 `norm`, GPT-2 `ln_f`), if it has one."""
    decoder = target.get_decoder() if hasattr(target, "get_decoder") else None
    for name in ("norm", "ln_f", "final_layernorm"):
        weight = getattr(getattr(decoder, name, None), "weight", None)
        if isinstance(weight, torch.Tensor):
            return weight.detach().float().cpu()
    return None


def scale_fc(head: EagleHead, features: torch.Tensor) -> torch.Tensor:
    """Divide fc's input columns of each target layer by that layer's RMS over `features` [n, 3*Ht];
    returns the three RMS values."""
    ht = head.config.target_hidden_size
    blocks = features.float().view(-1, 3, ht)
    rms = blocks.pow(2).mean(dim=(0, 2)).sqrt().clamp_min(1e-6)  # [3]
    with torch.no_grad():
        weight = head.fc.weight.view(head.config.hidden_size, 3, ht)
        weight /= rms.to(weight)[None, :, None]
    return rms

