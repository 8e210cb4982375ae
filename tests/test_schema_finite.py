"""A JSON schema with no finite instance is refused before its row runs (engine/grammar/schema_finite.py); every
schema that has one passes the check (it is conservative: what it does not model counts as satisfiable)."""

import json

import pytest

import batchspec
from batchspec.engine.grammar.schema_finite import no_finite_instance
from batchspec.engine.types import RowParams
from tiny import PROMPTS

NODE = {"type": "object", "properties": {"x": {"$ref": "#/$defs/a"}}, "required": ["x"]}

ENDLESS = [  # schema -> the definitions named
    ({"$defs": {"a": NODE}, "$ref": "#/$defs/a"}, "#/$defs/a requires itself"),
    ({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}, "#/$defs/a requires itself"),
    ({"type": "object", "properties": {"self": {"$ref": "#"}}, "required": ["self"]}, "no finite JSON value"),
    ({"definitions": {"a": {"type": "array", "minItems": 1, "items": {"$ref": "#/definitions/b"}},
                      "b": {"type": "object", "properties": {"y": {"$ref": "#/definitions/a"}}, "required": ["y"]}},
      "$ref": "#/definitions/a"}, "#/definitions/a, #/definitions/b require each other"),
    ({"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}, {"allOf": [NODE]}]}}, "$ref": "#/$defs/a"}, "#/$defs/a"),
    (False, "no finite JSON value"),
]

FINITE = [  # schemas that have an instance, recursive or not
    {"$defs": {"a": {"type": "object", "properties": {"x": {"$ref": "#/$defs/a"}}}}, "$ref": "#/$defs/a"},  # x optional
    {"$defs": {"a": {"type": "object", "properties": {"x": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "null"}]}},
                     "required": ["x"]}}, "$ref": "#/$defs/a"},  # a linked list ends in null
    {"$defs": {"a": {"type": ["object", "string"], "properties": {"x": {"$ref": "#/$defs/a"}}, "required": ["x"]}},
     "$ref": "#/$defs/a"},  # a string ends it
    {"$defs": {"t": {"type": "array", "items": {"$ref": "#/$defs/t"}}}, "$ref": "#/$defs/t"},  # [] ends it
    {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}}, "required": ["kids"]},
    {"$ref": "#/$defs/missing"},  # not ours to judge: llguidance reports it
    {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a", "b"]},
    True, {}, "not json", [1, 2],
]


@pytest.mark.parametrize("schema,named", ENDLESS, ids=[n for _, n in ENDLESS])
def test_a_schema_with_no_finite_instance_is_named(schema, named):
    assert named in no_finite_instance(schema)
    assert named in no_finite_instance(json.dumps(schema))


@pytest.mark.parametrize("schema", FINITE, ids=range(len(FINITE)))
def test_a_schema_with_an_instance_passes(schema):
    assert no_finite_instance(schema) is None


def test_the_endless_schema_is_its_rows_error_before_it_runs(llama_pair):
    """Issue 58: this schema emitted '{' and ended with llguidance's `Too many items` after the row started."""
    results = batchspec.generate(PROMPTS[:2], target=str(llama_pair.target), max_new_tokens=4,
                                 params=[RowParams(json_schema=ENDLESS[0][0]), None])
    assert results[0].finish_reason == "error" and results[0].completion_tokens == 0
    assert results[0].error == ("json_schema: no output can match it: no finite JSON value matches it "
                                "(#/$defs/a requires itself with no way to end)")
    assert results[1].error is None and results[1].completion_tokens == 4
