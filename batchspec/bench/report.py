"""The benchmark's report (python -m batchspec.bench): what its measurements come to, as rows and as text.

`result_rows` turns the measured contenders into the report's rows (median tokens/s, the ratios to HF
generate and to drafter none, acceptance, the predicted speedup, whether the outputs equal drafter none's);
`render` and `render_by_batch_size` write the Markdown tables; the `print_*` functions and
`adaptive_vs_best_fixed` print the lines under the table (the cost curve, where batchspec's time goes,
structured output, launches, adaptive against the best fixed k, and whether the outputs are identical).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from ..engine.runstats import rounds_by_k_text
from .contenders import Contender, variant_tag, variants
from .grammar import schema_validity


@dataclass(frozen=True)
class CostCurve:
    """The forward times the predicted speedups use (measure.cost_curve)."""

    context: int  # tokens cached: the prompts' mean length plus half of max_new_tokens
    t_verify1: float  # ms: one target forward of 1 token per row
    t_verify: dict[int, float]  # ms: one target forward of k + 1 tokens per row, by k
    t_draft: float  # ms: one draft forward of 1 token per row (0 without a draft model)

    def as_dict(self) -> dict:
        return {"context": self.context, "target_ms_1": self.t_verify1, "draft_ms_1": self.t_draft,
                **{f"target_ms_{k + 1}": t for k, t in self.t_verify.items()}}


def round_time(timings: dict) -> float:
    """Seconds in a batchspec contender's round phases (its coupled noise is not one of them)."""
    return sum(t for name, t in timings.items() if name != "noise")


def shares(contender: Contender) -> tuple[float | None, float | None, float | None]:
    """(padding, admission, admission at the margin) of a batchspec contender: the share of the tokens its
    target forwards computed that were padding, and admission's share of round time: its own phase, plus
    in packed rounds the prompt tokens' share of each forward's time (or, at the margin, what the prompt
    tokens add to forwards that run anyway: engine/stats.py TokenCounts)."""
    if not contender.timings or not contender.tokens:
        return None, None, None
    total = round_time(contender.timings)
    tokens, admit = contender.tokens, contender.timings["admit"]
    padding = tokens["padding"] / tokens["computed"] if tokens["computed"] else 0.0
    return padding, (admit + tokens["prefill_s"]) / total, (admit + tokens["prefill_marginal_s"]) / total


def slots_filled(contender: Contender) -> float | None:
    """The share of its rounds' slots that held a deciding row. Rows that draft advance at different paces and
    finish apart, so that they are admitted a few at a time and the job ends in rounds of fewer rows, costs that
    no round's tokens per second shows (Gemma-3-270M at batch 8, 32 rows of 48 tokens: drafter none filled 99.5% of
    its slots, ngram and suffix adaptive 89.8% and 92.6%, and ran 0.95x and 0.97x it; docs/benchmarks.md, 2026-12-06)."""
    return contender.row_rounds / contender.slot_rounds if contender.slot_rounds else None


def predicted_vs_none(c: Contender, curve: CostCurve) -> float | None:
    """The speedup over drafter none that the measured tokens per forward and the cost curve predict (fixed-k
    chains of the model, n-gram and prompt-lookup drafters only)."""
    if c.kind == "batchspec" and c.drafter not in ("none", "eagle") and c.tokens_per_forward and not c.adaptive \
            and not c.tree:
        draft_cost = c.k * curve.t_draft if c.drafter == "model" else 0.0
        return c.tokens_per_forward * curve.t_verify1 / (curve.t_verify[c.k] + draft_cost)
    return None


def side_by_side(mine: list[float], theirs: list[float]) -> float:
    """mine over theirs: the median of the ratios of the runs made side by side (the i-th of each: repeats are
    interleaved, and --interleave runs the i-th jobs together), which a swing of the machine's speed moves
    less than a ratio of medians; that where the two ran a different number of times."""
    if len(mine) == len(theirs) and mine:
        return statistics.median(a / b for a, b in zip(mine, theirs))
    return statistics.median(mine) / statistics.median(theirs)


