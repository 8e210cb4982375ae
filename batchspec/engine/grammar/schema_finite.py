"""Whether a JSON schema has any finite instance, checked before its row runs.

A schema whose definitions require themselves (`{"$defs": {"a": {"type": "object", "properties": {"x":
{"$ref": "#/$defs/a"}}, "required": ["x"]}}, "$ref": "#/$defs/a"}`) compiles and gives a first mask: the row
emits `{"x":{"x":...` until llguidance's item limit ends it (issue 58: `'{'`, then `Too many items`). No
output can ever match it, so it is refused up front, naming the definitions that cannot end.

The check is a least fixpoint over the schema's local definitions: a definition has a finite instance when
some way through it (an alternative of anyOf/oneOf, a type of a list of types, an array of its minimum
length) reaches only schemas that have one. It is conservative: a keyword it does not model (`not`, `if`,
patterns, external `$ref`s) counts as satisfiable, so it refuses only schemas that surely have no instance;
everything else is left to llguidance.
"""

from __future__ import annotations

import json

PRIMITIVES = {"string", "number", "integer", "boolean", "null"}


def no_finite_instance(schema) -> str | None:
    """Why no finite JSON value matches this schema (naming the definitions that require themselves), or None.
    schema: a dict, a bool, or its JSON text; anything it cannot read is None (llguidance judges it)."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError:
            return None
    if not isinstance(schema, (dict, bool)):
        return None
    defs = {"#": schema}
    if isinstance(schema, dict):
        for key in ("$defs", "definitions"):
            for name, sub in (schema.get(key) or {}).items() if isinstance(schema.get(key), dict) else ():
                defs[f"#/{key}/{name}"] = sub
    finite = {ref: False for ref in defs}  # least fixpoint: nothing is known to end until shown
    changed = True
    while changed:
        changed = False
        for ref, sub in defs.items():
            if not finite[ref] and _finite(sub, finite):
                finite[ref] = changed = True
    if finite["#"]:
        return None
    stuck = sorted(ref for ref, ok in finite.items() if not ok and ref != "#")
    named = f" ({', '.join(stuck[:3])} require{'s' if len(stuck) == 1 else ''} " \
            f"{'itself' if len(stuck) == 1 else 'each other'} with no way to end)" if stuck else ""
    return f"no finite JSON value matches it{named}"


def _finite(schema, finite: dict[str, bool]) -> bool:
    """Whether `schema` has a finite instance, given which definitions are known to (finite[ref])."""
    if isinstance(schema, bool):
        return schema
    if not isinstance(schema, dict):
        return True
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref in finite and not finite[ref]:
        return False  # a sibling keyword cannot make a reference that never ends end
    if "const" in schema or "enum" in schema:
        return True  # a listed value, if any, is finite; an empty enum is llguidance's to refuse
    for key in ("allOf",):
        if isinstance(schema.get(key), list) and not all(_finite(s, finite) for s in schema[key]):
            return False
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list) and schema[key] and not any(_finite(s, finite) for s in schema[key]):
            return False
    types = schema.get("type")
    types = set(types) if isinstance(types, list) else {types} if isinstance(types, str) else None
    if types is None or types & PRIMITIVES:
        return True  # a value of another type meets object and array keywords vacuously
    return ("object" in types and _object_finite(schema, finite)) or \
           ("array" in types and _array_finite(schema, finite))


def _object_finite(schema: dict, finite: dict[str, bool]) -> bool:
    properties = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    required = schema.get("required") if isinstance(schema.get("required"), list) else []
    return all(_finite(properties.get(name, True), finite) for name in required if isinstance(name, str))


def _array_finite(schema: dict, finite: dict[str, bool]) -> bool:
    least = schema.get("minItems", 0)
    least = least if isinstance(least, int) else 0
    prefix = schema.get("prefixItems") if isinstance(schema.get("prefixItems"), list) else []
    items = schema.get("items", True)
    if isinstance(items, list):  # draft 4-7 tuple form
        prefix, items = items, schema.get("additionalItems", True)
    needed = prefix[:least]
    return all(_finite(s, finite) for s in needed) and (least <= len(prefix) or _finite(items, finite))
