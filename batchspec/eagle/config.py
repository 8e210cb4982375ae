"""What an EAGLE-3 head is: its own shape, and the target it reads from.

The head is one Llama-style decoder layer. It reads the target's hidden states at three depths; this
module names them by their index in Hugging Face's `output_hidden_states` tuple, where index i is the
INPUT of decoder layer i (index 0 = the embeddings; index L, the final-norm output, is never used).
That is exactly what vLLM calls aux layer i (`aux_hidden_states.append(hidden_states + residual)`
before layer i runs) and what SGLang captures for `layers_to_capture = [i]`; the common default
(2, L//2, L-3) (vLLM `get_eagle3_aux_hidden_state_layers`, SGLang `set_eagle3_layers_to_capture`,
EAGLE's `modeling_llama_kv.py`, speculators' `resolve_target_layer_ids`) is `default_layer_ids`.
SpecForge and SGLang store non-default ids as layer OUTPUTS (`eagle_config.eagle_aux_hidden_state_layer_ids`,
SGLang adds 1 when capturing); `formats.py` converts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


class HeadError(ValueError):
    """An EAGLE-3 head that cannot be used (bad files, or a head for another target); one line."""


def default_layer_ids(num_layers: int) -> tuple[int, int, int]:
    """(2, L//2, L-3), the hidden-state indices vLLM, SGLang and EAGLE read by default; for a target of 4 to 6
    layers, where those repeat or descend ((2, 2, 1) for 4), the nearest distinct, ascending ids >= 1 (what
    other engines can feed: eagle/layer_ids.py); kept inside [0, L-1] for a target of fewer than 4."""
    if num_layers < 1:
        raise HeadError(f"a target needs at least one layer, got {num_layers}")
    if num_layers < 4:  # no three distinct indices in 1..L-1
        return tuple(min(max(i, 0), num_layers - 1) for i in (2, num_layers // 2, num_layers - 3))  # type: ignore
    low = min(2, num_layers - 3)
    mid = max(num_layers // 2, low + 1)
    return low, mid, max(num_layers - 3, mid + 1)


def text_config(config):
    """The language model's config (multimodal configs keep it under text_config)."""
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def target_num_layers(config) -> int:
    c = text_config(config)
    for name in ("num_hidden_layers", "n_layer"):
        if isinstance(getattr(c, name, None), int):
            return getattr(c, name)
    raise HeadError(f"cannot tell how many layers the target ({type(c).__name__}) has")


def target_hidden_size(config) -> int:
    c = text_config(config)
    for name in ("hidden_size", "n_embd", "d_model"):
        if isinstance(getattr(c, name, None), int):
            return getattr(c, name)
    raise HeadError(f"cannot tell the hidden size of the target ({type(c).__name__})")


@dataclass
class EagleConfig:
    """Shape of an EAGLE-3 head and the facts about its target that it was trained for.

    target_layer_ids: Hugging Face `output_hidden_states` indices (see the module docstring), in the
    order their hidden states are concatenated (low, middle, high), each in [0, target_num_layers - 1].
    rope_parameters: transformers-5 style, e.g. {"rope_type": "default", "rope_theta": 10000.0}.
    norm_before_residual: speculators' variant whose residual is hidden_norm(h) instead of h.
    """

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    target_hidden_size: int
    target_vocab_size: int
    draft_vocab_size: int
    target_num_layers: int
    target_layer_ids: tuple[int, int, int]
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 4096
    rope_parameters: dict[str, Any] = field(default_factory=lambda: {"rope_type": "default", "rope_theta": 10000.0})
    hidden_act: str = "silu"
    norm_before_residual: bool = False

    def __post_init__(self) -> None:
        self.target_layer_ids = tuple(int(i) for i in self.target_layer_ids)  # type: ignore[assignment]
        if len(self.target_layer_ids) != 3:
            raise HeadError(f"an EAGLE-3 head reads 3 target layers, this one names {list(self.target_layer_ids)}")
        bad = [i for i in self.target_layer_ids if not 0 <= i < self.target_num_layers]
        if bad:
            raise HeadError(f"target layer ids {list(self.target_layer_ids)} out of range for a "
                            f"{self.target_num_layers}-layer target (valid: 0..{self.target_num_layers - 1})")
        if not 0 < self.draft_vocab_size <= self.target_vocab_size:
            raise HeadError(f"draft vocabulary {self.draft_vocab_size} must be 1..target vocabulary "
                            f"{self.target_vocab_size}")
        if 3 * self.target_hidden_size == self.hidden_size:
            raise HeadError("a head 3x wider than its target is not supported (feature width would equal hidden)")

    @property
    def feature_size(self) -> int:
        """Width of the concatenated target features the fc layer reads: 3 x target hidden size."""
        return 3 * self.target_hidden_size

    @classmethod
    def for_target(cls, target_config, *, draft_vocab_size: int | None = None,
                   layer_ids: tuple[int, int, int] | None = None) -> "EagleConfig":
        """A head shaped like one layer of the target (as SpecForge's draft configs are): the target's
        hidden, MLP, heads, KV heads, norm epsilon and RoPE; RoPE base 10000 for targets without RoPE."""
        c = text_config(target_config)
        hidden = target_hidden_size(c)
        layers = target_num_layers(c)
        heads = getattr(c, "num_attention_heads", None) or getattr(c, "n_head")
        kv_heads = getattr(c, "num_key_value_heads", None) or heads
        head_dim = getattr(c, "head_dim", None) or hidden // heads
        intermediate = getattr(c, "intermediate_size", None) or getattr(c, "n_inner", None) or 4 * hidden
        eps = getattr(c, "rms_norm_eps", None) or getattr(c, "layer_norm_epsilon", None) or 1e-6
        rope = dict(getattr(c, "rope_parameters", None) or {"rope_type": "default", "rope_theta": 10000.0})
        if "sliding_attention" in rope or "full_attention" in rope:  # per-layer-type RoPE: take the full one
            rope = dict(rope.get("full_attention") or rope.get("sliding_attention"))
        positions = getattr(c, "max_position_embeddings", None) or getattr(c, "n_positions", None) or 4096
        vocab = c.vocab_size
        return cls(
            hidden_size=hidden, intermediate_size=intermediate, num_attention_heads=heads,
            num_key_value_heads=kv_heads, head_dim=head_dim, target_hidden_size=hidden, target_vocab_size=vocab,
            draft_vocab_size=draft_vocab_size or vocab, target_num_layers=layers,
            target_layer_ids=layer_ids or default_layer_ids(layers), rms_norm_eps=float(eps),
            max_position_embeddings=positions, rope_parameters=rope,
        )

    def check_target(self, target_config, where: str = "head") -> None:
        """Raise HeadError (one line) unless this head fits `target_config`: hidden size, vocabulary, depth."""
        c = text_config(target_config)
        hidden, layers, vocab = target_hidden_size(c), target_num_layers(c), c.vocab_size
        if hidden != self.target_hidden_size:
            raise HeadError(f"{where} reads target hidden states of size {self.target_hidden_size}, "
                            f"but the target's hidden size is {hidden}")
        if vocab != self.target_vocab_size:
            raise HeadError(f"{where} was made for a target vocabulary of {self.target_vocab_size} tokens, "
                            f"but the target has {vocab}")
        bad = [i for i in self.target_layer_ids if not 0 <= i < layers]
        if bad:
            raise HeadError(f"{where} reads target layers {list(self.target_layer_ids)}, out of range for "
                            f"the {layers}-layer target (valid: 0..{layers - 1})")
        if layers != self.target_num_layers:
            raise HeadError(f"{where} was made for a {self.target_num_layers}-layer target, but the target has "
                            f"{layers} layers")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["target_layer_ids"] = list(self.target_layer_ids)
        return d
