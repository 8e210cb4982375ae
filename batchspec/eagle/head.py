"""The EAGLE-3 draft head: one Llama-style decoder layer over the target's own hidden states.

    features [b, T, 3*Ht]  (target hidden states of three layers, concatenated: low, middle, high)
        -> fc -> h [b, T, H]
    x = cat(input_layernorm(embed(token)), hidden_norm(h))            [b, T, 2H]
    h' = h + o_proj(attention(q_proj(x), k_proj(x), v_proj(x)))       (RoPE at position_ids, a KV cache)
    out = h' + mlp(post_attention_layernorm(h'))                     [b, T, H]  <- fed back as `hidden`
    logits = lm_head(norm(out))                                       [b, T, draft_vocab]

Weight names follow SpecForge / SGLang (`fc`, `midlayer.*`, `norm`, `lm_head`, `d2t`, `t2d`,
`embed_tokens`), so a state dict saves and loads without renaming (formats.py).

Alignment (as vLLM's EAGLE proposer and SpecForge's training use it): the head's row at position i
reads the target's features of position i and the token at position i+1, runs at RoPE position i,
and predicts the token at position i+2. A draft step j > 0 for the same chain reads the token drafted
by step j-1 and the head's own `out` of step j-1, at position i+j.

Token embeddings: the head uses the TARGET's input embedding matrix (a frozen copy, `embed_tokens`),
as SGLang (`set_embed` with the target's embeddings for EAGLE-3), SpecForge (loads and freezes the
target's embeddings; its export drops them) and EAGLE (`load_emb`) do; vLLM uses the head's own copy
when the checkpoint carries one (speculators' checkpoints do), else the target's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding, apply_rotary_pos_emb

from .config import EagleConfig


def llama_config(config: EagleConfig) -> LlamaConfig:
    """The HF config of the head's single layer (for its MLP and RoPE)."""
    return LlamaConfig(
        vocab_size=config.target_vocab_size, hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size, num_hidden_layers=1,
        num_attention_heads=config.num_attention_heads, num_key_value_heads=config.num_key_value_heads,
        head_dim=config.head_dim, hidden_act=config.hidden_act, rms_norm_eps=config.rms_norm_eps,
        max_position_embeddings=config.max_position_embeddings, rope_parameters=dict(config.rope_parameters),
        attention_bias=False, mlp_bias=False, tie_word_embeddings=False,
    )


