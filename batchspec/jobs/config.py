"""The job config schema: dataclasses registered in Hydra's ConfigStore.

conf/config.yaml starts from `batchspec_schema`, so every key below is typed and closed: a misspelled
key or a value of the wrong type fails with Hydra's own message while the config is composed, before
any model loads. Only the job runner's entry (cli.py, checks.py) reads the composed config; everything else takes plain arguments.

Job files (`job=NAME`) are registered here too: every `*.yaml` in the shipped `jobs/` folder, in
`./jobs` of the current directory and in the folders listed in $BATCHSPEC_JOBS_DIR becomes the
option NAME of the `job` group, in Hydra's `_global_` package (a job file sets any key of the schema).
"""

from __future__ import annotations

import dataclasses
import os
import typing
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from ..engine.drafters.registry import DRAFTERS, needs_draft

PACKAGE_DIR = Path(__file__).resolve().parent.parent
REPO_ROOT = PACKAGE_DIR.parent


def shipped_dir(name: str) -> Path:
    """conf/ or jobs/: at the top of a source checkout (also behind an editable install), and inside the
    package as _conf/ or _jobs/ once installed from a wheel or `pip install .` (pyproject.toml maps them)."""
    installed = PACKAGE_DIR / f"_{name}"
    return installed if installed.is_dir() else REPO_ROOT / name


CONF_DIR = shipped_dir("conf")
SHIPPED_JOBS_DIR = shipped_dir("jobs")
ASSETS_DIR = PACKAGE_DIR / "assets"


class ConfigError(ValueError):
    """A config that composes but cannot run (a contradiction between keys); the message is one line."""


# The drafters' names as the schema's choices, from the drafter registry (engine/drafters/registry.py).
DrafterName = Enum("DrafterName", {name: name for name in DRAFTERS})


class SourceFormat(Enum):
    auto = "auto"
    parquet = "parquet"
    hf = "hf"
    jsonl = "jsonl"
    openai = "openai"  # an OpenAI batch input file: custom_id, url, body per line (docs/run_batch.md)


class Dtype(Enum):
    auto = "auto"
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


class Verify(Enum):
    coupled = "coupled"  # each token is the target's own seeded draw: output independent of drafter and k
    rejection = "rejection"  # Leviathan's rejection sampling: best acceptance, output changes with drafter and k


class Compile(Enum):
    auto = "auto"  # CUDA graphs on a GPU, eager on CPU
    on = "on"  # CUDA graphs on a GPU, torch.compile (inductor) on CPU
    inductor = "inductor"  # forwards compiled by inductor, then captured, on first use (GPU; on CPU as on)
    off = "off"  # eager forwards everywhere
    static = "static"  # the captured path's static shapes, run eagerly (to tell a capture problem from a shape one)


class OutputFormat(Enum):
    parquet = "parquet"
    openai = "openai"  # also results.jsonl in the OpenAI batch output format, once every shard has finished


class OutputOrder(Enum):
    finish = "finish"  # each row as soon as it is done (sort by `position` for input order)
    input = "input"  # rows written in input order within a run (held until the rows before them are done)


class ProgressMode(Enum):
    auto = "auto"  # a tqdm bar on a terminal, periodic log lines otherwise (SLURM, cron)
    bar = "bar"
    log = "log"
    off = "off"


@dataclass
class ModelConfig:
    target: str = MISSING  # local dir or hub id
    draft: Optional[str] = None  # needed by drafter=model
    dtype: Dtype = Dtype.auto
    device: str = "auto"  # auto, cpu, cuda, cuda:N
    trust_remote_code: bool = False
    compile: Compile = Compile.auto  # capture the decode / verify / draft steps (see batchspec/engine/model/runner.py)


