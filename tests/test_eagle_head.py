"""The EAGLE-3 head: cached decoding equals the full forward, the training-time test equals chain drafting,
the token maps, and which target hidden states are the features (random heads, fp32)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache

from batchspec.eagle import EagleConfig, EagleHead
from batchspec.training.features import target_states
from batchspec.training.ttt import ttt_mask, unroll
from tiny import model_config

TOL = 1e-5


def random_head(seed: int = 0, draft_vocab: int = 50, **kw) -> EagleHead:
    torch.manual_seed(seed)
    config = EagleConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=8, target_hidden_size=24, target_vocab_size=50, draft_vocab_size=draft_vocab,
                         target_num_layers=6, target_layer_ids=(2, 3, 3), **kw)
    head = EagleHead(config)
    for p in head.parameters():  # norms away from 1 too, so a mixed-up norm shows
        torch.nn.init.normal_(p, mean=1.0 if p.ndim == 1 else 0.0, std=0.2)
    return head.eval()


class SlotCache:
    """A per-row KV cache like the engine's: row b's token at position p lives in slot p."""

    def __init__(self, batch: int, heads: int, capacity: int, dim: int):
        self.k = torch.zeros(batch, heads, capacity, dim)
        self.v = torch.zeros(batch, heads, capacity, dim)
        self.positions: torch.Tensor | None = None  # [b, T] where this pass writes

    def update(self, k, v, layer_idx, *args, **kwargs):
        assert layer_idx == 0
        index = self.positions[:, None, :, None].expand(-1, k.shape[1], -1, k.shape[3])
        self.k.scatter_(2, index, k)
        self.v.scatter_(2, index, v)
        return self.k, self.v


def slot_mask(positions: torch.Tensor, capacity: int) -> torch.Tensor:
    """[b, 1, T, capacity] additive: query at position p sees slots 0..p."""
    allowed = torch.arange(capacity)[None, None, :] <= positions[:, :, None]
    return torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)[:, None]


@pytest.mark.parametrize("norm_before_residual", [False, True])
def test_cached_decoding_equals_full_forward(norm_before_residual):
    head = random_head(norm_before_residual=norm_before_residual)
    b, n = 3, 11
    ids = torch.randint(0, 50, (b, n))
    feats = torch.randn(b, n, 72)
    pos = torch.arange(n).expand(b, n)
    with torch.no_grad():
        full = head(ids, feats, pos)
        cache = DynamicCache()
        parts = [head(ids[:, :4], feats[:, :4], pos[:, :4], past_key_values=cache)]
        kv_len = 4
        for start, stop in ((4, 5), (5, 8), (8, 11)):  # one token, then chunks with an explicit mask
            t = stop - start
            allowed = torch.ones(t, kv_len + t, dtype=torch.bool).tril(kv_len)
            mask = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
            parts.append(head(ids[:, start:stop], feats[:, start:stop], pos[:, start:stop], mask[None, None], cache))
            kv_len += t
    assert (torch.cat(parts, 1) - full).abs().max() < TOL


def test_per_row_slot_cache_with_uneven_rows():
    """Rows at different lengths in one batch (the engine's layout) give each row's own full forward."""
    head = random_head(1)
    lengths, capacity = [3, 7, 5], 12
    seqs = [(torch.randint(0, 50, (1, n + 1)), torch.randn(1, n + 1, 72)) for n in lengths]
    with torch.no_grad():
        cache = SlotCache(3, 2, capacity, 8)
        # Prefill each row to its own length (right padding; padded queries write slots nobody reads yet).
        width = max(lengths)
        ids = torch.zeros(3, width, dtype=torch.long)
        feats = torch.zeros(3, width, 72)
        for r, (i, f) in enumerate(seqs):
            ids[r, : lengths[r]], feats[r, : lengths[r]] = i[0, : lengths[r]], f[0, : lengths[r]]
        pos = torch.arange(width).expand(3, width)
        cache.positions = pos
        head(ids, feats, pos, slot_mask(pos, capacity), cache)
        # One more token per row, each at its own position.
        pos = torch.tensor(lengths)[:, None]
        cache.positions = pos
        step_ids = torch.stack([i[0, n] for (i, _), n in zip(seqs, lengths)])[:, None]
        step_feats = torch.stack([f[0, n] for (_, f), n in zip(seqs, lengths)])[:, None]
        out = head(step_ids, step_feats, pos, slot_mask(pos, capacity), cache)
        for r, (i, f) in enumerate(seqs):
            n = lengths[r]
            ref = head(i, f, torch.arange(n + 1)[None])[:, -1]
            assert (out[r] - ref).abs().max() < TOL


def test_training_time_test_equals_chain_drafting():
    """unroll's step j at row i = drafting from position i through a cache: step 0 over the target's
    features up to i, then each step reads the previous output at the next position."""
    head = random_head(2)
    n, steps = 10, 4
    ids = torch.randint(0, 50, (1, n))
    feats = torch.randn(1, n, 72)
    with torch.no_grad():
        outs = unroll(head, ids, feats, steps)
        for i in (0, 3, 8):
            cache = DynamicCache()
            hidden = head(ids[:, 1: i + 2], feats[:, : i + 1], torch.arange(i + 1)[None], past_key_values=cache)[:, -1:]
            assert (hidden[0, 0] - outs[0][0, i]).abs().max() < TOL
            for j in range(1, steps):
                if i + 1 + j >= n:
                    break
                # the token drafted at step j-1 (the target's own where earlier drafts were accepted)
                hidden = head(ids[:, i + 1 + j: i + 2 + j], hidden, torch.tensor([[i + j]]), past_key_values=cache)
                assert (hidden[0, 0] - outs[j][0, i]).abs().max() < TOL


def test_ttt_mask_pattern():
    mask = ttt_mask(3, 2, torch.float32)[0, 0] == 0
    expected = torch.tensor([[1, 0, 0, 1, 0, 0, 1, 0, 0],
                             [1, 1, 0, 0, 1, 0, 0, 1, 0],
                             [1, 1, 1, 0, 0, 1, 0, 0, 1]], dtype=torch.bool)
    assert torch.equal(mask, expected)


# the TTT mask as built, or one that lets every row see every key -> whether sees_future must find a leak
LEAKS = [(False, False), (True, True)]


@pytest.mark.parametrize("unmasked,leaks", LEAKS)
def test_sees_future_finds_an_attention_that_reads_later_positions(monkeypatch, unmasked, leaks):
    """The check gpu_check runs on a GPU's attention kernels: an earlier row's output must not move when later
    positions change. It finds the leak of a mask that hides nothing."""
    from batchspec.training import ttt

    if unmasked:
        monkeypatch.setattr(ttt, "ttt_mask", lambda length, step, dtype, device="cpu": torch.zeros(
            1, 1, length, (step + 1) * length, dtype=dtype, device=device))
    head = random_head(4)
    ids, feats = torch.randint(0, 50, (2, 24)), torch.randn(2, 24, 72)
    change = ttt.sees_future(head, ids, feats, steps=3)
    assert (change > 1e-2) if leaks else change == 0


def test_token_maps():
    head = random_head(3, draft_vocab=4)
    used = torch.tensor([1, 7, 8, 30])
    head.set_vocab(used)
    assert torch.equal(head.d2t, torch.tensor([1, 6, 6, 27]))  # target id = draft id + d2t[draft id]
    assert torch.equal(head.to_target_ids(torch.tensor([[3, 0], [2, 1]])), torch.tensor([[30, 1], [8, 7]]))
    assert head.t2d.sum() == 4 and head.t2d[used].all()
    target_logits = torch.arange(50.0)[None]
    assert torch.equal(head.target_to_draft_logits(target_logits), used[None].float())
    assert head.logits(torch.randn(2, 3, 32)).shape == (2, 3, 4)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_feature_index_is_the_input_of_that_layer(arch):
    """hidden_states[i] = the input of decoder layer i (vLLM's aux layer i); [-1] = the LM head's input."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(model_config(arch, 100, layers=5), dtype=torch.float32).eval()
    inputs = {}
    layers = model.model.layers if hasattr(model, "model") else model.transformer.h
    hooks = [layer.register_forward_pre_hook(
        lambda mod, args, kwargs, i=i: inputs.__setitem__(i, args[0] if args else kwargs["hidden_states"]),
        with_kwargs=True) for i, layer in enumerate(layers)]
    ids = torch.randint(3, 100, (2, 6))
    states = target_states(model, ids, torch.ones_like(ids), (0, 2, 4))
    for hook in hooks:
        hook.remove()
    h = model.config.get_text_config().hidden_size
    for slot, layer in enumerate((0, 2, 4)):
        assert torch.equal(states.features[..., slot * h: (slot + 1) * h], inputs[layer])
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert torch.allclose(model.get_output_embeddings()(states.final), logits, atol=1e-5)
