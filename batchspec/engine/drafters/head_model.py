"""An EAGLE-3 head dressed as the causal LM a ModelRunner drives (drafters/eagle.py runs it)."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn


class HeadAsModel(nn.Module):
    """An EagleHead behind the forward a ModelRunner drives (a causal LM's), with logits over the target's
    vocabulary (-inf outside the draft vocabulary) and the head's output as its one hidden state."""

    def __init__(self, head, target_vocab_size: int):
        super().__init__()
        self.head, self.target_vocab = head, target_vocab_size
        self.config = SimpleNamespace(get_text_config=lambda: SimpleNamespace(num_hidden_layers=1,
                                                                             hidden_size=head.config.hidden_size))
        self.register_buffer("target_ids", head.d2t + torch.arange(len(head.d2t), device=head.d2t.device))
        self._out = SimpleNamespace(weight=torch.empty(target_vocab_size, 0))

    @property
    def device(self) -> torch.device:
        return self.head.d2t.device

    @property
    def dtype(self) -> torch.dtype:
        return self.head.fc.weight.dtype

    def get_output_embeddings(self):
        return self._out  # its rows: the target's vocabulary

    def forward(self, input_ids, position_ids, attention_mask, past_key_values, logits_to_keep=0, hidden=None,
                **_):
        out = self.head(input_ids, hidden, position_ids, attention_mask, past_key_values)  # [b, T, H]
        kept = _keep(out, logits_to_keep)
        draft = self.head.logits(kept)
        logits = draft.new_full((*draft.shape[:-1], self.target_vocab), float("-inf"))
        logits[..., self.target_ids] = draft
        return SimpleNamespace(logits=logits, hidden_states=(out,))


def _keep(x: torch.Tensor, keep) -> torch.Tensor:
    """transformers' logits_to_keep over [b, T, H]: 0 all, int k the last k, [b, n] per-row positions."""
    if isinstance(keep, int):
        return x if keep == 0 else x[:, -keep:]
    if keep.dim() == 1:
        return x[:, keep]
    return x.gather(1, keep[:, :, None].expand(-1, -1, x.shape[-1]))
