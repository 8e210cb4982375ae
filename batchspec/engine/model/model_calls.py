"""How a runner calls a Hugging Face model across transformers releases: the name its cache argument takes,
and per-row logits positions (RowPositions)."""

from __future__ import annotations

import inspect

import torch


def cache_argument(model) -> str:
    """The name `model.forward` takes its KV cache by: transformers 5.24 renamed `past_key_values` to `cache`
    (the old name warns, and goes in 5.40); older releases, and our own EAGLE draft model, know only the old one."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


class RowPositions:
    """Per-row logits positions (`logits_to_keep` [b, n]) on any transformers release.

    transformers 5.24 reads a 2D integer `logits_to_keep` as a position per row; 5.17 (on the GPU machines,
    measured) indexes `hidden_states[:, keep]` with it and returns [b, b, n, V]. So the runner asks the model
    for every position and this pre-hook on the LM head keeps each row's own: the same take_along_dim the
    newer releases do, before the vocabulary projection, so it costs nothing extra. Only for models whose
    forward takes `logits_to_keep` (then 0 means every position reaches the LM head). A forward without it
    (Whisper's decoder, Moshi) returns every position whatever it is passed, so `narrow` picks the asked-for
    ones from its logits: read as they came, the first positions stood for the last (Whisper's decoder gave
    the token after BOS for every prompt).
    """

    def __init__(self, model):
        self.keep: torch.Tensor | None = None
        head = model.get_output_embeddings()
        self.accepts = "logits_to_keep" in inspect.signature(model.forward).parameters
        self.hooked = isinstance(head, torch.nn.Module) and self.accepts
        if self.hooked:
            head.register_forward_pre_hook(self._narrow)

    def _narrow(self, module, args):
        if self.keep is not None:
            return (torch.take_along_dim(args[0], self.keep[..., None], dim=1), *args[1:])

    def model_argument(self, logits_to_keep):
        """What to pass as logits_to_keep; remembers a per-row request for the hook (cleared by `done`)."""
        if self.hooked and isinstance(logits_to_keep, torch.Tensor) and logits_to_keep.dim() == 2:
            self.keep = logits_to_keep
            return 0
        return logits_to_keep

    def narrow(self, logits: torch.Tensor, logits_to_keep) -> torch.Tensor:
        """The model's logits [b, T', V] -> those of the positions asked for: as they are when its forward took
        `logits_to_keep`; else (every position came back) per row [b, n] (a 2D request), at the indices (1D),
        the last n (an int n > 0), or all (0)."""
        if self.accepts:
            return logits
        if isinstance(logits_to_keep, torch.Tensor):
            if logits_to_keep.dim() == 2:
                return torch.take_along_dim(logits, logits_to_keep[..., None], dim=1)
            return logits[:, logits_to_keep]
        return logits[:, -logits_to_keep:] if logits_to_keep else logits

    def done(self) -> None:
        self.keep = None

    @classmethod
    def of(cls, model) -> "RowPositions":
        """The model's one instance: every runner of a model shares its hook (a job builds many generators)."""
        head = model.get_output_embeddings()
        found = getattr(head, "_batchspec_row_positions", None)
        if found is None:
            found = cls(model)
            if found.hooked:
                head._batchspec_row_positions = found
        return found
