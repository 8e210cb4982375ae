"""What a drafting model's step does with its logits, shared by the draft model and the EAGLE head: choose
the drafts (a chain's token, a tree level's nodes) under greedy, coupled or rejection sampling, lay out
the spine-and-leaves tree geometry, and hand what the steps wrote into the round's buffers back as a Draft."""

from __future__ import annotations

import torch

from ..types import TreeSpec
from ..acceptance import sample
from ..noise import STREAM_DRAFT, uniforms
from ..round import Draft, Plan, RoundBuffers
from ..sampling import RowSampling, SamplingParams, choose, probs_of, scores


def no_tree(buffers: RoundBuffers, b: int, spec: TreeSpec) -> Draft:
    """A round with no room to draft: a tree of no valid nodes."""
    n = spec.nodes
    tokens = buffers.put_drafts([[0] * n] * b, b, n)
    valid = buffers.put_tree([[-1] * n] * b, [[0] * n] * b, b, n)
    return Draft(tokens=tokens, num_tokens=buffers.put_num_drafts([0] * b), host_num=[0] * b,
                 parents=buffers.parents[:b, :n], valid=valid, spec=spec)


def choose_draft(logits, i: int, sampling: SamplingParams, lengths, keys, presence, gumbel, drafts, probs,
                 branching: int = 0, rows: RowSampling | None = None):
    """Draft i from a draft's logits [b, V] (over the target's vocabulary) after the previous one: into
    drafts[:, i] (a chain) or level i's `branching` nodes drafts[:, i * B .. (i + 1) * B] (a tree: its spine first); under
    rejection sampling q into probs[:, i] (chain) or probs[:, the spine node above] (tree's q_at).
    Returns the token fed next (the spine) [b]. rows: each row's sampling transforms (None: the job's)."""
    s = scores(logits.float(), sampling, presence, rows)
    if sampling.greedy or sampling.coupled:
        noise = gumbel[:, i] if gumbel is not None else None
        if not branching:
            token = choose(s, noise, rows)
            drafts[:, i] = token
            return token
        if noise is not None and rows is not None:
            noise = noise.masked_fill(rows.greedy[:, None], 0.0)
        level = (s if noise is None else s + noise).topk(branching, dim=-1).indices  # [b, B]: spine first
        drafts[:, i * branching : (i + 1) * branching] = level
        return level[:, 0]
    q = probs_of(s, rows)
    if not branching:
        token = sample(q, uniforms(keys, (lengths + i)[:, None], STREAM_DRAFT)[:, 0])
        probs[:, i] = q
        drafts[:, i] = token
        return token
    u = torch.stack([uniforms(keys, (lengths + i)[:, None], STREAM_DRAFT + 64 * c)[:, 0]
                     for c in range(branching)], dim=1)  # c = 0 is the chain's own draw
    b = q.shape[0]
    level = sample(q.repeat_interleave(branching, dim=0), u.reshape(-1)).reshape(b, branching)
    drafts[:, i * branching : (i + 1) * branching] = level
    probs[:, 0 if i == 0 else (i - 1) * branching + 1] = q  # q_at: the root, then each spine node
    return level[:, 0]


def layout_tree(spec: TreeSpec, budgets: torch.Tensor, tokens: torch.Tensor, device: torch.device):
    """The spine-and-leaves geometry: node (d, r) at d * B + r; its parent the spine node one level up;
    valid where d < the row's budget. Zeroes the tokens of invalid nodes (eagerly: after the steps;
    static: before them, and only leftovers of earlier rounds remain there). -> parents, valid [b, N]."""
    width_b, depth = spec.branching, spec.depth
    node_depth = torch.arange(depth, device=device).repeat_interleave(width_b)
    spine_above = torch.where(node_depth > 0, (node_depth - 1) * width_b, -1)
    parents = spine_above.expand(tokens.shape[0], -1)
    valid = node_depth[None, :] < budgets.clamp(max=depth)[:, None]
    tokens.mul_(valid)
    return parents, valid


def lay_out_static_tree(spec: TreeSpec, num: torch.Tensor, drafts: torch.Tensor, buffers: RoundBuffers,
                        device: torch.device) -> None:
    """Step 0 of a static tree round: the tree's geometry (it depends only on the budgets `num`) into the
    round's parents and valid buffers, and num becomes each row's valid nodes."""
    parents, valid = layout_tree(spec, num, drafts[:, : spec.nodes], device)
    buffers.parents[:, : spec.nodes] = parents
    buffers.valid[:, : spec.nodes] = valid
    num.copy_(valid.sum(1))


def buffered_draft(plan: Plan, budgets: list[int], steps: int, num: torch.Tensor, probs: torch.Tensor | None,
                   spec: TreeSpec | None, device: torch.device) -> Draft:
    """What a drafting model's steps wrote into the round's buffers, as its Draft: a chain of `steps` drafts
    per row (num: their counts), or the tree of `spec`, laid out here (eagerly)."""
    b, buffers = len(plan.rows), plan.buffers
    if spec is None:
        return Draft(tokens=buffers.drafts[:b, :steps], num_tokens=num,
                     probs=probs[:b, :steps] if probs is not None else None, host_num=list(budgets))
    n = spec.nodes
    parents, valid = layout_tree(spec, num, buffers.drafts[:b, :n], device)
    nodes = [spec.branching * min(k, spec.depth) for k in budgets]  # the first levels: a prefix of the node slots
    return Draft(tokens=buffers.drafts[:b, :n], num_tokens=valid.sum(1), parents=parents, valid=valid,
                 q_at=probs[:b, : n + 1] if probs is not None else None, spec=spec, host_num=nodes)


def laid_out_draft(plan: Plan, budgets: list[int], steps: int, num: torch.Tensor, probs: torch.Tensor | None,
                   spec: TreeSpec | None, device: torch.device) -> Draft:
    """buffered_draft on the static path, where the first step laid a tree out in the buffers (every slot)."""
    if spec is None:
        return buffered_draft(plan, budgets, steps, num, probs, spec, device)
    n, buffers = spec.nodes, plan.buffers
    return Draft(tokens=buffers.drafts[:, :n], num_tokens=num, parents=buffers.parents[:, :n],
                 valid=buffers.valid[:, :n], q_at=probs[:, : n + 1] if probs is not None else None, spec=spec)
