"""Per-row settings from input columns: `source.row_params={max_new_tokens: max_tokens, temperature: temp}`
maps a RowParams field to the column that sets it for its row (a null value: the job's setting).

    columns = RowParamColumns({"max_new_tokens": "max_tokens"})
    params, error = columns.params(row.values)   # RowParams, or an error naming the row's column

A value that is not a valid setting (a string where a number belongs, a negative max_new_tokens, a
temperature the sampler cannot use) is that row's error, naming the column and the setting; the rows
around it run. Rows with different settings share the batch: the engine verifies each row with its own.
"""

from __future__ import annotations

import json
from dataclasses import fields
from typing import Any, Mapping

from ..engine.types import RowParams
from . import ABSENT, BadValue

FIELDS = tuple(f.name for f in fields(RowParams))


class RowParamColumns:
    def __init__(self, mapping: Mapping[str, str]):
        unknown = [k for k in mapping if k not in FIELDS]
        if unknown:
            raise ValueError(f"source.row_params: {unknown[0]!r} is not a per-row setting; "
                             f"choose from {', '.join(FIELDS)}")
        bad = [k for k, c in mapping.items() if not isinstance(c, str) or not c]
        if bad:
            raise ValueError(f"source.row_params.{bad[0]}: need a column name")
        self.mapping = dict(mapping)

    @property
    def columns(self) -> list[str]:
        return list(dict.fromkeys(self.mapping.values()))

    @property
    def varies_sampling(self) -> bool:
        return any(name in self.mapping for name in RowParams.SAMPLING)

    def params(self, values: Mapping[str, Any]) -> tuple[RowParams | None, str | None]:
        """This row's RowParams (None when every mapped column is null), or an error naming the column."""
        given: dict[str, Any] = {}
        for name, column in self.mapping.items():
            value = values.get(column, ABSENT)
            if value is None or value is ABSENT:  # null or a JSONL object without the key: the job's setting
                continue
            where = f"source.row_params column {column!r} ({name})"
            if isinstance(value, BadValue):
                return None, f"{where} {value.reason}"
            if name == "choice" and isinstance(value, str):  # a JSON list in a text column
                try:
                    value = json.loads(value)
                except ValueError:
                    return None, f"{where}: {value[:80]!r} is not a JSON list of strings"
            if name == "stop":
                value = (value,) if isinstance(value, str) else value
                if not isinstance(value, (list, tuple)) or not all(isinstance(s, str) for s in value):
                    return None, f"{where}: {value!r} is not a string or a list of strings"
                value = tuple(value)
            if isinstance(value, float) and value.is_integer() and RowParams.LIMITS.get(name, (float,))[0] is int:
                value = int(value)  # 32.0 from a JSON number or a float column: 32 tokens
            given[name] = value
        if not given:
            return None, None
        params = RowParams(**given)
        problem = params.problem()
        if problem:
            name = next((n for n in self.mapping if problem.startswith(n)), None)
            where = f"source.row_params column {self.mapping[name]!r}" if name else "source.row_params"
            return None, f"{where}: {problem}"
        return params, None