class EagleAttention(nn.Module):
    """Self-attention whose q/k/v read the 2H-wide cat(embedding, hidden) input."""

    def __init__(self, config: EagleConfig):
        super().__init__()
        h, d = config.hidden_size, config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, d
        self.q_proj = nn.Linear(2 * h, self.num_heads * d, bias=False)
        self.k_proj = nn.Linear(2 * h, self.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(2 * h, self.num_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(self.num_heads * d, h, bias=False)

    def forward(self, x: torch.Tensor, cos_sin, attention_mask: torch.Tensor | None, cache) -> torch.Tensor:
        """x [b, T, 2H] -> [b, T, H]. attention_mask: additive [b, 1, T, kv_len] or None (causal, the
        queries being the last T keys). cache: a transformers Cache (layer 0) or None."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, *cos_sin)
        if cache is not None:
            k, v = cache.update(k, v, 0)  # [b, kv_heads, kv_len, d]: what the queries attend over
        groups = self.num_heads // self.num_kv_heads
        if groups > 1:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        if attention_mask is None:
            kv_len = k.shape[2]
            allowed = torch.ones(t, kv_len, dtype=torch.bool, device=x.device).tril(kv_len - t)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask.to(q.dtype))
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.num_heads * self.head_dim))


class EagleLayer(nn.Module):
    """The head's decoder layer (SpecForge's `midlayer`)."""

    def __init__(self, config: EagleConfig):
        super().__init__()
        h, eps = config.hidden_size, config.rms_norm_eps
        self.norm_before_residual = config.norm_before_residual
        self.input_layernorm = LlamaRMSNorm(h, eps=eps)  # on the token embedding
        self.hidden_norm = LlamaRMSNorm(h, eps=eps)  # on the incoming hidden state
        self.self_attn = EagleAttention(config)
        self.post_attention_layernorm = LlamaRMSNorm(h, eps=eps)
        self.mlp = LlamaMLP(llama_config(config))

    def forward(self, embeds, hidden, cos_sin, attention_mask, cache) -> torch.Tensor:
        """embeds, hidden [b, T, H] -> [b, T, H] (pre-norm)."""
        normed = self.hidden_norm(hidden)
        residual = normed if self.norm_before_residual else hidden
        x = torch.cat([self.input_layernorm(embeds), normed], dim=-1)
        hidden = residual + self.self_attn(x, cos_sin, attention_mask, cache)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class EagleHead(nn.Module):
    """An EAGLE-3 head. `forward` runs one draft step (or the step-0 pass over target features);
    `logits` and `to_target_ids` turn its output into target-vocabulary tokens."""

    def __init__(self, config: EagleConfig):
        super().__init__()
        self.config = config
        h = config.hidden_size
        # The target's input embeddings (copied in by `set_embeddings`), frozen: never trained.
        self.embed_tokens = nn.Embedding(config.target_vocab_size, h)
        self.embed_tokens.weight.requires_grad_(False)
        self.fc = nn.Linear(config.feature_size, h, bias=False)
        self.midlayer = EagleLayer(config)
        self.norm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(h, config.draft_vocab_size, bias=False)
        self.rotary_emb = LlamaRotaryEmbedding(llama_config(config))
        # Draft id -> target id is `draft_id + d2t[draft_id]` (SpecForge, SGLang's hot_token_id, vLLM's
        # draft_id_to_target_id); t2d[target_id] says whether the target token is in the draft vocabulary.
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(config.target_vocab_size, dtype=torch.bool))
        self.set_vocab(torch.arange(config.draft_vocab_size))

    def set_vocab(self, target_ids: torch.Tensor) -> None:
        """Use the target tokens `target_ids` [draft_vocab] (ascending) as the draft vocabulary."""
        target_ids = target_ids.to(self.d2t.device, torch.long)
        self.d2t.copy_(target_ids - torch.arange(len(target_ids), device=target_ids.device))
        self.t2d.zero_()
        self.t2d[target_ids] = True

    def set_embeddings(self, weight: torch.Tensor) -> None:
        """Copy the target's input embedding matrix [target_vocab, H] into the head."""
        with torch.no_grad():
            self.embed_tokens.weight.copy_(weight[: self.config.target_vocab_size])

    def project(self, features: torch.Tensor) -> torch.Tensor:
        """features [b, T, 3*Ht] (target hidden states at target_layer_ids, concatenated) -> [b, T, H]."""
        return self.fc(features)

    def forward(self, input_ids: torch.Tensor, hidden: torch.Tensor, position_ids: torch.Tensor,
                attention_mask: torch.Tensor | None = None, past_key_values=None) -> torch.Tensor:
        """One pass of the head's layer.

        input_ids [b, T]: the token at each row's NEXT position (see the module docstring).
        hidden [b, T, 3*Ht]: target features (fc is applied here), or [b, T, H]: the head's own
            previous output (a draft step).
        position_ids [b, T]: RoPE positions (the position of the hidden state; +1 per draft step).
        attention_mask [b, 1, T, kv_len]: additive float, 0 = attend, finfo.min = blocked, over the keys
            the cache returns; None = causal with the queries as the last T keys.
        past_key_values: a transformers `Cache`; `update(k, v, layer_idx=0)` stores this pass's keys and
            values and returns everything to attend over ([b, kv_heads, kv_len, head_dim]); None = no cache.
        Returns out [b, T, H], the pre-norm hidden state (the next draft step's `hidden`).
        """
        if hidden.shape[-1] == self.config.feature_size:
            hidden = self.fc(hidden)
        elif hidden.shape[-1] != self.config.hidden_size:
            raise ValueError(f"hidden has width {hidden.shape[-1]}; expected {self.config.feature_size} "
                             f"(target features) or {self.config.hidden_size} (the head's own output)")
        embeds = self.embed_tokens(input_ids).to(hidden.dtype)
        cos_sin = self.rotary_emb(hidden, position_ids)
        return self.midlayer(embeds, hidden, cos_sin, attention_mask, past_key_values)

    def logits(self, hidden_out: torch.Tensor) -> torch.Tensor:
        """hidden_out [b, T, H] -> draft-vocabulary logits [b, T, draft_vocab]."""
        return self.lm_head(self.norm(hidden_out))

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary ids (any shape) -> target-vocabulary ids: draft_id + d2t[draft_id]."""
        return draft_ids + self.d2t[draft_ids]

    def target_to_draft_logits(self, target_logits: torch.Tensor) -> torch.Tensor:
        """[..., target_vocab] -> [..., draft_vocab]: the target's scores of the draft vocabulary, in draft order."""
        return target_logits[..., self.t2d]
