"""The parts of tools/suffix_sim.py, one module each: workload (the rows and their greedy completions),
drafters (suffix, ngram and prompt_lookup on host lists), replay (B slots, round by round) and baselines (the
re-implemented drafters checked against the engine's). suffix_sim.py puts tools/ and the repository on sys.path
and imports them as `suffix_replay.<module>`."""