@dataclass
class DrafterConfig:
    name: DrafterName = DrafterName.none
    k: int = 4  # most draft tokens per request per round (ignored by drafter=none)
    adaptive: Optional[bool] = None  # pick 0..k drafts per round from acceptance and measured round cost; null = on when greedy or coupled
    tree: Optional[str] = None  # tree drafts "BxD" (branching x depth), several comma-separated; null = chains only
    # drafter=suffix: a warm start (an earlier output dir, or Parquet/JSONL texts) and the bound of its tree
    corpus: Optional[str] = None
    corpus_max_tokens: int = 200_000
    # drafter=eagle with model.draft=train: the first train_rows rows decode with the fallback drafter and
    # train an EAGLE-3 head for about train_minutes (null: as long as those rows took, 1 to 10 minutes, at
    # most 15% of the rest of the job's projected time, none under 10 s); the rest draft with the head, or
    # with the fallback again if the head's trial rows ran slower (docs/eagle.md)
    train_rows: int = 512
    train_minutes: Optional[float] = None
    fallback: DrafterName = DrafterName.suffix  # none, ngram, prompt_lookup or suffix


@dataclass
class SamplingConfig:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    max_new_tokens: int = 128
    stop: List[str] = field(default_factory=list)
    seed: int = 0
    verify: Verify = Verify.coupled  # how sampled drafts are verified (docs/how_it_works.md: Sampling)
    n: int = 1  # samples per prompt: n rows per input row, by sample_index (needs temperature > 0)
    logprobs: Optional[int] = None  # K: each completion token's logprob and its K best alternatives
    prompt_logprobs: Optional[int] = None  # K: the same for the prompt's tokens
    keep_stop: bool = False  # keep the stop string that ended a row in its completion
    # Structured output (docs/structured.md), at most one; source.row_params may set any of them per row.
    json_schema: Any = None  # a JSON schema: a mapping here, or its JSON text
    regex: Optional[str] = None
    choice: Optional[List[str]] = None  # the output is one of these strings
    grammar: Optional[str] = None  # a Lark grammar (llguidance's dialect)
    json_object: bool = False  # any JSON object


@dataclass
class SourceConfig:
    path: str = MISSING  # Parquet file / folder / glob, saved HF dataset dir or dataset name, JSONL file
    format: SourceFormat = SourceFormat.auto
    split: str = "train"  # for HF datasets
    prompt_column: Optional[str] = "prompt"  # text, token ids, or (chat=true) a list of messages
    id_column: Optional[str] = None  # default: the row's position in the input, as a string
    template: Optional[str] = None  # Jinja2 over the row's columns, e.g. "Q: {{ question }}\nA:"
    chat: bool = False  # render the prompt with the tokenizer's chat template
    keep_columns: List[str] = field(default_factory=list)  # copied into the output rows
    limit: Optional[int] = None  # only the first `limit` rows of the input (before sharding)
    # Skip input files that cannot be read (a corrupt Parquet file or page, a truncated .gz) instead of
    # stopping there; skipped files are listed in summary.json, the shard marker and batchspec.status.
    skip_unreadable: bool = False
    # Per-row settings from columns: setting -> column, e.g. {max_new_tokens: max_tokens, temperature: temp}
    # (max_new_tokens, temperature, top_p, top_k, min_p, stop, seed, n, logprobs, prompt_logprobs,
    # json_schema (JSON text), regex, choice (a list, or its JSON text), grammar, json_object)
    row_params: Dict[str, str] = field(default_factory=dict)


@dataclass
class OutputConfig:
    dir: str = "outputs/${hydra:runtime.choices.job}"  # stable per job: rerun = resume
    rows_per_file: int = 1000
    # Also write a part once the oldest buffered row has waited this many seconds: bounds the
    # work a SIGKILL (OOM killer, node failure) can lose when rows are slow.
    flush_every_s: float = 300.0
    order: OutputOrder = OutputOrder.finish
    format: OutputFormat = OutputFormat.parquet
    model_name: Optional[str] = None  # format=openai: the `model` the responses name (default: model.target)


@dataclass
class ShardConfig:
    index: Optional[int] = None  # default: $SLURM_ARRAY_TASK_ID - $SLURM_ARRAY_TASK_MIN, else 0
    count: Optional[int] = None  # default: $SLURM_ARRAY_TASK_COUNT, else 1


@dataclass
class ProgressConfig:
    mode: ProgressMode = ProgressMode.auto
    every_s: float = 30.0  # seconds between log lines in log mode


