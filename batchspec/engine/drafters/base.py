"""The drafter protocol, its policy record, and the drafter that drafts nothing.

Every drafter speaks the same verbs (cf. transformers' CandidateGenerator, made batched):
  admit(slots, prompts, features=None)  new requests now occupy these slots (features: per seat the target's
                                        hidden states of its prompt, [P, F], for a drafter that names
                                        `feature_layers`, when admission prefilled it; None otherwise)
  propose(plan, choice) -> Draft        up to choice.budgets[i] tokens for row i of the plan; rows may
                                        propose 0 (the choice's counts, or before it, for a drafter that
                                        proposes first, the plan's limits: round.py)
  propose_tree(plan, choice, spec) -> Draft  (drafters whose policy says `trees`) a tree per row
  extend(slots, emitted, num_accepted, path)  the tokens each running row emitted this round (a new row's
                                        first token in front), how many drafts it had accepted, and in a
                                        tree round each row's deepest accepted node (None in chains)
  release(slots)                        these requests are done
  learn_pending()                       host work it may put off (a lookup's learning): the verify pass calls it
                                        while the device computes a captured verify, when the host is idle
  packed_forward(chunks, verify_index)  a packed verify forward just ran (drafters that read the target's
                                        hidden states: where its prompt chunks and verify positions are)
and, for the engine's set-up and the controller's prices, bind, draft_seconds, step_times, step_seconds
and lags (the Drafter protocol below says what each takes). It declares a DrafterPolicy: what the
adaptive controller needs to know about it, so that the controller never looks inside a drafter. A row
that proposes nothing costs only its 1-token decode in the verify pass. Drafts are written into the round's buffers (round.py): on the static path every slot,
at fixed addresses, which is what captured steps need.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from ..types import TreeSpec
from ..round import Choice, Draft, Plan, RoundBuffers, RoundShape


@dataclass(frozen=True, slots=True)
class DrafterPolicy:
    """What choosing each round's shape needs to know about a drafter.

    propose_first: proposing k_max tokens costs no more than proposing fewer and the first tokens do not
        depend on k (lookups): propose, then choose the verify width from the proposals on the table.
    bursty: proposals are right or wrong as a whole (a lookup's match) more often than token by token,
        so acceptance is modelled as first-draft acceptance times job-wide continuation rates instead of
        one geometric alpha.
    draft_forwards: each drafted token costs one forward of a draft model.
    catches_up: after rounds without drafting, the next drafted round first feeds the draft the tokens it
        missed, a cost of the plain rounds before and not of that round's k.
    trees: can propose trees (propose_tree).
    priors: proposals carry the drafter's own chance that each row's first draft is right (Draft.priors),
        so a row's worth is known only once it has proposed.
    """

    propose_first: bool = False
    bursty: bool = False
    draft_forwards: bool = False
    catches_up: bool = False
    trees: bool = False
    priors: bool = False


LOOKUP_POLICY = DrafterPolicy(propose_first=True, bursty=True, trees=True)
SUFFIX_POLICY = DrafterPolicy(propose_first=True, bursty=True, trees=True, priors=True)
MODEL_POLICY = DrafterPolicy(draft_forwards=True, catches_up=True, trees=True)


class Drafter(Protocol):
    policy: DrafterPolicy
    feature_layers: tuple[int, ...]  # the target's hidden states it reads (output_hidden_states indices;
    #    EAGLE-3): every target forward hands them out, admission passes the prompts'; () for none

    def admit(self, slots: list[int], prompts: list[list[int]],
              features: list[torch.Tensor] | None = None) -> None: ...
    def propose(self, plan: Plan, choice: Choice) -> Draft: ...
    def extend(self, slots: list[int], emitted: list[list[int]], num_accepted: list[int],
               path: list[int] | None = None) -> None: ...
    def release(self, slots: list[int]) -> None: ...
    def learn_pending(self) -> None: ...
    def draft_seconds(self, k: int, kv_len: int) -> float: ...  # device time of proposing k tokens (static steps)
    def step_times(self) -> list[tuple[int, float]]: ...  # the last round's drafting forwards: (tokens, seconds)
    #    each, eager (what a packed round's cost model prices drafts by); read once
    def step_seconds(self, rows: int, repeats: int, tokens: int | None = None) -> float | None: ...  # one eager
    #    drafting forward over `rows` rows of one token (or of `tokens` in all, feeding what caches lack), timed
    #    before any row is admitted (startup_costs.py); None: no forwards, or none of that size
    def lags(self, slots: list[int], lengths: list[int]) -> list[int]: ...  # per row (its sequence's length),
    #    the tokens its draft cache lacks, which its next drafting forward feeds before its first draft
    def bind(self, shapes: list[RoundShape], target, state, buffers, acceptor) -> None: ...  # the generator's device
    #    state, given once at start (a drafter with static steps declares them then)
    def packed_forward(self, chunks: list[tuple[int, int, int, int]], verify_index: torch.Tensor | None) -> None: ...
    #    a packed forward just ran (called when the drafter names feature_layers): it wrote these prompt chunks
    #    (slot, start, count, at: its first token's index in the forward, whose hidden states the target's
    #    runner holds) and verify_index [b, W] gives each deciding row's verify positions in it (None: no row
    #    decided); a drafter that reads the hidden states (EAGLE) takes the prompt in from there
    # Drafters whose policy says `trees`:
    #   propose_tree(plan, choice, spec) -> Draft  a tree per row in spec.nodes node slots (the verify width is
    #                                              spec.nodes + 1); choice.budgets[i] bounds row i's depth


def host_draft(buffers: RoundBuffers, drafts: list[list[int]]) -> Draft:
    """Proposals made on the host -> the round's draft buffers (one copy each for tokens and counts), the
    width trimmed to the longest proposal."""
    counts = [len(d) for d in drafts]
    width = max(counts, default=0)
    tokens = buffers.put_drafts([d + [0] * (width - len(d)) for d in drafts], len(drafts), width)
    return Draft(tokens=tokens, num_tokens=buffers.put_num_drafts(counts), host_num=counts,
                 host_tokens=[list(d) for d in drafts])


def empty_draft(buffers: RoundBuffers, b: int) -> Draft:
    return Draft(tokens=buffers.drafts[:b, :0], num_tokens=buffers.put_num_drafts([0] * b), host_num=[0] * b,
                 host_tokens=[[] for _ in range(b)])


def host_tree(buffers: RoundBuffers, continuations: list[list[list[int]]], spec: TreeSpec) -> Draft:
    """Per row, up to `branching` candidate continuations (host lists) -> their prefix tree in the round's
    buffers, shared prefixes merged (a node is kept iff no earlier candidate has the same prefix up to it), in
    depth-major order (parents first, siblings in their candidates' order): a row's nodes are its first node
    slots, so that a packed verify reads only those (Draft.host_num)."""
    m, depth = spec.branching, spec.depth
    rows = []
    for row in continuations:
        row = (row + [[]] * m)[:m]
        tokens, parents = [], []
        canonical: dict[tuple[int, ...], int] = {}  # a prefix -> the node that stands for it
        for d in range(depth):
            for seq in row:
                prefix = tuple(seq[: d + 1])
                if len(seq) <= d or prefix in canonical:
                    continue
                canonical[prefix] = len(tokens)
                parents.append(canonical[prefix[:-1]] if d > 0 else -1)
                tokens.append(seq[d])
        rows.append((tokens, parents))
    return host_tree_nodes(buffers, rows, spec)


def host_tree_nodes(buffers: RoundBuffers, rows: list[tuple[list[int], list[int]]], spec: TreeSpec) -> Draft:
    """Per row a tree made on the host as (tokens, parents) in topological order (a parent before its
    children, -1 for the root's) of at most spec.nodes nodes -> the round's buffers, the rest invalid."""
    n, b = spec.nodes, len(rows)
    tokens = [t + [0] * (n - len(t)) for t, _ in rows]
    parents = [p + [-1] * (n - len(p)) for _, p in rows]
    valid = [[1] * len(t) + [0] * (n - len(t)) for t, _ in rows]
    draft_tokens = buffers.put_drafts(tokens, b, n)
    valid_t = buffers.put_tree(parents, valid, b, n)
    counts = [len(t) for t, _ in rows]
    return Draft(tokens=draft_tokens, num_tokens=buffers.put_num_drafts(counts), host_num=counts,
                 parents=buffers.parents[:b, :n], valid=valid_t, spec=spec)


class HostDrafter:
    """What a drafter that proposes on the host (no draft forwards, no device state) says to the engine's
    device-side verbs."""

    feature_layers: tuple[int, ...] = ()  # it reads no hidden states of the target

    def draft_seconds(self, k, kv_len):
        return 0.0  # host work whatever k is: part of the round's overhead

    def step_times(self):
        return []  # no drafting forwards

    def step_seconds(self, rows, repeats, tokens=None):
        return None  # no drafting forwards

    def lags(self, slots, lengths):
        return [0] * len(slots)  # no cache to feed

    def bind(self, shapes, target, state, buffers, acceptor):
        pass  # no device state

    def packed_forward(self, chunks, verify_index):
        pass  # it does not read the target's hidden states

    def learn_pending(self):
        pass  # nothing put off (the lookups' LazyLookup overrides this)


class NoDrafter(HostDrafter):
    """Plain decoding on the same machinery: every round verifies just the pending token."""

    policy = DrafterPolicy()

    def admit(self, slots, prompts, features=None):
        pass

    def propose(self, plan: Plan, choice: Choice) -> Draft:
        return empty_draft(plan.buffers, len(plan.rows))

    def extend(self, slots, emitted, num_accepted, path=None):
        pass

    def release(self, slots):
        pass