def result_rows(field_: list[Contender], args, num_prompts: int, curve: CostCurve) -> list[dict]:
    """One row per contender, in the field's order."""
    hf_batched = next((c for c in field_ if c.kind == "hf_batched"), None)
    baseline = statistics.median(hf_batched.tokens_per_s) if hf_batched else None
    hf_static = next((c for c in field_ if c.kind == "hf_static"), None)
    static = statistics.median(hf_static.tokens_per_s) if hf_static else None
    nones: dict = {}
    for c in field_:  # the first none of each variant is the reference (--noise-check runs a second)
        if c.kind == "batchspec" and c.drafter == "none":
            nones.setdefault((c.compile, c.verify), c)
    first_none = nones[variants(args)[0]]
    # Greedy and coupled sampling emit plain decoding's tokens, in every compile mode (greedy runs are all
    # "coupled" here): the first coupled none is the reference, never a rejection none, whose sampled
    # tokens differ by design (`--verify rejection,coupled` runs that one first).
    reference = next((c for (_, verify), c in nones.items() if verify == "coupled"), first_none).outputs
    rows = []
    for c in field_:
        rate = statistics.median(c.tokens_per_s)
        vs_none = side_by_side(c.tokens_per_s, nones.get((c.compile, c.verify), first_none).tokens_per_s)
        predicted = predicted_vs_none(c, curve)
        mismatches = sum(a != b for a, b in zip(c.outputs, reference))
        padding, admission, marginal = shares(c)
        rows.append({
            "contender": c.name, "kind": c.kind, "drafter": c.drafter if c.kind == "batchspec" else None,
            "k": c.k, "adaptive": c.adaptive, "compile": c.compile if c.kind == "batchspec" else None,
            "tree": c.tree, "rounds_by_tree": c.rounds_by_tree,
            "verify": c.verify if c.kind == "batchspec" and args.temperature > 0 else None,
            "tokens_per_s": rate, "repeats_tokens_per_s": list(c.tokens_per_s),
            "warmup_s": c.warmup_s, "capture_s": c.capture_s, "vs_hf_batched": rate / baseline if baseline else None,
            "vs_hf_static": rate / static if hf_static else None,
            "vs_none": vs_none, "acceptance": c.acceptance, "tokens_per_forward": c.tokens_per_forward,
            "predicted_vs_none": predicted, "achieved_over_predicted": vs_none / predicted if predicted else None,
            "outputs_equal_to_none": num_prompts - mismatches, "num_prompts": num_prompts,
            "padding_share": padding, "admission_share": admission, "admission_marginal_share": marginal,
            "slots_filled": slots_filled(c),
        })
    return rows


def print_cost_curve(batch_size: int, curve: CostCurve) -> None:
    t_verify1 = curve.t_verify1
    print(f"\ncost curve at batch {batch_size}, ~{curve.context} tokens cached: target 1 token {t_verify1:.2f} ms, "
          + ", ".join(f"{k + 1} tokens {t:.2f} ms (x{t / t_verify1:.2f})" for k, t in curve.t_verify.items())
          + f"; draft 1 token {curve.t_draft:.2f} ms")


