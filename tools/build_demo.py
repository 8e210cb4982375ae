"""Build batchspec's offline demo pair: a small trained Llama target, a distilled draft and held-out prompts.

Everything comes from the running interpreter's standard library, so no download is needed:

1. corpus: a fixed, sorted list of pure-Python stdlib modules, split by file into train and held-out;
2. tokenizer: byte-level BPE (`<s>` BOS id 0, prepended; `</s>` EOS id 1; `<pad>` id 2) trained on
   the train files only;
3. models: a Llama target trained from scratch on next-token prediction, then a much smaller Llama
   draft distilled from it (KL to the target's next-token distribution) so that their greedy tokens agree;
4. prompts: code prefixes (a def/class header plus its first lines) taken from the held-out files;
5. measurements on held-out data (loss, greedy agreement, forward timings), printed and written to
   the README next to the assets.

Usage (about 40 minutes on 2 CPU cores)::

    python tools/build_demo.py --out batchspec/assets/demo

Fixed seeds, fp32, CPU, two torch threads; reruns on the same interpreter and machine give the same files.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse
import sys
import sysconfig
import time
from pathlib import Path

import torch

if str(Path(__file__).resolve().parent) not in sys.path:  # the demo/ package beside this script (tests load
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # this file by its path)

# The build's steps live in tools/demo/, one module each; the names other tools and tests take from
# build_demo (code_prompts: file_prompts, read_text; tests: CHAT_TEMPLATE) are handed on here.
from demo.corpus import read_text, split_files, stdlib_files  # noqa: E402
from demo.eagle import finish_eagle, run_eagle  # noqa: E402
from demo.models import n_params  # noqa: E402
from demo.prompts import build_prompts, file_prompts  # noqa: E402
from demo.readme import write_readme  # noqa: E402
from demo.stages import make_models, measure, prepare_data, report_sizes, save_assets, train_models  # noqa: E402
from demo.tokenizer import CHAT_TEMPLATE  # noqa: E402

__all__ = ["CHAT_TEMPLATE", "file_prompts", "main", "parse_args", "read_text"]


def parse_args(argv=None) -> argparse.Namespace:
    from batchspec.training.train_draft import layer_ids  # train_draft's --layers parser, its check and message
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "batchspec/assets/demo")
    p.add_argument("--steps", type=int, default=700, help="target training steps")
    p.add_argument("--draft-steps", type=int, default=500, help="draft distillation steps on corpus windows")
    p.add_argument("--continuations", type=int, default=4000,
                   help="train-file prompts the target continues greedily for the draft's second stage")
    p.add_argument("--continuation-tokens", type=int, default=96, help="new tokens per continuation")
    p.add_argument("--continuation-steps", type=int, default=1500,
                   help="draft distillation steps on the target's continuations (0: skip the stage)")
    p.add_argument("--continuation-batch", type=int, default=16)
    p.add_argument("--continuation-lr", type=float, default=2e-3)
    p.add_argument("--reuse-target", type=Path, default=None, metavar="DIR",
                   help="load the tokenizer and target from DIR (an earlier build) instead of training them")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--lr", type=float, default=2e-3, help="target peak learning rate")
    p.add_argument("--draft-lr", type=float, default=3e-3, help="draft peak learning rate")
    p.add_argument("--target-shape", default="256x14x672", help="hidden x layers x MLP of the target (4 heads, 2 KV)")
    p.add_argument("--draft-shape", default="128x2x352", help="hidden x layers x MLP of the draft (4 heads, 2 KV)")
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--n-prompts", type=int, default=200)
    p.add_argument("--n-agree", type=int, default=32, help="held-out prompts for the greedy agreement measure")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--arch", choices=["llama", "qwen2"], default="llama",
                   help="architecture of the target and draft (the shipped demo is llama)")
    p.add_argument("--eagle", action="store_true",
                   help="also train the target's EAGLE-3 head with batchspec.train_draft and ship it in OUT/eagle")
    p.add_argument("--eagle-only", action="store_true",
                   help="only the --eagle stage, on the target already in OUT (nothing else is rebuilt)")
    p.add_argument("--eagle-minutes", type=float, default=15.0, help="train_draft's time budget for the head")
    p.add_argument("--eagle-layers", type=layer_ids, default=None,
                   help="the target hidden-state indices the head reads, e.g. 2,7,13 (default: train_draft's)")
    p.add_argument("--eagle-vocab", type=int, default=None, help="draft vocabulary of the head (default: full)")
    p.add_argument("--eagle-compare", type=int, default=200, help="held-out prompts for the eagle/draft comparison")
    return p.parse_args(argv)



def main(argv=None) -> None:
    args = parse_args(argv)
    t0 = time.time()
    torch.set_num_threads(2)
    torch.manual_seed(args.seed)
    root = Path(sysconfig.get_paths()["stdlib"])
    files = stdlib_files(root)
    train_files, heldout_files = split_files(files)
    if args.eagle_only:
        run_eagle(args, argv, root, train_files)
        return
    data = prepare_data(args, root, train_files, heldout_files, t0)
    target, draft = make_models(args, data)
    training = train_models(args, root, data, target, draft)
    prompts = build_prompts(root, heldout_files, data.tokenizer, args.n_prompts, min_tokens=20, max_tokens=150)
    print(f"prompts: {len(prompts)} from {len({p['source_file'] for p in prompts})} held-out files", flush=True)

    # Save, then measure the saved models as users will load them.
    out: Path = args.out
    old_readme, target, draft = save_assets(out, data.tokenizer, target, draft, prompts)
    losses, agreement, n_agree, timings = measure(args, data, training, prompts, target, draft)
    wall = (time.time() - t0) / 60
    write_readme(out, args, argv, files=(train_files, heldout_files),
                 tokens=(len(data.train_stream), len(data.heldout_stream)),
                 params=(n_params(target), n_params(draft)), steps=(args.steps, args.draft_steps),
                 train_minutes=training.minutes, losses=losses, agreement=agreement, n_agree=n_agree,
                 timings=timings, n_prompts=len(prompts), wall=wall, target=target, draft=draft)
    finish_eagle(args, argv, root, train_files, old_readme)
    report_sizes(out, wall)


if __name__ == "__main__":
    main()
