"""The device side of a round's verdict, as static-shape steps: noise, acceptance and its commits.

`Acceptor` owns no model. Per round it makes the coupled noise (`noise`), lays out a tree's geometry
(`shape_tree`), and runs the acceptance (`accept`): the verdict (greedy, coupled or rejection; chain or
tree; verdict.py) and its commits on the device: the target's cache lengths (and a tree's compaction),
the sequences, the repetition penalty's context, then everything the host needs packed in one buffer,
whose read is the round's one host sync. At admission it draws each new request's first token from the
prefill's last logits (`first_tokens`). On the static path each of these is one step of the generator's
StepGraphs (captured on a GPU); eagerly they run on the round's rows only.
"""

from __future__ import annotations

from functools import partial

import torch

from .acceptance import sample
from .grammar.grammar import Grammars, apply_masks
from .model.graphs import StepGraphs
from .model.host_device import HostBuffer, LaunchCounter, host_lists
from .noise import STREAM_RESAMPLE, gumbel_noise, uniforms
from .round import Draft, Plan, Round, RoundBuffers, RoundShape
from .model.runner import ModelRunner
from .sampling import RowSampling, SamplingParams, choose, logprobs_at, probs_of, row_transforms, scores
from .slots import SlotState
from .stops import StopRules
from .tree import TreeShape, compaction, tree_shape
from .verdict import PACKED_FIELDS, RoundOutcome, decide, decide_tree


