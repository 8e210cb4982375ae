"""Train an EAGLE-3 head for any Hugging Face target by self-distillation (`python -m batchspec.train_draft`).

    prompts -> the target's own continuations and, from the same forwards, its hidden states (data.py,
               record.py) -> training-time-test training (loop.py) -> held-out replay and step costs
               (evaluate.py) -> the head in the EAGLE / SpecForge layout (formats.py) and a summary (summary.py)

Everything the run needs to continue after a kill lives in OUT/.train: the generated samples and their
states (chunks, atomic), the options that shaped them (run.json) and the latest checkpoint; `--resume`
picks them up. The time budget (`minutes`) covers the whole run: generation stops at `data_fraction` of
it, training gets what is left (less a reserve for the evaluation).
"""

from __future__ import annotations

import copy
import gc
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..eagle.config import HeadError
from ..engine.model.models import load_models
from ..sources import open_source
from ..sources.prompts import PromptBuilder
from .data import PROMPT_ORDERS, Prompts, SampleStore, generate_data, split_prompts
from .evaluate import acceptance, head_matches, measure_costs
from ..eagle.config import default_layer_ids, target_num_layers
from .features import recorded_states, sequence_states
from ..util.files import atomic_write, atomic_write_text
from ..eagle.formats import save_head
from .init import head_for_target, scale_fc
from .loop import LoopOptions, default_lr, train_loop
from .summary import Summary, render
from .vocab import vocab_for

# Options whose change makes the saved samples or checkpoint meaningless for a resumed run.
DATA_KEYS = ("target", "prompts", "prompt_column", "chat", "split", "limit", "max_prompt_tokens", "max_new_tokens",
             "eval_new_tokens", "temperature", "heldout", "max_heldout", "seed", "layers", "draft_vocab_size",
             "gen_dtype", "lm_head", "prompt_order")


@dataclass
class TrainDraftOptions:
    target: str
    prompts: str
    out: str
    prompt_column: str = "prompt"
    chat: bool = False  # the column's text as a user message, or its message list, through the chat template
    split: str = "train"
    limit: int | None = None
    prompt_order: str = "shuffled"  # or "file": which prompts are held out and the order the rest are continued in (data.split_prompts)
    minutes: float = 15.0  # budget for the whole run (0: no time limit; then give steps)
    steps: int = 0
    device: str = "auto"
    dtype: str = "auto"
    resume: bool = False
    lr: float | None = None  # None: training.loop.default_lr(head width)
    batch_size: int = 4
    ttt_steps: int = 4
    ttt_ramp: float = 0.5  # share of training over which the unrolled steps grow from 1 to ttt_steps (loop.py)
    draft_vocab_size: int | None = None  # None: the most frequent tokens covering 97% of the data (vocab.py)
    heldout: float = 0.05
    max_heldout: int = 128
    max_prompt_tokens: int = 512
    max_new_tokens: int = 96
    eval_new_tokens: int = 64
    temperature: float = 0.0
    labels: str = "auto"  # auto: hard for greedy continuations, else soft at the sampling temperature
    data_fraction: float = 0.25
    gen_batch_size: int = 128
    gen_dtype: str = "auto"  # the training continuations' target dtype: auto = the target's (`generation_target`)
    train_on_prompt: bool = False
    layers: tuple[int, int, int] | None = None
    lm_head: str = "train"  # "frozen": the head's LM head stays the target's rows of the draft vocabulary (new_head)
    feature_loss: float = 10.0  # weight of the regression onto the target's LM-head input (loop.py; docs/eagle.md)
    format: str = "eagle"
    save_dtype: str = "float32"
    seed: int = 0
    loop: dict = field(default_factory=dict)  # extra LoopOptions fields


class TrainDraftError(ValueError):
    """A run that cannot start as asked; one line."""