def print_time_split(field_: list[Contender], exact: bool) -> None:
    """Each batchspec contender's share of round time by phase, admission's and padding's shares."""
    print("where batchspec's time goes (share of round time: draft / verify / accept / bookkeeping / admit; then "
          "admission's share, its prompt tokens in packed forwards included (in proportion to their tokens, and at "
          "the margin), the share of computed tokens that were padding, and of the rounds' slots that held a "
          "deciding row)" + ("" if exact else "; without --profile a GPU's work lands in the phase that syncs:"))
    for c in field_:
        if c.timings:
            total = round_time(c.timings)
            noise = f"  (coupled noise {c.timings['noise'] / total:.1%})" if c.timings.get("noise") else ""
            padding, admission, marginal = shares(c)
            print(f"  {c.name:32s} " + " / ".join(f"{c.timings[n] / total:.0%}" for n in
                                                  ("draft", "verify", "accept", "bookkeeping", "admit"))
                  + f"  admission {admission:.1%} (at the margin {marginal:.1%}), padding {padding:.1%}"
                  + (f", slots filled {filled:.1%}" if (filled := slots_filled(c)) is not None else "") + noise)
    checks = [(c, getattr(getattr(c.generator, "scheduler", None), "payoff", None)) for c in field_]
    checks = [(c, p.summary()) for c, p in checks if p is not None and sum(p.rounds)]
    if checks:
        print("the payoff check (epochs with and without drafts compared by the wall clock; "
              "engine/control/payoff.py), over the warm-up and every repeat:")
        for c, p in checks:
            share = p["rounds_drafting"] / (p["rounds_drafting"] + p["rounds_plain"])
            print(f"  {c.name:32s} drafting allowed in {share:.0%} of rounds; verdict {p['winner'] or 'none yet'}; "
                  f"drafting / plain {p['ratio']:.2f}")


def print_structured(field_: list[Contender], tokenizer, constraints) -> None:
    """How many of each contender's outputs match their schema, and its host time in grammar work."""
    print("structured output (outputs that parse and match their schema; host time in grammar work, share of "
          "round time):")
    for c in field_:
        valid, checked = schema_validity([tokenizer.decode(o, skip_special_tokens=True) for o in c.outputs],
                                         constraints)
        share = f", grammar {c.grammar_s / round_time(c.timings):.1%}" if c.timings else ""
        print(f"  {c.name:32s} valid {valid}/{checked}{share}")


def print_launches(launches: dict) -> None:
    if launches:
        print("launches (ops dispatched outside captured steps, static path; per round by phase | steps run per round "
              "| host syncs per round | admission ops per generated token):")
        for name, n in launches.items():
            print(f"  {name:32s} {n['ops_per_round']} | {n['steps_per_round']} | {n['syncs_per_round']:.2f} | "
                  f"{n['admit_ops_per_token']:.3f}")


def adaptive_vs_best_fixed(rows: list[dict], field_: list[Contender], args) -> dict:
    """Each drafter's adaptive tokens/s over its best fixed k's, by variant; printed as it goes."""
    out = {}
    for mode, verify in variants(args):
        for drafter in args.drafters:
            mine = [(r, c) for r, c in zip(rows, field_)
                    if r["drafter"] == drafter and c.compile == mode and c.verify == verify]
            fixed = [r for r, c in mine if not c.adaptive]
            adaptive = [(r, c) for r, c in mine if c.adaptive]
            if fixed and adaptive:
                best = max(fixed, key=lambda r: r["vs_none"])
                row, contender = adaptive[0]
                key = drafter + variant_tag(args, mode, verify)
                out[key] = side_by_side(row["repeats_tokens_per_s"], best["repeats_tokens_per_s"])
                trees = "".join(f"  tree {t} {n}" for t, n in (contender.rounds_by_tree or {}).items())
                print(f"adaptive vs the best fixed k: {key} {out[key]:.2f} (best fixed: "
                      f"{best['contender']}); adaptive vs none {row['vs_none']:.2f}; rounds by k: "
                      f"{rounds_by_k_text(contender.rounds_by_k)}{trees}")
    return out


def print_identity(rows: list[dict], args, num_prompts: int) -> bool:
    """Whether every row bound to drafter none's outputs equals them; printed."""
    # Greedy and coupled sampling emit the target's own tokens whatever drafted them: those rows must
    # match drafter none's outputs (HF's sampled outputs and rejection sampling's differ by design).
    bound = rows if args.temperature == 0 else [r for r in rows if r["verify"] == "coupled"]
    same = all(r["outputs_equal_to_none"] == num_prompts for r in bound)
    what = "greedy outputs" if args.temperature == 0 else "coupled sampled outputs (seed %d)" % args.seed
    print(f"{what}: " + ("all identical to drafter none" if same else
          "DIFFER: " + ", ".join(f"{r['contender']} {r['num_prompts'] - r['outputs_equal_to_none']}" for r in bound
                                 if r["outputs_equal_to_none"] != num_prompts)))
    return same


