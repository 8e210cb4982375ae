"""Load a target (and optional draft) model with its tokenizer, and check that the pair can speculate.

A draft can only propose tokens the target understands: both must share the tokenizer's vocabulary
token for token (same size is not enough — a shuffled vocabulary has the same size) and the same
EOS ids. Embedding matrices may be padded beyond the tokenizer's vocabulary (to a multiple of 64,
say); the generator handles differing logit widths, so only the tokenizers are compared here.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from ...util.paths import missing_local_path, offline_hub_id

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
SUPPORTED_ATTENTION = ("sdpa", "eager")  # implementations that honour an explicit 4D per-row mask


class ModelLoadError(ValueError):
    """A model, tokenizer or target/draft pair that cannot be used; the message is one line."""


@dataclass(slots=True)
class Models:
    target: PreTrainedModel
    draft: PreTrainedModel | None
    tokenizer: PreTrainedTokenizerBase
    eos_token_ids: list[int]
    head: object | None = None  # an EAGLE-3 head (batchspec.eagle.EagleHead) for drafter "eagle"


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError as e:
        raise ModelLoadError(f"model.device={device!r} is not a device (use auto, cpu, cuda or cuda:N)") from e
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(f"model.device={device!r} but CUDA is not available on this machine")
    return resolved


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """`auto` is bfloat16 on a GPU that supports it (float16 otherwise) and float32 on CPU."""
    if dtype == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    if dtype not in DTYPES:
        raise ModelLoadError(f"model.dtype={dtype!r} is not one of auto, {', '.join(DTYPES)}")
    return DTYPES[dtype]


def load_model(
    name_or_path: str, *, dtype: torch.dtype, device: torch.device, trust_remote_code: bool = False
) -> PreTrainedModel:
    """`AutoModelForCausalLM.from_pretrained` on a local dir or hub id, in eval mode, with sdpa attention."""
    problem = missing_local_path(name_or_path) or offline_hub_id(name_or_path)
    if problem:
        raise ModelLoadError(f"cannot load model {name_or_path!r}: {problem}")
    load = partial(AutoModelForCausalLM.from_pretrained, name_or_path, dtype=dtype, trust_remote_code=trust_remote_code,
                   output_loading_info=True, ignore_mismatched_sizes=True)  # both checked below, in one line
    try:
        try:
            model, info = load(attn_implementation="sdpa")
        except ValueError as e:  # a model without sdpa attention (Gemma 2, gpt-oss): its eager attention
            if "scaled_dot_product_attention" not in str(e):
                raise
            model, info = load(attn_implementation="eager")
    except Exception as e:  # OSError, ValueError, safetensors' SafetensorError for a truncated file, ...
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelLoadError(f"cannot load model {name_or_path!r}: {first_line}") from e
    problem = loading_problem(info)
    if problem:
        raise ModelLoadError(f"cannot load model {name_or_path!r}: {problem}")
    attn = model.config._attn_implementation
    if attn not in SUPPORTED_ATTENTION:
        raise ModelLoadError(
            f"model {name_or_path!r} uses attention {attn!r}; batchspec needs one of {SUPPORTED_ATTENTION} "
            "(per-request cache lengths are expressed as an explicit 4D mask)"
        )
    return model.to(device).eval()


def loading_problem(info: dict) -> str | None:
    """What from_pretrained's loading info says is wrong with a checkpoint, or None. transformers fills
    missing and wrongly shaped weights with random values and only warns: the rows would be garbage.
    (Tied weights, such as an lm_head tied to the embeddings, are not listed as missing.)"""
    missing, unexpected = sorted(info.get("missing_keys") or ()), sorted(info.get("unexpected_keys") or ())
    mismatched = sorted(info.get("mismatched_keys") or ())
    if missing:
        return (f"the checkpoint lacks {len(missing)} weight(s) the model needs (e.g. {missing[0]}), which would be "
                "random: is a weights file missing or cut short?")
    if mismatched:
        key, stored, wanted = mismatched[0]
        return (f"{len(mismatched)} weight(s) have other shapes than config.json says (e.g. {key}: "
                f"{list(stored)} in the checkpoint, {list(wanted)} in the model): are these another model's weights?")
    if unexpected:
        return (f"the checkpoint holds {len(unexpected)} weight(s) the model does not have (e.g. {unexpected[0]}): "
                "are these another model's weights, or is config.json another model's?")
    errors = info.get("error_msgs") or []
    return str(errors[0]).strip().splitlines()[0] if errors else None


def load_tokenizer(name_or_path: str, *, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    try:
        return AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError, ImportError) as e:
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelLoadError(f"cannot load tokenizer of {name_or_path!r}: {first_line}") from e


def eos_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Every EOS id: the tokenizer's plus the generation config's (which may list several)."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    config_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if config_eos is not None:
        ids.update(int(i) for i in (config_eos if isinstance(config_eos, (list, tuple)) else [config_eos]))
    return sorted(ids)


def check_compatible(
    target_tokenizer: PreTrainedTokenizerBase,
    draft_tokenizer: PreTrainedTokenizerBase,
    target_eos: list[int],
    draft_eos: list[int],
    target_name: str = "target",
    draft_name: str = "draft",
) -> None:
    """Raise ModelLoadError naming the first token id where the two vocabularies differ, or differing EOS ids."""
    target_vocab = {i: t for t, i in target_tokenizer.get_vocab().items()}
    draft_vocab = {i: t for t, i in draft_tokenizer.get_vocab().items()}
    for token_id in range(max(len(target_vocab), len(draft_vocab), max(target_vocab, default=-1) + 1)):
        a, b = target_vocab.get(token_id), draft_vocab.get(token_id)
        if a != b:
            raise ModelLoadError(
                f"draft {draft_name!r} is incompatible with target {target_name!r}: token id {token_id} is "
                f"{a!r} in the target's vocabulary but {b!r} in the draft's"
            )
    if set(target_eos) != set(draft_eos):
        raise ModelLoadError(
            f"draft {draft_name!r} is incompatible with target {target_name!r}: EOS ids differ "
            f"(target {sorted(target_eos)}, draft {sorted(draft_eos)})"
        )


def load_models(
    target: str | PreTrainedModel,
    draft: str | PreTrainedModel | None = None,
    *,
    tokenizer: PreTrainedTokenizerBase | None = None,
    dtype: str = "auto",
    device: str = "auto",
    trust_remote_code: bool = False,
    head=None,
) -> Models:
    """Load target, optional draft and the target's tokenizer; check the pair is compatible. head: an
    EAGLE-3 head's folder (or a loaded EagleHead) for drafter "eagle", checked against the target.

    `target`/`draft` are a local directory or hub id, or an already-loaded model (then `tokenizer`
    must be given, and dtype/device are left as they are).
    """
    if isinstance(target, PreTrainedModel):
        if tokenizer is None:
            raise ModelLoadError("a loaded target model needs `tokenizer=` as well")
        target_model = target.eval()
        torch_device, torch_dtype = target_model.device, target_model.dtype
    else:
        torch_device = resolve_device(device)
        torch_dtype = resolve_dtype(dtype, torch_device)
        target_model = load_model(target, dtype=torch_dtype, device=torch_device, trust_remote_code=trust_remote_code)
        tokenizer = tokenizer or load_tokenizer(target, trust_remote_code=trust_remote_code)
    eos = eos_token_ids(target_model, tokenizer)

    draft_model = None
    if draft is not None:
        if isinstance(draft, PreTrainedModel):
            draft_model = draft.to(torch_device).eval()
            draft_tokenizer = tokenizer  # a loaded draft is assumed to share the target's tokenizer
        else:
            draft_model = load_model(draft, dtype=torch_dtype, device=torch_device, trust_remote_code=trust_remote_code)
            draft_tokenizer = load_tokenizer(draft, trust_remote_code=trust_remote_code)
        check_compatible(
            tokenizer, draft_tokenizer, eos, eos_token_ids(draft_model, draft_tokenizer),
            target_name=str(getattr(target_model, "name_or_path", target)),
            draft_name=str(getattr(draft_model, "name_or_path", draft)),
        )
        if draft_model.config._attn_implementation not in SUPPORTED_ATTENTION:
            raise ModelLoadError(f"draft attention {draft_model.config._attn_implementation!r} is not supported")
    if head is not None and not isinstance(head, torch.nn.Module):
        from ...eagle.formats import load_head  # deferred: only eagle jobs need it

        head = load_head(head, target_model, dtype=torch_dtype, device=torch_device)
    return Models(target=target_model, draft=draft_model, tokenizer=tokenizer, eos_token_ids=eos, head=head)


def model_max_positions(model) -> int | None:
    config = model.config.get_text_config()
    for name in ("max_position_embeddings", "n_positions"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None
