"""Structured output on the host: each constrained row's grammar matcher (llguidance), the masks of a round's
verify positions, the continuation a grammar forces, and the advance by exactly the emitted tokens.

Why llguidance (tools/grammar_libs.py, SmolLM2's 49,152-token vocabulary, 2 CPU cores): a JSON schema
compiles in 0.45 ms (xgrammar 4.7 ms), a mask and an advance take 0.016 ms a token (xgrammar 0.004 ms:
both are noise next to a round), and it installs in 7.5 MB with no dependencies (xgrammar pulls in
triton, 1 GB). It also has what speculation needs: `validate_tokens`, `rollback`, forced bytes.

A row's matcher consumes only emitted tokens and never rolls back. Whatever looks ahead of them (a round's
masks, how much of a proposal the grammar takes, the continuation it forces) works on a copy of it
(`deep_copy`: 2 us, 0.1 ms after 1,000 tokens): llguidance 1.9.1 can leave a matcher wrong after `rollback` over tokens past
which it computed a mask (tests/test_grammar_state.py: with `"a":{"` emitted after a draft `":["` was
masked and rolled back, the mask is that of a string inside an array; SmolLM2's greedy output under a
JSON schema then changed with the drafter). A round's masks are those of the states after each prefix of
the row's drafts: verify position t is masked by the grammar after the pending token and drafts 1..t. A
draft the grammar refuses needs no cutting for exactness: its probability under the masked distribution is
0, so acceptance stops before it, and the masks past it (left all-allowed) are never read.

A row's grammar work per token is bounded by llguidance's step limits, which count work, not time, so a
row ends at the same token on every machine and run: a mask step whose lexer passes STEP_LEXER_FUEL or
whose parser passes STEP_MAX_ITEMS puts the matcher in an error state whose mask allows only an EOS. The
position is recorded, and the row ends with that error at the advance that reaches it, keeping the output
before it; the other rows run on.
"""

from __future__ import annotations

import time
from collections import OrderedDict

import torch

from ..types import Constraint
from .grammar_text import grammar_text, one_line
from ..phases import GRAMMAR_COMPILE, GRAMMAR_MASK, Timers
from .schema_finite import no_finite_instance

CACHED_GRAMMARS = 256  # compiled grammars kept by content (a job with a schema per row reuses few)
# llguidance's defaults, stated: its lexer runs about 14k fuel/ms and its parser 20k items/ms, so one mask
# step of one row is bounded by about 14 + 2.5 ms.
STEP_LEXER_FUEL = 200_000
STEP_MAX_ITEMS = 50_000
LIMIT_ERRORS = {  # in llguidance's first line -> what it means
    "lexer error: too many expressions constructed": "the lexer's work for one token passed its limit ({fuel})",
    "Too many items": "the parser's work for one token passed its limit ({items})",
}


def limit_error(error: str) -> str:
    """llguidance's error as one plain line: a work limit named with its value."""
    first = (error or "").strip().splitlines()[:1] or ["the grammar refused the output"]
    for start, meaning in LIMIT_ERRORS.items():
        if start in first[0]:
            return meaning.format(fuel=f"lexer fuel {STEP_LEXER_FUEL:,} a step",
                                  items=f"{STEP_MAX_ITEMS:,} Earley items a step") + \
                ": simplify the constraint"
    return one_line(first[0])


def _first_mask_problem(constraint: Constraint, matcher) -> str | None:
    """What stops the grammar from giving a first token (found before a row takes a slot, on a copy), or None:
    a schema that only refers to itself compiles, then fails at its first mask with a dump of the parser."""
    probe = matcher.deep_copy()
    probe.compute_bitmask()
    if not probe.is_error():
        return None
    error = probe.get_error().strip().splitlines()[0]
    reason = "it allows no first token (a definition that refers only to itself?)" if error == "NoExtensionBias" \
        else limit_error(error)
    return f"{constraint.kind}: no output can match it: {reason}"