def render(rows: list[dict]) -> str:
    def fmt(v, spec):
        return "-" if v is None else format(v, spec)

    lines = ["| contender | tok/s | vs HF batched | vs HF static | vs none | acceptance | tokens/fwd | "
             "predicted vs none | achieved/predicted | = none |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r['contender']} | {r['tokens_per_s']:.1f} | {fmt(r['vs_hf_batched'], '.2f')} | "
            f"{fmt(r['vs_hf_static'], '.2f')} | {r['vs_none']:.2f} | {fmt(r['acceptance'], '.2f')} | "
            f"{fmt(r['tokens_per_forward'], '.2f')} | {fmt(r['predicted_vs_none'], '.2f')} | "
            f"{fmt(r['achieved_over_predicted'], '.2f')} | {r['outputs_equal_to_none']}/{r['num_prompts']} |"
        )
    return "\n".join(lines)


def render_by_batch_size(reports: list[dict]) -> str:
    """One row per batch size: tokens/s of HF generate (dynamic and static cache), drafter none, and each
    drafter's best fixed k and adaptive, in every compile mode."""
    batchspec_rows = [row for r in reports for row in r["rows"] if row["kind"] == "batchspec"]
    modes = list(dict.fromkeys(row["compile"] for row in batchspec_rows))
    drafters = list(dict.fromkeys(row["drafter"] for row in batchspec_rows if row["drafter"] != "none"))
    has_static = any(row["kind"] == "hf_static" for r in reports for row in r["rows"])
    head = ["batch", "HF batched tok/s"] + (["HF static tok/s"] if has_static else [])
    for mode in modes:
        tag = f" [{mode}]" if len(modes) > 1 else ""
        head += [f"none{tag} tok/s", f"none{tag} vs HF" + (" static" if has_static else "")]
        for d in drafters:
            head += [f"{d}{tag} best fixed (k)", f"{d}{tag} adaptive", f"{d}{tag} best vs none"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    lines += ["| " + " | ".join(batch_size_cells(r, modes, drafters, has_static)) + " |" for r in reports]
    return "\n".join(lines)


def batch_size_cells(report: dict, modes: list[str], drafters: list[str], has_static: bool) -> list[str]:
    """One batch size's row of render_by_batch_size."""
    by_kind = {row["kind"]: row for row in report["rows"] if row["kind"] != "batchspec"}
    cells = [str(report["batch_size"]),
             f"{by_kind['hf_batched']['tokens_per_s']:.0f}" if "hf_batched" in by_kind else "-"]
    if has_static:
        cells.append(f"{by_kind['hf_static']['tokens_per_s']:.0f}" if "hf_static" in by_kind else "-")
    for mode in modes:
        mine = [row for row in report["rows"] if row["kind"] == "batchspec" and row["compile"] == mode]
        none = next(row for row in mine if row["drafter"] == "none")
        versus = none["vs_hf_static"] if has_static else none["vs_hf_batched"]
        cells += [f"{none['tokens_per_s']:.0f}", "-" if versus is None else f"{versus:.2f}"]
        for d in drafters:
            fixed = [row for row in mine if row["drafter"] == d and not row["adaptive"]]
            adaptive = [row for row in mine if row["drafter"] == d and row["adaptive"]]
            top = max(fixed, key=lambda row: row["tokens_per_s"]) if fixed else None
            best = max(fixed + adaptive, key=lambda row: row["tokens_per_s"]) if fixed + adaptive else None
            cells += [f"{top['tokens_per_s']:.0f} ({top['k']})" if top else "-",
                      f"{adaptive[0]['tokens_per_s']:.0f}" if adaptive else "-",
                      f"{best['vs_none']:.2f}" if best else "-"]
    return cells
