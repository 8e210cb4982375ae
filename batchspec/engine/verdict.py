"""A verify pass's logits and the drafts -> the round's Verdict (device) -> its RoundOutcome (host).

Per row, a round emits its accepted drafts and then one more token from the target (recovered at the
first rejection, or bonus after the last draft; see sampling.py), cut after the first EOS among them.
`Verdict.pack` puts everything the host needs in one buffer: reading it is the round's one host sync.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .round import Draft
from .acceptance import verify_greedy, verify_sampling
from .noise import STREAM_ACCEPT, STREAM_RESAMPLE, uniforms
from .sampling import RowSampling, SamplingParams, choose, growing_presence, logprobs_at, probs_of, scores
from .stops import StopRules
from .tree import TreeShape, follow, follow_rejection, node_noise

STREAM_TREE_ACCEPT = 5  # the uniforms that decide a tree's nodes under rejection sampling


@dataclass(frozen=True, slots=True)
class RoundOutcome:
    """A round's verdict on the host, one entry per row of the round."""

    emitted: list[list[int]]  # the tokens each row emits (accepted drafts + one, cut after an EOS)
    num_accepted: list[int]  # drafts the target agreed with (before any EOS cut)
    num_drafts: list[int]  # drafts the row proposed (a tree: its nodes)
    hit_eos: list[bool]  # the emitted tokens end with an EOS
    pending: list[int]  # the token each row fed first (the one drawn at admission, for a new row)
    last_node: list[int] | None = None  # a tree round: the verify position of each row's deepest accepted node
    depth: list[int] | None = None  # a tree round: the depth of each row's deepest node (its draft positions)
    logprobs: list[list[list[float]]] | None = None  # per row, per emitted token: [logprob, k best, their ids]
    pending_logprobs: list[list[float]] | None = None  # per row: the same for the token fed first

    @classmethod
    def unpack(cls, packed: list[list[int]], tree: bool, logprobs: list[list[float]] | None = None,
               k: int = 0) -> "RoundOutcome":
        """Rows of `Verdict.pack` and of its logprobs buffer (read to the host) -> the outcome."""
        f = PACKED_FIELDS
        blocks = None
        if logprobs is not None:
            size = 1 + 2 * k
            blocks = [[row[j : j + size] for j in range(0, len(row), size)] for row in logprobs]
        return cls(
            logprobs=[b[1 : 1 + row[0]] for b, row in zip(blocks, packed)] if blocks else None,
            pending_logprobs=[b[0] for b in blocks] if blocks else None,
            emitted=[row[f : f + row[0]] for row in packed],
            num_accepted=[row[1] for row in packed],
            hit_eos=[bool(row[2]) for row in packed],
            num_drafts=[row[3] for row in packed],
            last_node=[row[4] for row in packed] if tree else None,
            depth=[row[5] for row in packed] if tree else None,
            pending=[row[6] for row in packed],
        )


PACKED_FIELDS = 7  # num_emit, num_accepted, hit_eos, num_drafts, last_node, depth, pending


@dataclass(frozen=True, slots=True)
class Verdict:
    """A round's verdict on the device, [b] per row unless noted."""

    tokens: torch.Tensor  # [b, T]: the target's token at each position; row i emits tokens[i, :num_emit[i]]
    num_accepted: torch.Tensor
    num_emit: torch.Tensor
    hit_eos: torch.Tensor  # bool
    num_drafts: torch.Tensor
    path: torch.Tensor | None = None  # [b, T] a tree round's accepted path (verify positions from the root)
    depth: torch.Tensor | None = None  # [b] a tree round: the depth of each row's deepest valid node
    scores: torch.Tensor | None = None  # [b, T, V] the scores each position's token was chosen from

    def logprobs(self, k: int) -> torch.Tensor:
        """[b, E, 1 + 2k]: the emitted tokens' log-probabilities (and the k best), position by position
        (E = tokens' width; a tree's tokens were decided at the positions along its path)."""
        s = self.scores
        if self.path is not None:
            s = s.gather(1, self.path[:, :, None].expand(-1, -1, s.shape[-1]))
        return logprobs_at(s, self.tokens, k)

    def pack(self, out: torch.Tensor, pending: torch.Tensor) -> None:
        """Everything the host needs from the round into out [b, PACKED_FIELDS + T] (one copy to the host
        then): the fields (RoundOutcome.unpack), then the tokens; pending [b] the token fed first."""
        last = self.path.gather(1, self.num_accepted[:, None])[:, 0] if self.path is not None else self.num_emit
        depth = self.depth if self.depth is not None else self.num_emit
        out[:, :PACKED_FIELDS] = torch.stack([self.num_emit, self.num_accepted, self.hit_eos.long(), self.num_drafts,
                                              last, depth, pending], dim=1)
        out[:, PACKED_FIELDS : PACKED_FIELDS + self.tokens.shape[1]] = self.tokens