def check_run_folder(options: TrainDraftOptions, state_dir: Path) -> dict:
    """Refuse an earlier run's folder unless resuming it with the same data options; returns the record
    that `start_run_folder` writes."""
    record = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(options).items() if k in DATA_KEYS}
    run_file = state_dir / "run.json"
    if run_file.exists():
        if not options.resume:
            raise TrainDraftError(f"{options.out} holds an earlier run ({state_dir}); pass --resume to continue it "
                                  "or choose another --out")
        stored = json.loads(run_file.read_text())
        stored.setdefault("gen_dtype", "auto")  # a run folder from before --gen-dtype
        stored.setdefault("lm_head", "train")  # ... or before --lm-head
        stored.setdefault("prompt_order", "file")  # ... or before --prompt-order (file order was the only one)
        changed = [k for k in DATA_KEYS if stored.get(k) != record[k]]
        if changed:
            raise TrainDraftError(f"--resume with different {', '.join(changed)} than the run in {options.out}")
    return record


def start_run_folder(state_dir: Path, record: dict) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(state_dir / "run.json", lambda tmp: Path(tmp).write_text(json.dumps(record, indent=2)))


def check_options(options: TrainDraftOptions) -> None:
    """A TrainDraftError naming the flag of a choice the trainer does not know."""
    if options.lm_head not in ("train", "frozen"):
        raise TrainDraftError(f"--lm-head {options.lm_head}: choose train or frozen")
    if options.prompt_order not in PROMPT_ORDERS:
        raise TrainDraftError(f"--prompt-order {options.prompt_order}: choose shuffled or file")
    if not 0 <= options.feature_loss < float("inf"):  # NaN included
        raise TrainDraftError(f"--feature-loss {options.feature_loss}: need a weight >= 0")


def run(options: TrainDraftOptions, log=print) -> Summary:
    """Generate, train, evaluate and save; returns the summary (also written to OUT/train_summary.*)."""
    t_start = time.time()
    check_options(options)
    state_dir = Path(options.out) / ".train"
    if Path(options.out).exists() and not Path(options.out).is_dir():
        raise TrainDraftError(f"--out {options.out} is a file; give a folder for the head (it is created)")
    source = open_source(options.prompts, "auto", options.split, {options.prompt_column: "--prompt-column"})
    record = check_run_folder(options, state_dir)
    models = load_models(options.target, dtype=options.dtype, device=options.device)
    start_run_folder(state_dir, record)
    target, device, budget = models.target, models.target.device, options.minutes * 60
    split = encode_prompts(options, source, models.tokenizer, log)

    store = SampleStore(state_dir / "samples")
    num_layers = target_num_layers(target.config)
    layer_ids = tuple(options.layers or default_layer_ids(num_layers))
    deadline = time.time() + (options.data_fraction * budget if budget else float("inf")) - store_seconds(store)
    writer = generation_target(target, options.gen_dtype)
    if writer is not target:
        log(f"training continuations in {writer.dtype} (--gen-dtype); held-out ones in {target.dtype}")
    data = generate_data(
        target, models.tokenizer, split, store, max_new_tokens=options.max_new_tokens, writer=writer,
        eval_new_tokens=options.eval_new_tokens, temperature=options.temperature, seed=options.seed,
        batch_size=options.gen_batch_size, chunk=4 * options.gen_batch_size, deadline=deadline,
        layers=(*layer_ids, num_layers),  # and the LM head's input (hidden_states[-1])
        progress=lambda n, tokens: log(f"  generated {n} continuations, {tokens} tokens ({time.time() - t_start:.0f}s)"))
    if writer is not target:  # a copy in another dtype is not needed for training; the engine holds cycles
        del writer
        gc.collect()
    log(f"data: {len(data.train)} training samples from {data.prompts_used}/{data.prompts_total} prompts, "
        f"{sum(len(s.ids) for s in data.train)} tokens; generation {data.seconds / 60:.1f} min")

    checkpoint_path = state_dir / "checkpoint.pt"
    resume = torch.load(checkpoint_path, map_location="cpu", weights_only=False) if checkpoint_path.exists() else None
    head = new_head(options, target, data, models.eos_token_ids, resume)
    t_feat = time.time()
    states = target_states_of(target, data.train, data.train_states, layer_ids, options.temperature == 0,
                              options.train_on_prompt)
    heldout_states = target_states_of(target, data.heldout, data.heldout_states, layer_ids, True, False)
    feature_seconds = time.time() - t_feat
    log(f"target features: {feature_seconds / 60:.1f} min" + (" (recorded while generating" + (
        "; this is the greedy labels of prompt positions)" if options.train_on_prompt else ")")
        if data.train_states is not None else ""))
    if resume is None:
        scale_fc(head, torch.cat([st[0] for st in states[:64]]))

    labels = options.labels if options.labels != "auto" else ("hard" if options.temperature == 0 else "soft")
    lr = options.lr if options.lr is not None else default_lr(head.config.hidden_size)
    loop = LoopOptions(lr=lr, batch_size=options.batch_size, ttt_steps=options.ttt_steps, ttt_ramp=options.ttt_ramp,
                       steps=options.steps,
                       train_on_prompt=options.train_on_prompt, seed=options.seed, labels=labels,
                       label_temperature=options.temperature or 1.0, feature_loss=options.feature_loss, **options.loop)
    reserve = min(60.0, 0.05 * budget)  # for the evaluation below
    loop.seconds = max(1.0, budget - data.seconds - feature_seconds - reserve) if budget else 0.0
    state = train_loop(head, target, data.train, states, data.heldout, heldout_states, loop, checkpoint_path,
                       resume=resume, device=device)
    return finish(options, head, target, data, heldout_states, state, loop, feature_seconds)