class Acceptor:
    """logprobs: the most alternatives a row's tokens get with their log-probabilities (None: off)."""

    def __init__(self, runner: ModelRunner, state: SlotState, buffers: RoundBuffers, *, sampling: SamplingParams,
                 stops: StopRules, graphs: StepGraphs, counter: LaunchCounter | None = None,
                 logprobs: int | None = None, grammars: Grammars | None = None):
        self.runner, self.state, self.buffers = runner, state, buffers
        self.sampling, self.stops, self.graphs, self.counter = sampling, stops, graphs, counter
        self.grammars = grammars  # structured output: a constrained row's first token is drawn under its grammar
        self.device = runner.device
        self.num_slots = runner.num_slots
        self._new = torch.zeros(self.num_slots, dtype=torch.bool, device=self.device)  # static admission mask
        self._new_in = HostBuffer((self.num_slots,), self.device, into=self._new)
        self.k = logprobs
        # [B, E]: the verify positions each row's emitted tokens were decided at (a tree's accepted path;
        # 0, 1, .. for a chain), for a drafter that reads the target's features along it (EAGLE).
        self.path_out = torch.zeros(self.num_slots, buffers.verdict.shape[1] - PACKED_FIELDS, dtype=torch.long,
                                    device=self.device)
        self._lp = self._first_lp = None
        if logprobs is not None:  # [B, (1 + positions) * block]: the token fed first, then each emitted one
            block = 1 + 2 * logprobs
            positions = buffers.verdict.shape[1] - PACKED_FIELDS
            self._lp = torch.zeros(self.num_slots, (1 + positions) * block, device=self.device)
            self._first_lp = torch.zeros(self.num_slots, block, device=self.device)  # drawn at admission
        # The path is chosen once: on the static path the noise, a tree's geometry and the first tokens are steps
        # over every slot (captured on a GPU); eagerly they run on the round's rows.
        captured = graphs.static
        self._noise_of = self._slot_noise if captured else self._row_noise
        self._tree_of = self._slot_tree if captured else self._row_tree
        self._first_tokens = self._slot_first_tokens if captured else self._row_first_tokens
        self._step = graphs.run if captured else _call  # the acceptance: a step, or eagerly a call

    def _rows(self, rows: torch.Tensor) -> RowSampling | None:
        """The rows' own sampling transforms (None: every row samples, or decodes greedily, as the job does)."""
        return row_transforms(self.sampling, self.state.sampling, rows)

    # ---- noise ------------------------------------------------------------------------------------

    def noise(self, plan: Plan, width: int, drafts: list[int] | None = None) -> torch.Tensor:
        """Coupled sampling's Gumbel noise for positions L .. L + width - 1 of each row: [b, width, V] (on the
        static path every slot's at the buffer's full width); drafts: see _row_noise."""
        return self._noise_of(plan, width, drafts)

    def _slot_noise(self, plan: Plan, width: int, drafts: list[int] | None = None) -> torch.Tensor:
        """The static path's: every slot's noise at the buffer's full width, one step a round."""
        out = self.buffers.gumbel
        self.graphs.run(("noise",), self._noise_step, (out,))
        return out

    def _row_noise(self, plan: Plan, width: int, drafts: list[int] | None = None) -> torch.Tensor:
        """The round's rows' noise [b, width, V]. drafts [b]: the most drafts each row verifies, or None; with it,
        a row that drafts nothing gets noise at its first position only, the rest of its [width, V] left unset
        (the verdict never reads past a row's drafts): a packed round at batch 8 where one row drafts had drawn
        8 x 2 x V values for the 9 positions it decides, and coupled noise was 3.5-3.7% of a lookup's job against
        2.7% of drafter none's (SmolLM2, T = 0.7; 2026-12-04)."""
        if drafts is None or width == 1 or min(drafts) > 0:
            return self._noise(plan.rows_t, plan.lengths_t, width)
        out = torch.empty(len(drafts), width, self.runner.vocab_size, device=self.device)
        out[:, :1] = self._noise(plan.rows_t, plan.lengths_t, 1)
        drafting = [i for i, n in enumerate(drafts) if n > 0]
        if drafting:
            index = torch.tensor(drafting, device=self.device)
            out[index, 1:] = self._noise(plan.rows_t[index], plan.lengths_t[index] + 1, width - 1)
        return out

    def _noise(self, rows: torch.Tensor, lengths: torch.Tensor, width: int) -> torch.Tensor:
        positions = lengths[:, None] + torch.arange(width, device=self.device)
        return gumbel_noise(self.state.noise_keys[rows], positions, self.runner.vocab_size)

    def _noise_step(self, out: torch.Tensor) -> None:
        lengths = self.runner.lengths[: self.num_slots] + 1
        out.copy_(self._noise(self.runner.slot_index, lengths, out.shape[1]))

    # ---- trees ------------------------------------------------------------------------------------

    def shape_tree(self, draft: Draft, depth: int) -> TreeShape:
        """The geometry of a round's drafted trees (tree_shape) of at most `depth`, in the buffers on the static
        path."""
        return self._tree_of(draft, depth)

    @staticmethod
    def _row_tree(draft: Draft, depth: int) -> TreeShape:
        return tree_shape(draft.parents, draft.valid, depth)

    def _slot_tree(self, draft: Draft, depth: int) -> TreeShape:
        """The static path's: in the buffers, one step."""
        tree = self.buffers.tree
        width = draft.parents.shape[1]
        view = TreeShape(tree.depth[:, : width + 1], tree.ancestors[:, : width + 1, : width + 1],
                         tree.parent_t[:, :width], tree.rank[:, :width], draft.valid, depth)
        self.graphs.run(("tree", width, depth), partial(self._tree_step, max_depth=depth),
                        (draft.parents, draft.valid, view.depth, view.ancestors, view.parent_t, view.rank))
        return view

    @staticmethod
    def _tree_step(parents, valid, depth, ancestors, parent_t, rank, *, max_depth: int) -> None:
        shape = tree_shape(parents, valid, max_depth)
        depth.copy_(shape.depth)
        ancestors.copy_(shape.ancestors)
        parent_t.copy_(shape.parent_t)
        rank.copy_(shape.rank)

    # ---- acceptance -------------------------------------------------------------------------------

    def accept(self, round: Round, logits: torch.Tensor) -> RoundOutcome:
        """logits [b, W, V] of the round's verify pass -> the outcome on the host, after committing on the
        device. The one host sync of the round."""
        draft, width, tree = round.draft, round.shape.width, round.tree
        emitted = tree.max_depth + 1 if tree else width
        out = self.buffers.verdict[: len(round.plan.rows), : PACKED_FIELDS + emitted]
        lp = self._lp[: len(round.plan.rows), : (1 + emitted) * (1 + 2 * self.k)] if self.k is not None else None
        args = (logits, draft.tokens, draft.num_tokens, out, lp, round.gumbel,
                draft.probs if tree is None else draft.q_at)
        if tree is not None:
            args += (tree.depth, tree.ancestors, tree.parent_t, tree.rank, tree.valid)
        body = partial(self._accept_step, rows=round.plan.rows_t, max_depth=tree.max_depth if tree else 0,
                       spec=draft.spec)
        self._step(("accept", width, tree is not None), body, args)
        packed, logprobs = host_lists(out, lp, counter=self.counter)
        return RoundOutcome.unpack(packed, tree is not None, logprobs, self.k or 0)

    def _accept_step(self, logits, drafts, num_drafts, out, lp, gumbel, probs, depth=None, ancestors=None,
                     parent_t=None, rank=None, valid=None, *, rows, max_depth, spec) -> None:
        """The acceptance over rows [b]: logits [b, W, V], drafts [b, W - 1], num_drafts [b], out the packed
        verdict [b, PACKED_FIELDS + E] (E: the tokens a row may emit), lp [b, (1 + E) * (1 + 2k)] the
        logprobs of the token fed first and of each emitted one (None: off); gumbel [b, >= W, V] (coupled)
        and probs (a draft model's q under rejection: [b, W - 1, V] for a chain, q_at [b, W, V] for a tree)
        or None; a tree's geometry."""
        state, runner = self.state, self.runner
        lengths = runner.lengths[rows] + 1  # L: the pending token sits at L - 1 (not yet cached)
        presence = state.presence[rows] if state.presence is not None else None
        common = dict(sampling=self.sampling, stops=self.stops, lengths=lengths, presence=presence,
                      noise_keys=state.noise_keys[rows], gumbel=gumbel, rows=self._rows(rows))
        if depth is None:
            verdict = decide(logits, Draft(drafts, num_drafts, probs), **common)
        else:
            shape = TreeShape(depth, ancestors, parent_t, rank, valid, max_depth)
            draft = Draft(drafts, num_drafts, parents=None, valid=valid, q_at=probs, spec=spec)
            verdict = decide_tree(logits, draft, shape, **common)
            # The accepted path's keys and values go to the positions they stand for (tree.py).
            src, dst = compaction(lengths - 1, verdict.path, verdict.num_accepted)
            runner.compact(rows, src, dst)
        pending = state.tokens[rows, lengths - 1]
        index = torch.arange(verdict.tokens.shape[1], device=self.device)[None, :]
        state.write(rows, lengths, verdict.tokens)  # past num_emit: stale
        # The pending token and the accepted drafts stay cached; idle slots ride along from 0 again.
        runner.set_lengths(rows, torch.where(state.busy[rows], lengths - 1 + verdict.num_emit, 0))
        if presence is not None:
            emitted = (index < verdict.num_emit[:, None]).to(torch.int32)
            seen = torch.zeros_like(presence, dtype=torch.int32).scatter_add_(1, verdict.tokens, emitted)
            state.presence[rows] = presence | (seen > 0)
        verdict.pack(out, pending)
        along = verdict.path if verdict.path is not None else index.expand(verdict.tokens.shape[0], -1)
        self.path_out[: along.shape[0], : along.shape[1]] = along
        if verdict.path is not None:
            # A tree's verify width passes its path: past it the path's last entry, so that a reader of this round's
            # width (EAGLE's stash) never meets a wider round's positions (a tree of more nodes before it).
            self.path_out[: along.shape[0], along.shape[1]:] = along[:, -1:]
        if lp is not None:
            block = 1 + 2 * self.k
            lp[:, :block] = self._first_lp[rows]
            lp[:, block:] = verdict.logprobs(self.k).flatten(1)

    # ---- admission --------------------------------------------------------------------------------

    def first_tokens(self, rows: list[int], logits: torch.Tensor) -> tuple | None:
        """Draw each new row's first token (position len(prompt)) from its prefill's last logits, as `generate`
        does, and write it into the row's sequence (eagerly: logits [n, V] of `rows`; on the static path [B + 1,
        V] by slot)."""
        return self._first_tokens(rows, logits)

    def _row_first_tokens(self, rows: list[int], logits: torch.Tensor) -> tuple:
        """The tokens (and their logprobs blocks, or None) come back to the host (a sync; free on a CPU)."""
        self._mask_first(rows, list(range(len(rows))), logits)
        rows_t = torch.tensor(rows, device=self.device)
        tokens, lp = self._first(rows_t, self.runner.lengths[rows_t], logits)
        return tuple(host_lists(tokens, lp, counter=self.counter))

    def _slot_first_tokens(self, rows: list[int], logits: torch.Tensor) -> None:
        """One step over every slot; nothing comes back: the next round's verdict carries them (its `pending`)."""
        self._mask_first(rows, rows, logits)
        chosen = set(rows)
        new = self._new_in.put([slot in chosen for slot in range(self.num_slots)])
        self.graphs.run(("first",), self._first_step, (logits, new))

    def _mask_first(self, rows: list[int], at: list[int], logits: torch.Tensor) -> None:
        """Constrained new rows: their first token's logits (row i's at logits[at[i]]) masked by their grammar's
        start, in place."""
        index = self.grammars.constrained(rows) if self.grammars is not None else []
        if not index:
            return
        slots = [rows[i] for i in index]
        where = torch.tensor([at[i] for i in index], device=self.device)
        masked = logits[where]
        apply_masks(masked, self.grammars.masks(slots, [[] for _ in slots], 1)[:, 0].to(self.device))
        logits[where] = masked

    def _first(self, rows: torch.Tensor, lengths: torch.Tensor, logits: torch.Tensor):
        """rows [n], lengths [n] (= prompt lengths: the first token's position), logits [n, V] -> tokens [n],
        written at tokens[row, length], and their logprobs blocks [n, 1 + 2k] (None: off)."""
        state, sampling = self.state, self.sampling
        presence = state.presence[rows] if state.presence is not None else None
        rows_sampling = self._rows(rows)
        s = scores(logits, sampling, presence, rows_sampling)
        if sampling.greedy or sampling.coupled:  # the noise any pass would use for position len(prompt)
            noise = self._noise(rows, lengths, 1)[:, 0] if sampling.coupled else None
            first = choose(s, noise, rows_sampling)
        else:  # the same noise a verify pass would use to decide position len(prompt)
            u = uniforms(state.noise_keys[rows], lengths[:, None], STREAM_RESAMPLE)[:, 0]
            first = sample(probs_of(s, rows_sampling), u)
        state.write(rows, lengths, first[:, None])
        if presence is not None:
            state.presence[rows, first] = True
        lp = logprobs_at(s[:, None], first[:, None], self.k)[:, 0] if self.k is not None else None
        return first, lp

    def _first_step(self, logits: torch.Tensor, new: torch.Tensor) -> None:
        rows = self.runner.slot_index
        lengths = self.runner.lengths[: self.num_slots]
        before = self.state.tokens[rows, lengths]
        presence = self.state.presence.clone() if self.state.presence is not None else None
        first, lp = self._first(rows, lengths, logits[: self.num_slots])
        # Only the new rows keep what was drawn: the others get back what they held.
        self.state.write(rows, lengths, torch.where(new, first, before)[:, None])
        if presence is not None:
            self.state.presence.copy_(torch.where(new[:, None], self.state.presence, presence))
        if lp is not None:
            self._first_lp.copy_(torch.where(new[:, None], lp, self._first_lp))

    # ---- at start ---------------------------------------------------------------------------------

    def declare_steps(self, shapes: list[RoundShape], trees: dict[int, TreeShape]) -> None:
        """Declare the static steps rounds may run (captured at start in cuda_graphs mode)."""
        b = self.buffers
        if b.gumbel is not None:
            self.graphs.declare(("noise",), self._noise_step, (b.gumbel,))
        self.graphs.declare(("first",), self._first_step, (self.runner.static_prefill.last_logits(), self._new))
        for shape in shapes:
            width = shape.width
            out = b.verdict[:, : PACKED_FIELDS + shape.depth + 1]
            logits = self.runner.static_steps.output(width)
            lp = self._lp[:, : (1 + shape.depth + 1) * (1 + 2 * self.k)] if self.k is not None else None
            if shape.tree is None:
                probs = b.probs[:, : width - 1] if b.probs is not None else None
                args = (logits, b.drafts[:, : width - 1], b.num_drafts, out, lp, b.gumbel, probs)
                body = partial(self._accept_step, rows=self.runner.slot_index, max_depth=0, spec=None)
                self.graphs.declare(("accept", width, False), body, args, size=width)
                continue
            n, depth = shape.tree.nodes, shape.tree.depth
            tree = trees[width]
            self.graphs.declare(("tree", n, depth), partial(self._tree_step, max_depth=depth),
                                (b.parents[:, :n], b.valid[:, :n], tree.depth, tree.ancestors, tree.parent_t, tree.rank))
            q_at = b.q_at[:, : n + 1] if b.q_at is not None else None
            args = (logits, b.drafts[:, :n], b.num_drafts, out, lp, b.gumbel, q_at, tree.depth, tree.ancestors,
                    tree.parent_t, tree.rank, b.valid[:, :n])
            body = partial(self._accept_step, rows=self.runner.slot_index, max_depth=depth, spec=shape.tree)
            self.graphs.declare(("accept", width, True), body, args, size=width)


def _call(key, fn, args: tuple) -> None:
    fn(*args)