@dataclass
class JobConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    drafter: DrafterConfig = field(default_factory=DrafterConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    source: SourceConfig = field(default_factory=SourceConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    shard: ShardConfig = field(default_factory=ShardConfig)
    progress: ProgressConfig = field(default_factory=ProgressConfig)
    batch_size: int = 8
    spare_slots: int = 0  # cache slots beyond batch_size whose prompts are prefilled ahead, in waves (CPU)
    max_seq_len: Optional[int] = None  # prompt + completion tokens per slot; default min(model limit, 2048)
    threads: Optional[int] = None  # torch CPU threads (torch.set_num_threads); null = torch's default
    retry_errors: bool = False  # rerun this shard's rows whose result was an error, replacing them


TRAIN = "train"  # model.draft=train with drafter=eagle: the job trains its own head


def self_training(job: JobConfig) -> bool:
    return job.drafter.name == DrafterName.eagle and job.model.draft == TRAIN


def draft_path(job: JobConfig) -> str | None:
    """model.draft where the drafter reads it (a draft model, or an EAGLE head's folder), else None."""
    if needs_draft(job.drafter.name.value) and not self_training(job):
        return job.model.draft
    return None


def job_dirs(cwd: Path) -> list[Path]:
    """Folders whose *.yaml files are jobs, later ones overriding earlier ones of the same name."""
    dirs = [SHIPPED_JOBS_DIR, cwd / "jobs"]
    dirs += [Path(p) for p in os.environ.get("BATCHSPEC_JOBS_DIR", "").split(os.pathsep) if p]
    unique: list[Path] = []
    for d in dirs:
        if d.is_dir() and d.resolve() not in [u.resolve() for u in unique]:
            unique.append(d)
    return unique


def plain_job_name(name: str) -> bool:
    """A job name is a plain folder name: the default output.dir is outputs/NAME, so `..` (a file named
    `...yaml`) would write into the current directory, and `a/b` or `.x` somewhere unexpected."""
    return bool(name) and not name.startswith(".") and not any(c in name for c in "/\\\0")


def find_jobs(dirs: list[Path]) -> dict[str, Path]:
    """Job name -> file, over `dirs` (a later folder wins on a name clash). Files whose names are not
    plain job names (plain_job_name) are left out."""
    jobs: dict[str, Path] = {}
    for d in dirs:
        for path in sorted(d.glob("*.yaml")):
            if plain_job_name(path.stem):
                jobs[path.stem] = path
    return jobs


def register_configs(jobs: dict[str, Path]) -> None:
    """Store the schema and each job file in Hydra's ConfigStore, and add the `${assets:...}`
    resolver (a path inside batchspec/assets, so shipped jobs run from any directory)."""
    OmegaConf.register_new_resolver("assets", lambda rel: str(ASSETS_DIR / rel), replace=True)
    cs = ConfigStore.instance()
    cs.store(name="batchspec_schema", node=JobConfig)
    for name, path in jobs.items():
        try:
            node = OmegaConf.load(path)
        except Exception as e:  # yaml.YAMLError and friends
            raise ConfigError(f"{path}: {str(e).strip().splitlines()[0]}") from e
        yaml_words_as_choices(node, JobConfig)
        cs.store(group="job", name=name, node=node, package="_global_")


def yaml_words_as_choices(node: Any, schema: type) -> None:
    """YAML 1.1 reads an unquoted off / on / no / yes as a boolean, so `progress.mode: off` in a job file
    arrives as False: give an enum field whose choices include off / on the choice the user wrote."""
    if not isinstance(node, DictConfig):
        return
    hints = typing.get_type_hints(schema)
    for key in list(node.keys()):
        kind = hints.get(str(key))
        if kind is None or OmegaConf.is_interpolation(node, key):
            continue
        if dataclasses.is_dataclass(kind):
            yaml_words_as_choices(node[key], kind)
        elif isinstance(kind, type) and issubclass(kind, Enum) and isinstance(node[key], bool):
            word = {False: "off", True: "on"}[node[key]]
            if word in kind.__members__:
                node[key] = word