def decide(logits: torch.Tensor, draft: Draft, *, sampling: SamplingParams, stops: StopRules,
           lengths: torch.Tensor, presence: torch.Tensor | None, noise_keys: torch.Tensor,
           gumbel: torch.Tensor | None = None, rows: RowSampling | None = None) -> Verdict:
    """logits [b, T, V]: the target after [pending token, d_1 .. d_{T-1}] of each row; lengths [b]: each
    row's sequence length L, so position t of the pass decides sequence position L + t; presence [b, V]
    (repetition penalty) and noise_keys [b] of the rows; gumbel [b, >= T, V] the coupled noise of
    positions L .. (coupled sampling only); rows: each row's sampling transforms (None: the job's).

    Greedy and coupled sampling decide alike: the target's own token at every position (its argmax, or
    argmax(s + G)), and a draft is accepted iff it equals that token."""
    drafts, num_drafts = draft.tokens, draft.num_tokens
    width = logits.shape[1]
    grown = growing_presence(presence, drafts, width) if presence is not None else None
    s = scores(logits, sampling, grown, rows)
    if sampling.greedy or sampling.coupled:
        target = choose(s, gumbel[:, :width] if gumbel is not None else None, rows)
        tokens, num_accepted = verify_greedy(target, drafts, num_drafts)
    else:
        p = probs_of(s, rows)
        positions = lengths[:, None] + torch.arange(width, device=logits.device)  # position each token decides
        u_accept = uniforms(noise_keys, positions[:, :-1], STREAM_ACCEPT)
        u_resample = uniforms(noise_keys, positions, STREAM_RESAMPLE)
        tokens, num_accepted = verify_sampling(p, drafts, num_drafts, draft.probs, u_accept, u_resample)
    num_emit, hit_eos = stops.cut_at_eos(tokens, num_accepted)
    return Verdict(tokens, num_accepted, num_emit, hit_eos, num_drafts, scores=s)


def tree_presence(base: torch.Tensor, drafts: torch.Tensor, shape: TreeShape) -> torch.Tensor:
    """The repetition penalty's context at each verify position of a tree: base [b, V] | the tokens of
    the position's ancestors (itself included, the root excluded: it is in base) -> [b, T, V] bool."""
    b, vocab = base.shape
    onehot = torch.zeros(b, drafts.shape[1], vocab, dtype=torch.float32, device=base.device)
    onehot.scatter_(2, drafts[:, :, None].clamp(0, vocab - 1), 1.0)
    along = torch.bmm(shape.ancestors[:, :, 1:].float(), onehot)  # [b, T, V]
    return base[:, None, :] | (along > 0)


def decide_tree(logits: torch.Tensor, draft: Draft, shape: TreeShape, *, sampling: SamplingParams,
                stops: StopRules, lengths: torch.Tensor, presence: torch.Tensor | None, noise_keys: torch.Tensor,
                gumbel: torch.Tensor | None = None, rows: RowSampling | None = None) -> Verdict:
    """decide() for a tree round: logits [b, N + 1, V] after the root and every node (tree.py).
    Greedy and coupled sampling follow the child equal to the target's own token (coupled: with the
    noise of the position each query decides, L + its depth); rejection sampling runs the multi-draft
    verification with the children's q (drawn children) or one-hot q (deterministic children)."""
    drafts = draft.tokens
    grown = tree_presence(presence, drafts, shape) if presence is not None else None
    s = scores(logits, sampling, grown, rows)
    if sampling.greedy or sampling.coupled:
        noise = node_noise(gumbel, shape.depth) if gumbel is not None else None
        verdict = follow(choose(s, noise, rows), drafts, shape)
    else:
        p = probs_of(s, rows)
        # One uniform per node: (its position, its rank among siblings) is unique on any path; cousins
        # may share one, but a round never decides two nodes of one depth.
        counter = (lengths[:, None] + shape.depth[:, 1:] - 1) * 1024 + shape.rank
        u_accept = uniforms(noise_keys, counter, STREAM_TREE_ACCEPT)
        u_final = uniforms(noise_keys, lengths[:, None] + torch.arange(shape.max_depth + 1, device=logits.device),
                           STREAM_RESAMPLE)
        verdict = follow_rejection(p, drafts, draft.q_at, shape, u_accept, u_final,
                                   max_children=draft.spec.branching)
    num_emit, hit_eos = stops.cut_at_eos(verdict.tokens, verdict.num_accepted)
    depth = torch.where(shape.valid, shape.depth[:, 1:], 0).amax(dim=1)  # [b]: how deep each row's tree goes
    return Verdict(verdict.tokens, verdict.num_accepted, num_emit, hit_eos, draft.num_tokens, verdict.chain_t, depth,
                   scores=s)