def generation_target(target, gen_dtype: str):
    """The model that writes the training continuations and their states: the target itself, or a copy in
    `gen_dtype`. On a CPU with bf16 instructions (AVX512-BF16) SmolLM2 decoded 1.6-1.7x faster in bfloat16
    than in float32 (batch 128, 2 cores: 372-385 against 223-238 tokens/s), so a budget's data share
    writes that much more data; the held-out continuations, which measure the head, stay in the target's
    dtype. The states are stored in float32 whichever dtype wrote them (record.py casts them)."""
    if gen_dtype in ("auto", str(target.dtype).removeprefix("torch.")):
        return target
    if gen_dtype not in ("float32", "bfloat16", "float16"):
        raise TrainDraftError(f"--gen-dtype {gen_dtype}: choose auto, float32, bfloat16 or float16")
    if gen_dtype == "float16" and target.device.type == "cpu":
        # CPUs have no float16 matmul units worth the name: it would spend the data share writing less data.
        raise TrainDraftError("--gen-dtype float16 on a CPU: float16 matmuls are emulated there (slower than "
                              "float32); use bfloat16 (fast on CPUs with AVX512-BF16 or AMX) or float32")
    return copy.deepcopy(target).to(getattr(torch, gen_dtype))


def target_states_of(target, samples, recorded, layer_ids, greedy_data: bool,
                     prompt_labels: bool) -> list[tuple[torch.Tensor, ...]]:
    """Training states per sample: from what generation recorded, or (samples an earlier version stored
    without them) a forward over each sequence."""
    if recorded is not None:
        return recorded_states(target, samples, recorded, greedy_data=greedy_data, prompt_labels=prompt_labels)
    dtype = torch.float32 if target.device.type == "cpu" else target.dtype
    return sequence_states(target, [s.ids for s in samples], layer_ids, dtype=dtype)


def encode_prompts(options: TrainDraftOptions, source, tokenizer, log) -> Prompts:
    """The prompts as token ids (text, token ids, or with `chat` a user message or a message list through the
    chat template: jobs' rules, sources/prompts.py), less those over max_prompt_tokens; the held-out ones split
    off. Unusable rows are counted and the first reason shown; a source with too few usable rows is refused."""
    builder = PromptBuilder(prompt_column=options.prompt_column, template=None, chat=options.chat,
                            tokenizer=tokenizer, max_seq_len=options.max_prompt_tokens)
    encoded, bad, rows, first = [], 0, 0, None
    for _, values in source.rows(0, 1, options.limit):
        rows += 1
        try:
            if isinstance(values, str):  # a row that could not be read at all
                raise ValueError(values)
            prompt = builder.prompt(values)
            ids = tokenizer(prompt)["input_ids"] if isinstance(prompt, str) else list(prompt)
        except ValueError as e:  # PromptError, SourceError: this row's problem
            bad, first = bad + 1, first or f"row {rows - 1}: {e}"
            encoded.append([])
            continue
        encoded.append(ids if 0 < len(ids) <= options.max_prompt_tokens else [])
    long = sum(1 for e in encoded if not e) - bad
    usable = len(encoded) - bad - long
    where = f"--prompts {options.prompts} (--prompt-column {options.prompt_column!r})"
    if bad:
        log(f"prompts: {bad} of {rows} rows unusable, skipped; the first: {first}")
    if usable < 2 or bad > usable:
        raise TrainDraftError(f"{where}: only {usable} of {rows} rows give a prompt of at most "
                              f"{options.max_prompt_tokens} tokens" + (f" ({first})" if first else ""))
    split = split_prompts(encoded, options.heldout, options.max_heldout, order=options.prompt_order, seed=options.seed)
    split.train = [p for p in split.train if p[1]]
    split.heldout = [p for p in split.heldout if p[1]]
    log(f"prompts: {len(split.train)} for training, {len(split.heldout)} held out "
        f"({long} longer than {options.max_prompt_tokens} tokens skipped)")
    return split


