"""Measure the two grammar engines batchspec could use, side by side, on one tokenizer.

    python tools/grammar_libs.py TOKENIZER_DIR [--repeats 5]

Prints, for llguidance and xgrammar (whichever are installed): the tokenizer's set-up time,
a JSON schema's compile time, the time to compute one token's mask and advance by it (over
a valid output, token by token), the time to roll back four tokens, what each offers for
forced continuations, and the installed size of the package and what it pulls in.
"""
import argparse
import importlib.metadata
import json
import os
import statistics
import time

from transformers import AutoTokenizer

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"}, "age": {"type": "integer"},
        "city": {"type": "string"}, "email": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
        "role": {"enum": ["engineer", "doctor", "teacher", "other"]},
    },
    "required": ["name", "age", "city", "role"], "additionalProperties": False,
}
OUTPUT = '{"name": "Marta Kowalski", "age": 34, "city": "Lisbon", "email": "marta@example.com", ' \
         '"tags": ["runner", "chess"], "role": "engineer"}'


def timed(fn, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def package_size(dist: str) -> float:
    files = importlib.metadata.distribution(dist).files or []
    return sum(os.path.getsize(f.locate()) for f in files if os.path.exists(f.locate())) / 2**20


def measure_llguidance(tokenizer, ids, repeats):
    import llguidance
    import llguidance.hf
    import llguidance.torch
    setup, env = timed(lambda: llguidance.hf.from_tokenizer(tokenizer), 1)
    grammar = llguidance.LLMatcher.grammar_from_json_schema(SCHEMA)
    compile_s, _ = timed(lambda: llguidance.LLMatcher(env, grammar), repeats)
    bitmask = llguidance.torch.allocate_token_bitmask(1, env.vocab_size)

    def walk():
        matcher = llguidance.LLMatcher(env, grammar)
        start = time.perf_counter()
        for token in ids:
            llguidance.torch.fill_next_token_bitmask(matcher, bitmask, 0)
            assert matcher.consume_token(token), matcher.get_error()
        return (time.perf_counter() - start) / len(ids)
    per_token = statistics.median(walk() for _ in range(repeats))
    matcher = llguidance.LLMatcher(env, grammar)
    matcher.consume_tokens(ids[:10])
    rollback_s, _ = timed(lambda: (matcher.consume_tokens(ids[10:14]), matcher.rollback(4)), repeats)
    forced = llguidance.LLMatcher(env, grammar).compute_ff_bytes()
    return setup, compile_s, per_token, rollback_s, f"compute_ff_tokens / compute_ff_bytes ({forced!r} at start)"


def measure_xgrammar(tokenizer, ids, repeats):
    import xgrammar
    setup, info = timed(lambda: xgrammar.TokenizerInfo.from_huggingface(tokenizer), 1)
    compiler = xgrammar.GrammarCompiler(info, cache_enabled=False)
    compile_s, compiled = timed(lambda: compiler.compile_json_schema(json.dumps(SCHEMA)), repeats)
    bitmask = xgrammar.allocate_token_bitmask(1, info.vocab_size)

    def walk():
        matcher = xgrammar.GrammarMatcher(compiled, max_rollback_tokens=16)
        start = time.perf_counter()
        for token in ids:
            matcher.fill_next_token_bitmask(bitmask, 0)
            assert matcher.accept_token(token)
        return (time.perf_counter() - start) / len(ids)
    per_token = statistics.median(walk() for _ in range(repeats))
    matcher = xgrammar.GrammarMatcher(compiled, max_rollback_tokens=16)
    for token in ids[:10]:
        matcher.accept_token(token)
    rollback_s, _ = timed(lambda: ([matcher.accept_token(t) for t in ids[10:14]], matcher.rollback(4)), repeats)
    forced = xgrammar.GrammarMatcher(compiled).find_jump_forward_string()
    return setup, compile_s, per_token, rollback_s, f"find_jump_forward_string ({forced!r} at start)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tokenizer")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    ids = tokenizer.encode(OUTPUT, add_special_tokens=False)
    print(f"vocabulary {len(tokenizer)}, output {len(ids)} tokens, medians of {args.repeats}")
    print(f"{'library':<11} {'tokenizer':>10} {'compile':>9} {'mask+advance':>13} {'rollback 4':>11} "
          f"{'installed (with deps)':>22}  forced continuation")
    for name, measure, deps in (("llguidance", measure_llguidance, ["llguidance"]),
                                ("xgrammar", measure_xgrammar, ["xgrammar", "triton", "apache-tvm-ffi"])):
        try:
            setup, compile_s, per_token, rollback_s, forced = measure(tokenizer, ids, args.repeats)
        except ImportError as error:
            print(f"{name:<11} not installed ({error})")
            continue
        size = sum(package_size(d) for d in deps if _installed(d))
        print(f"{name:<11} {setup * 1e3:>8.0f}ms {compile_s * 1e3:>7.2f}ms {per_token * 1e3:>11.3f}ms "
              f"{rollback_s * 1e3:>9.3f}ms {size:>20.1f}MB  {forced}")


def _installed(dist: str) -> bool:
    try:
        importlib.metadata.distribution(dist)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


if __name__ == "__main__":
    main()
