"""The steps of tools/build_demo.py, one module each: corpus, tokenizer, models, training, prompts, stages (the
build's steps in order), measures, readme and eagle. build_demo.py puts tools/ on sys.path and imports them as
`demo.<module>`."""