def new_head(options: TrainDraftOptions, target, data, eos_ids, resume: dict | None):
    """A head for `target` over the checkpoint's draft vocabulary, or one chosen from the training data."""
    if resume is not None:
        d2t = resume["head"]["d2t"]
        draft_ids = d2t + torch.arange(len(d2t))
    else:
        draft_ids = vocab_for(data.train, target.config.get_text_config().vocab_size, prompts=options.train_on_prompt,
                              size=options.draft_vocab_size, always=tuple(eos_ids)).target_ids
    torch.manual_seed(options.seed)
    head = head_for_target(target, draft_target_ids=draft_ids, layer_ids=options.layers)
    # Frozen, the LM head stays the target's own rows (head_for_target): the head then learns only to move its
    # hidden state where the target's final state would be. Its weight is 40% of SmolLM2's head (6,400 x 576),
    # so steps run faster and fewer weights can learn the samples by heart (docs/eagle.md).
    head.lm_head.weight.requires_grad_(options.lm_head == "train")
    return head


def finish(options: TrainDraftOptions, head, target, data, heldout_states, state, loop: LoopOptions,
           feature_seconds: float) -> Summary:
    """Held-out replay, step costs, the saved head and the summary files."""
    t_eval = time.time()
    out = Path(options.out)
    head.to(device=target.device, dtype=torch.float32).eval()
    result = acceptance(head_matches(head, data.heldout, heldout_states, 5), data.heldout, k_max=5)
    context = int(sum(len(s.ids) for s in data.heldout) / len(data.heldout)) if data.heldout else 128
    costs = measure_costs(target, head, batch=8, context=context, k_max=5)
    trained = sum(p.numel() for p in head.parameters() if p.requires_grad)
    save_head(head.to(getattr(torch, options.save_dtype)), out, format=options.format, target_name=options.target,
              target_architectures=list(target.config.architectures or []))
    summary = Summary(
        target=options.target, out=str(out), format=options.format, config=head.config.to_dict(),
        trained_parameters=trained, prompts_used=data.prompts_used, prompts_total=data.prompts_total,
        train_samples=len(data.train), train_tokens=sum(len(s.ids) for s in data.train),
        generated_tokens=sum(s.new_tokens for s in data.train), temperature=options.temperature, labels=loop.labels,
        heldout_samples=len(data.heldout), eval_new_tokens=options.eval_new_tokens, generation_seconds=data.seconds,
        feature_seconds=feature_seconds, train_seconds=state.seconds, eval_seconds=time.time() - t_eval,
        steps=state.step, batch_size=loop.batch_size, ttt_steps=loop.ttt_steps, final_loss=state.loss,
        agreement=state.agreement, history=state.history, acceptance=asdict(result), costs=asdict(costs),
        lr=loop.lr, skipped_steps=state.skipped, positions_seen=state.positions, ttt_ramp=loop.ttt_ramp,
        feature_loss=loop.feature_loss,
    )
    atomic_write_text(out / "train_summary.json", json.dumps(asdict(summary), indent=2) + "\n")
    atomic_write_text(out / "train_summary.txt", render(summary) + "\n")
    return summary


def store_seconds(store: SampleStore) -> float:
    """Generation time already spent in earlier sessions of this run."""
    held = store.read("heldout.json") or {}
    return held.get("seconds", 0.0) + sum(c.get("seconds", 0.0) for c in store.chunks())


__all__ = ["TrainDraftOptions", "TrainDraftError", "run", "HeadError"]
