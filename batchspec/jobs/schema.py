"""The columns of a job's part files (one per Result field, then the input position) and the keys of
their Parquet metadata."""

from __future__ import annotations

import pyarrow as pa

from ..sources.rows import POSITION_COLUMN
from ..engine.types import RESULT_COLUMNS

COLUMN_TYPES = {
    "id": pa.string(),
    "prompt": pa.string(),
    "completion": pa.string(),
    "completion_token_ids": pa.list_(pa.int32()),
    "finish_reason": pa.string(),
    "error": pa.string(),
    "prompt_tokens": pa.int64(),
    "completion_tokens": pa.int64(),
    "target_forwards": pa.int64(),
    "draft_tokens": pa.int64(),
    "accepted_tokens": pa.int64(),
    "acceptance_rate": pa.float64(),
    "tokens_per_forward": pa.float64(),
    "accepted_per_round": pa.list_(pa.int32()),
    "drafts_per_round": pa.list_(pa.int32()),
    "tree_per_round": pa.list_(pa.string()),
    "latency_s": pa.float64(),
    "sample_index": pa.int32(),  # which of the row's n samples (sampling.n)
    "stop_reason": pa.string(),  # the stop string that ended the row (finish "stop"), else null
    "stop_token_id": pa.int64(),  # the EOS token that ended it, else null
    "logprobs": pa.list_(pa.float32()),  # sampling.logprobs: per completion token (null when not asked)
    "top_logprobs": pa.list_(pa.list_(pa.float32())),
    "top_logprob_ids": pa.list_(pa.list_(pa.int32())),
    "prompt_logprobs": pa.list_(pa.float32()),  # sampling.prompt_logprobs: per prompt token, the first null
    "prompt_top_logprobs": pa.list_(pa.list_(pa.float32())),
    "prompt_top_logprob_ids": pa.list_(pa.list_(pa.int32())),
    "forced_tokens": pa.int64(),  # structured output: drafts the grammar forced (in draft_tokens too)
    "forced_accepted": pa.int64(),  # structured output: of those, the ones the target accepted
    "structured_complete": pa.bool_(),  # constrained rows: the output matches whole (false: cut short); else null
}
# Result fields in their order, then the input position (a job's rows carry it in Result.extra).
RESULT_SCHEMA = pa.schema([(name, COLUMN_TYPES[name]) for name in RESULT_COLUMNS] + [(POSITION_COLUMN, pa.int64())])

# Columns added after outputs were written without them: a part that lacks one is still a part (a job
# resumed across the upgrade keeps its rows); summaries count them where they are.
LATER_COLUMNS = frozenset({"forced_accepted"})

META_KEY = b"batchspec"
CONFIG_KEY = b"batchspec.config"  # JSON: the configuration that produced a part's rows (shard.output_config)
FINGERPRINT_KEY = b"batchspec.fingerprint"  # JSON: job.json's fingerprint, the keys that decide the rows


def output_schema(keep: pa.Schema | None = None) -> pa.Schema:
    """The Result columns, then the keep columns with their input types."""
    fields = list(RESULT_SCHEMA)
    for f in keep or []:
        if f.name in RESULT_SCHEMA.names:
            raise ValueError(f"source.keep_columns: {f.name!r} is also an output column; rename it in the input")
        fields.append(pa.field(f.name, f.type))
    return pa.schema(fields)