class Grammars:
    """The constrained rows' matchers, by slot. tokenizer: the target's (a fast tokenizer); vocab_size: the
    target's logits width (ids past the tokenizer's are never allowed); eos_ids: the ids that end a row, allowed
    only where the grammar accepts. llguidance's tokenizer view (about 0.5 s for a 49k vocabulary) is built
    when the first constraint arrives."""

    def __init__(self, tokenizer, *, vocab_size: int, eos_ids: list[int], timers: Timers | None = None):
        self.tokenizer, self.vocab_size, self.eos_ids = tokenizer, vocab_size, list(eos_ids)
        self.rows: dict[int, object] = {}  # slot -> its llguidance.LLMatcher, over the row's emitted tokens
        self.failed: dict[int, tuple[int, str]] = {}  # slot -> (verify position, error) of a mask past a limit
        self._env = None
        self._outside: list[int] = []  # EOS ids past the tokenizer's vocabulary
        self._other_eos: list[int] = []  # EOS ids but llguidance's first
        self._compiled: OrderedDict[Constraint, object] = OrderedDict()  # -> a fresh matcher, or an error text
        self.timers = timers or Timers()  # seconds compiling (GRAMMAR_COMPILE) and masking, forcing, advancing

    @property
    def words(self) -> int:
        return (self.vocab_size + 31) // 32

    def _environment(self):
        if self._env is None:
            # deferred: only a job with a constraint needs llguidance (its .hf and .torch modules take 0.8-2 s
            # to import on 2 cores)
            import llguidance
            import llguidance.hf

            if not getattr(self.tokenizer, "is_fast", False):
                raise ValueError("structured output needs a fast (Rust) tokenizer; this model's is "
                                 f"{type(self.tokenizer).__name__}")
            # llguidance knows only ids of the tokenizer's own vocabulary; an EOS id past it (a model whose
            # embeddings are padded) is taken as the first. Every EOS id is allowed where the first is (masks():
            # llguidance lets an EOS id that is also text through as text).
            eos = [t for t in self.eos_ids if 0 <= t < len(self.tokenizer)]
            self._outside = [t for t in self.eos_ids if len(self.tokenizer) <= t < self.vocab_size] if eos else []
            self._env = llguidance.hf.from_tokenizer(self.tokenizer, n_vocab=self.vocab_size, eos_token=eos or None)
            self._other_eos = [t for t in self.eos_ids if t != self._env.eos_token and t < self.vocab_size] if eos else []
        return self._env

    def problem(self, constraint: Constraint) -> str | None:
        """Why this constraint cannot run (the library's message, one line), or None. Compiles and caches it."""
        compiled = self._compile(constraint)
        return compiled if isinstance(compiled, str) else None

    def _compile(self, constraint: Constraint):
        if constraint in self._compiled:
            self._compiled.move_to_end(constraint)
            return self._compiled[constraint]
        import llguidance  # deferred, as in _environment

        started = time.perf_counter()
        endless = no_finite_instance(constraint.value) if constraint.kind == "json_schema" else None
        try:
            if endless:
                raise ValueError(f"no output can match it: {endless}")
            env = self._environment()
            limits = llguidance.LLParserLimits(step_lexer_fuel=STEP_LEXER_FUEL, step_max_items=STEP_MAX_ITEMS,
                                               verbose_errors=False)  # errors without the parser's dump
            matcher = llguidance.LLMatcher(env, grammar_text(constraint), log_level=0, limits=limits)
            compiled = f"{constraint.kind}: {one_line(matcher.get_error())}" if matcher.is_error() else matcher
            if not isinstance(compiled, str):
                compiled = _first_mask_problem(constraint, matcher) or matcher
        except ValueError as error:  # a schema that is not a JSON object, a tokenizer it cannot read
            compiled = f"{constraint.kind}: {one_line(str(error))}"
        self.timers.add(GRAMMAR_COMPILE, time.perf_counter() - started)
        self._compiled[constraint] = compiled
        if len(self._compiled) > CACHED_GRAMMARS:
            self._compiled.popitem(last=False)
        return compiled

    # ---- rows -------------------------------------------------------------------------------------

    def seat(self, slot: int, constraint: Constraint | None) -> None:
        """A row takes a slot with this constraint (None: unconstrained)."""
        self.rows.pop(slot, None)
        self.failed.pop(slot, None)
        if constraint is None:
            return
        compiled = self._compile(constraint)
        if isinstance(compiled, str):  # intake refuses these first; a cache eviction in between recompiles
            raise ValueError(compiled)
        self.rows[slot] = compiled.deep_copy()

    def release(self, slot: int) -> None:
        self.rows.pop(slot, None)
        self.failed.pop(slot, None)

    def constrained(self, slots: list[int]) -> list[int]:
        """Indices into slots of the constrained rows."""
        return [i for i, slot in enumerate(slots) if slot in self.rows] if self.rows else []

    def advance(self, slot: int, tokens: list[int]) -> tuple[int, str | None]:
        """The row emitted these tokens (accepted drafts and one more): the matcher moves past them. Returns
        how many of them the row keeps and the grammar's error, if any: a token its grammar refuses, or one
        drawn under a mask past the work limits (the module's docstring). The row then ends with the error
        and the tokens before it; the others go on."""
        matcher = self.rows.get(slot)
        if matcher is None:
            return len(tokens), None
        valid, failed = len(tokens), None
        if slot in self.failed:  # a mask past the work limits, `position` tokens ahead of these
            position, failed = self.failed.pop(slot)
            if position < len(tokens):  # the token there was drawn under that mask
                valid = position
            else:
                self.failed[slot], failed = (position - len(tokens), failed), None
        started = time.perf_counter()
        known = self._known(tokens[:valid])
        # The end, allowed only where the grammar accepts: a stopped matcher takes no EOS, and the row ends on it.
        end = len(known) - (failed is None and bool(known) and known[-1] in self._env.eos_tokens)
        taken = matcher.try_consume_tokens(known[:end])
        self.timers.add(GRAMMAR_MASK, time.perf_counter() - started)
        if failed is None and taken == end:
            return len(tokens), None
        if failed is None:
            failed = limit_error(matcher.get_error()) if matcher.is_error() \
                else f"the grammar refused token {known[taken]} after {taken} of this round's tokens"
        return taken, f"structured output: {failed}"

    def complete(self, slot: int) -> bool | None:
        """Whether the row's output so far is a whole sentence of its grammar (None: unconstrained)."""
        matcher = self.rows.get(slot)
        return None if matcher is None else matcher.is_accepting()

    def stopped(self, slot: int) -> bool:
        """The grammar takes nothing more (only an end of sequence)."""
        matcher = self.rows.get(slot)
        return matcher is not None and matcher.is_stopped()

    def forced(self, slot: int, limit: int, prefix: list[int] = ()) -> list[int]:
        """Up to `limit` tokens the grammar forces after the row's output (and `prefix`, tokens not yet
        consumed): the forced bytes, tokenized as the tokenizer would and cut where the grammar refuses. The
        target still verifies them, so a tokenization it would not produce costs a rejection, never a token."""
        if slot not in self.rows or limit <= 0:
            return []
        started = time.perf_counter()
        matcher = self._ahead(slot, prefix)
        forced_bytes = matcher.compute_ff_bytes()
        tokens = self._env.tokenize_bytes(forced_bytes)[:limit] if forced_bytes else []
        tokens = tokens[: matcher.try_consume_tokens(tokens)] if tokens else []
        self.timers.add(GRAMMAR_MASK, time.perf_counter() - started)
        return tokens

    def legal(self, slot: int, tokens: list[int]) -> int:
        """How many leading tokens of a proposal after the row's output its grammar allows; an EOS counts where
        the grammar accepts, and ends it (nothing after an EOS is emitted)."""
        if slot not in self.rows or not tokens:
            return len(tokens)
        known = self._known(tokens)
        end = next((t for t, token in enumerate(known) if token in self._env.eos_tokens), len(known))
        matcher = self._ahead(slot)
        taken = matcher.try_consume_tokens(known[:end])
        return taken + (taken == end < len(known) and matcher.is_accepting())

    def _ahead(self, slot: int, prefix=()):
        """A copy of the row's matcher to look ahead with, past `prefix` (tokens emitted but not yet consumed):
        the row's own matcher only consumes emitted tokens (the module's docstring says why). Lookahead on
        the copy only moves forward too (no `validate_tokens`, which rolls back inside)."""
        matcher = self.rows[slot].deep_copy()
        if prefix and not matcher.consume_tokens(self._known(prefix)):
            raise RuntimeError(f"slot {slot}: the grammar refused tokens {list(prefix)}")
        return matcher

    def byte_length(self, tokens: list[int]) -> int:
        """The bytes these tokens stand for."""
        return len(self._env.decode_bytes(self._known(tokens))) if tokens else 0

    def _known(self, tokens) -> list[int]:
        """Tokens as llguidance knows them: an EOS id past the tokenizer's vocabulary as the first EOS."""
        if not self._outside:
            return list(tokens)
        return [self._env.eos_token if t in self._outside else t for t in tokens]

    # ---- masks ------------------------------------------------------------------------------------

    def masks(self, slots: list[int], drafts: list[list[int]], width: int,
              prefixes: list[list[int]] | None = None) -> torch.Tensor:
        """The bitmasks of `width` verify positions of each of these constrained rows: position t after the
        row's output, its prefix (tokens emitted but not yet consumed) and drafts[i][:t] -> [n, width,
        words] int32 (bit j of word w: token 32 w + j allowed). Positions past a draft the grammar refuses
        stay all-allowed: they are never decided. Computed in this thread, draft by draft (consumed
        on a copy of the row's matcher): llguidance's parallel executor keeps threads of its own, which fight
        torch's for the cores of a small CPU machine."""
        import llguidance.torch  # deferred, as in _environment

        started = time.perf_counter()
        bitmask = torch.full((len(slots) * width, self.words), -1, dtype=torch.int32)
        for i, (slot, row_drafts) in enumerate(zip(slots, drafts)):
            prefix, proposed = prefixes[i] if prefixes else (), self._known(row_drafts[: width - 1])
            # Nothing to look past: the row's own matcher's mask (the normal flow: mask, then consume).
            matcher = self._ahead(slot, prefix) if prefix or proposed else self.rows[slot]
            self.failed.pop(slot, None)
            position = 0  # the verify position whose mask was computed last
            llguidance.torch.fill_next_token_bitmask(matcher, bitmask, i * width)
            for token in proposed:
                # An EOS is decided at its position and ends the row; a refused draft ends acceptance there.
                if matcher.is_error() or token in self._env.eos_tokens:
                    break
                position += 1
                if not matcher.consume_token(token):  # the next position's mask stays all-allowed
                    break
                llguidance.torch.fill_next_token_bitmask(matcher, bitmask, i * width + position)
            error = matcher.get_error() if matcher.is_error() else ""
            if any(start in error for start in LIMIT_ERRORS):
                # Past the work limits (not a refused draft): the token decided at that position ends the row.
                self.failed[slot] = (len(prefix) + position, limit_error(error))
        if self._other_eos:
            first = self._env.eos_token
            allowed = (bitmask[:, first // 32] >> (first % 32)) & 1
            for token in self._other_eos:
                bit = torch.tensor(1, dtype=torch.int32) << (token % 32)
                word = bitmask[:, token // 32]
                bitmask[:, token // 32] = (word & ~bit) | (allowed << (token % 32))
        self.timers.add(GRAMMAR_MASK, time.perf_counter() - started)
        return bitmask.view(len(slots), width, self.words)


def apply_masks(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """logits [..., V] and bitmask [..., ceil(V / 32)] int32 (same leading shape): disallowed tokens -> -inf,
    in place."""
    bits = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    allowed = ((bitmask[..., None] >> bits) & 1).flatten(-2)[..., : logits.shape[-1]].bool()
    logits.masked_fill_(~allowed.to(logits.device), float("-inf"))
