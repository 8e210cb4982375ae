"""Tree drafts: several candidate continuations per row, verified in one forward (SpecInfer, EAGLE-2).

A row's tree is N node slots after its pending token (the root). Node i has a token, a parent
(`parents[i]`: -1 for a child of the root, else a node index < i, so that index order is topological)
and a valid flag (static shapes: a tree smaller than N leaves slots invalid). Verify positions are
numbered t = 0 (the root) and t = i + 1 (node i); node i sits at sequence position L - 1 + depth(i)
(root depth 0) and is written to the cache at index L - 1 + t, a scratch layout: siblings share a
position but not a cache entry. A query attends to the row's prefix and to its own ancestors and
itself only (`ancestors`). A chain of k drafts is the tree parents = [-1, 0, 1, ..., k - 2].

After the verdict the accepted path's entries move to the contiguous positions they stand for
(`compaction`): the node at depth d from its scratch index L - 1 + t to L - 1 + d. Everything else is
past the row's new length, invisible as after a rollback. For a chain every move is in place.

Acceptance (`follow`): from the root, move to the child whose token equals the target's token at the
current node (greedy: its argmax; coupled sampling: argmax(s + G) with G for that position), as
long as one does: siblings hold distinct tokens, so at most one can. The round emits the target's
tokens along the accepted path plus one more, exactly what plain decoding emits.
Rejection sampling (`follow_rejection`) is the seed's multi-draft verification (SpecInfer): at each
node its children are tried one after another, child c accepted with probability
min(1, p'(x_c) / q_c(x_c)) where p' starts as the target's p at the node and becomes
norm(max(0, p' - q_c)) after each rejection; when none is accepted the row emits a draw from p'. With
children drawn i.i.d. from q (a model drafter) or deterministic (q_c one-hot: top-k children, lookup
matches) the emitted tokens follow p exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .acceptance import sample


@dataclass(slots=True)
class TreeShape:
    """The geometry of every row's tree for one verify pass (T = N + 1 positions, t = 0 the root).

    depth [b, T] (root 0), ancestors [b, T, T] bool (u is t or an ancestor of t; everyone has the root),
    parent_t [b, N] the parent's verify position of node i (0 = root), rank [b, N] the node's index among
    its valid siblings, valid [b, N]; max_depth (host) a bound on every node's depth, so that following a
    path takes max_depth steps, not N."""

    depth: torch.Tensor
    ancestors: torch.Tensor
    parent_t: torch.Tensor
    rank: torch.Tensor
    valid: torch.Tensor
    max_depth: int


def tree_shape(parents: torch.Tensor, valid: torch.Tensor, max_depth: int | None = None) -> TreeShape:
    """parents [b, N] (-1 = the root's child), valid [b, N] bool -> TreeShape. A loop over the N node
    slots of small tensor ops (no host sync, no loop over rows). max_depth: a bound on the depth known on
    the host (a TreeSpec's depth); default N, the depth of a chain of every node."""
    b, n = parents.shape
    device = parents.device
    parent_t = (parents + 1).clamp(min=0)  # [b, N]
    depth = torch.zeros(b, n + 1, dtype=torch.long, device=device)
    ancestors = torch.zeros(b, n + 1, n + 1, dtype=torch.bool, device=device)
    ancestors[:, 0, 0] = True
    eye = torch.eye(n + 1, dtype=torch.bool, device=device)
    rows = torch.arange(b, device=device)
    for i in range(n):
        p = parent_t[:, i]
        depth[:, i + 1] = depth[rows, p] + 1
        ancestors[:, i + 1] = ancestors[rows, p] | eye[i + 1]
    same_parent = (parent_t[:, :, None] == parent_t[:, None, :]) & valid[:, None, :]  # [b, N, N]
    earlier = torch.ones(n, n, dtype=torch.bool, device=device).tril(-1)  # j < i
    rank = (same_parent & earlier).sum(-1)
    return TreeShape(depth, ancestors, parent_t, rank, valid, n if max_depth is None else max_depth)


def chain_parents(b: int, k: int, device: torch.device) -> torch.Tensor:
    """The parents [b, k] of a chain of k drafts."""
    return (torch.arange(k, device=device) - 1).expand(b, k).contiguous()


def tree_mask(lengths: torch.Tensor, ancestors: torch.Tensor, kv_len: int, dtype: torch.dtype,
              positions: torch.Tensor | None = None, window: int | None = None) -> torch.Tensor:
    """Additive mask [b, 1, T, kv_len]: query t of row b sees cache index j < lengths[b] (the prefix) and
    the scratch entry lengths[b] + u of every u in ancestors[b, t] ([b, T, W]: a window of W >= T
    entries, the last T of which this forward writes, or the first of them a row has nodes for: a valid node's
    ancestors are among them; earlier ones were written by earlier forwards). With
    a sliding window (and positions [b, T], each query's sequence position) the prefix entries at or before
    its position - window are not seen; its ancestors, closer than any window, are."""
    t, w = ancestors.shape[1], ancestors.shape[2]
    index = torch.arange(kv_len, device=lengths.device)
    rel = index[None, :] - lengths[:, None]  # [b, kv]
    inside = (rel >= 0) & (rel < w)
    nodes = ancestors.gather(2, rel.clamp(0, w - 1)[:, None, :].expand(-1, t, -1))  # [b, T, kv]
    prefix = (rel < 0)[:, None, :].expand(-1, t, -1)
    if window is not None:
        prefix = prefix & (index[None, None, :] > positions[:, :, None] - window)
    allowed = prefix | (inside[:, None, :] & nodes)
    return torch.zeros(allowed.shape, dtype=dtype, device=lengths.device).masked_fill_(
        ~allowed, torch.finfo(dtype).min)[:, None]


def node_noise(gumbel: torch.Tensor, depth: torch.Tensor) -> torch.Tensor:
    """Coupled sampling's noise per verify position: gumbel [b, D + 1, V] for sequence positions
    L .. L + D, depth [b, T] -> [b, T, V]: query t decides position L + depth[t]."""
    return gumbel.gather(1, depth[:, :, None].expand(-1, -1, gumbel.shape[2]).clamp(max=gumbel.shape[1] - 1))


@dataclass(frozen=True, slots=True)
class TreeVerdict:
    """The accepted path of every row: chain_t [b, D + 1] (D = the shape's max_depth) the verify positions
    from the root down the path (entries past num_accepted repeat the last), num_accepted [b] (its depth),
    tokens [b, D + 1] what the row emits: tokens[:, :num_accepted + 1]."""

    chain_t: torch.Tensor
    num_accepted: torch.Tensor
    tokens: torch.Tensor


def follow(target: torch.Tensor, drafts: torch.Tensor, shape: TreeShape) -> TreeVerdict:
    """Greedy and coupled acceptance. target [b, T]: the target's token after each verify position (its
    argmax, or argmax(s + G)); drafts [b, N] the node tokens."""
    b, depth = drafts.shape[0], shape.max_depth
    device = drafts.device
    cur = torch.zeros(b, dtype=torch.long, device=device)
    alive = torch.ones(b, dtype=torch.bool, device=device)
    chain = torch.zeros(b, depth + 1, dtype=torch.long, device=device)
    for d in range(1, depth + 1):
        want = target.gather(1, cur[:, None])  # [b, 1]: the token the target emits after cur
        match = (shape.parent_t == cur[:, None]) & shape.valid & (drafts == want)
        found = match.any(1) & alive
        cur = torch.where(found, match.int().argmax(1) + 1, cur)
        alive &= found
        chain[:, d] = cur
    num_accepted = (chain[:, 1:] != chain[:, :-1]).sum(1)
    return TreeVerdict(chain, num_accepted, target.gather(1, chain))


def follow_rejection(p: torch.Tensor, drafts: torch.Tensor, q_at: torch.Tensor | None, shape: TreeShape,
                     u_accept: torch.Tensor, u_final: torch.Tensor, max_children: int | None = None) -> TreeVerdict:
    """Multi-draft rejection sampling over the tree (the seed's iterative speculative sampling).

    p [b, T, V]: the target's distribution after each verify position; drafts [b, N]; q_at [b, T, V]: the
    distribution the children of each position were drawn from (None: one-hot, deterministic children);
    u_accept [b, N] a uniform per node, u_final [b, D + 1] one per depth (D = shape.max_depth) for the
    emitted draw. Children are tried in rank order; a fixed order is exact for i.i.d. or deterministic
    children.
    """
    b, n = drafts.shape
    depth = shape.max_depth
    device = p.device
    rows = torch.arange(b, device=device)
    children = max_children if max_children is not None else n
    cur = torch.zeros(b, dtype=torch.long, device=device)
    alive = torch.ones(b, dtype=torch.bool, device=device)
    chain = torch.zeros(b, depth + 1, dtype=torch.long, device=device)
    final = torch.zeros(b, dtype=torch.long, device=device)
    for d in range(1, depth + 1):
        residual = p[rows, cur]  # [b, V]: p' at the current node
        moved = torch.zeros(b, dtype=torch.bool, device=device)
        for r in range(children):
            is_child = (shape.parent_t == cur[:, None]) & shape.valid & (shape.rank == r)  # [b, N]
            has = is_child.any(1) & alive & ~moved
            c = is_child.int().argmax(1)  # the child's node index (garbage where not `has`)
            x = drafts[rows, c]
            q_c = q_at[rows, cur] if q_at is not None else torch.nn.functional.one_hot(x, residual.shape[1]).to(residual)
            mass = residual.sum(-1).clamp_min(1e-30)
            accept = has & (u_accept[rows, c] * q_c[rows, x] < residual[rows, x] / mass)
            cur = torch.where(accept, c + 1, cur)
            moved |= accept
            rejected = has & ~accept
            updated = residual_after_rejection(residual, q_c, mass)
            # A rejection leaves mass in max(0, p' - q) unless p' <= q everywhere (measure zero): keep p' then.
            keep = rejected & (updated.sum(-1) > 0)
            residual = torch.where(keep[:, None], updated, residual)
        stop = alive & ~moved
        final = torch.where(stop, sample(residual, u_final[:, d - 1]), final)
        alive &= moved
        chain[:, d] = cur
    # Rows still alive at the last depth accepted a leaf at depth D: their bonus is drawn from p there.
    final = torch.where(alive, sample(p[rows, cur], u_final[:, depth]), final)
    num_accepted = (chain[:, 1:] != chain[:, :-1]).sum(1)
    tokens = torch.cat([drafts, drafts.new_zeros(b, 1)], dim=1).gather(1, (chain[:, 1:] - 1).clamp(min=0))
    tokens = torch.cat([tokens, tokens.new_zeros(b, 1)], dim=1)
    tokens[rows, num_accepted] = final
    return TreeVerdict(chain, num_accepted, tokens)


def residual_after_rejection(residual: torch.Tensor, q: torch.Tensor, mass: torch.Tensor) -> torch.Tensor:
    """p' <- max(0, p' - q) after a child drawn from q was rejected, kept in the scale of `residual`
    (unnormalized, total `mass`) so that no division is needed: [b, V]."""
    return (residual - q * mass[:, None]).clamp_min(0)


def compaction(lengths: torch.Tensor, chain_t: torch.Tensor, num_accepted: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Cache moves that put the accepted path at its positions: (src, dst) [b, D], moving index
    lengths + chain_t[:, d] to lengths + d for d = 1..num_accepted (lengths = entries before the root);
    entries past the path move onto themselves."""
    n = chain_t.shape[1] - 1
    d = torch.arange(1, n + 1, device=chain_t.device)[None, :]
    on_path = d <= num_accepted[:, None]
    src = lengths[:, None] + torch.where(on_path, chain_t[:, 1:], d)
    dst = lengths[:, None] + d
    return src, dst

