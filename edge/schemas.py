"""JSON Schemas as clients send them, read into what the grammar engine enforces.

Clients send schemas written for other tools: annotation keys that are no JSON Schema keyword (`javaType`,
`preferredOrder`, `x-...`), draft-04's spellings (`id`, `definitions`, boolean `exclusiveMinimum`). A validator
ignores a key it does not know, so the schema's meaning does not change by it: such keys are dropped from what
the engine compiles and reported (never silently). A key that looks like a misspelt constraining keyword
(`propertis`, `minimun`) stays an error: ignoring it would leave the answer less constrained than meant.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from edge.errors import GrammarError

__all__ = ["KEYWORDS", "ReadSchema", "check_schema", "read_schema", "unknown_keywords"]

# keywords that say nothing of which values are valid: a key that resembles one of these is harmless
ANNOTATIONS = frozenset(
    [
        "$schema",
        "$id",
        "$anchor",
        "$vocabulary",
        "$comment",
        "title",
        "description",
        "default",
        "examples",
        "deprecated",
        "readOnly",
        "writeOnly",
        "contentEncoding",
        "contentMediaType",
        "contentSchema",
    ]
)

# JSON Schema's vocabulary (2020-12 with draft 7's spellings): a key outside it constrains nothing in a
# validator, so a misspelt keyword ("propertis") would leave the answer silently unconstrained
KEYWORDS = ANNOTATIONS | frozenset(
    [
        "$ref",
        "$defs",
        "$dynamicRef",
        "$dynamicAnchor",
        "$recursiveRef",
        "$recursiveAnchor",
        "definitions",
        "type",
        "enum",
        "const",
        "multipleOf",
        "maximum",
        "exclusiveMaximum",
        "minimum",
        "exclusiveMinimum",
        "maxLength",
        "minLength",
        "pattern",
        "format",
        "maxItems",
        "minItems",
        "uniqueItems",
        "maxContains",
        "minContains",
        "maxProperties",
        "minProperties",
        "required",
        "dependentRequired",
        "dependencies",
        "properties",
        "patternProperties",
        "additionalProperties",
        "propertyNames",
        "items",
        "prefixItems",
        "additionalItems",
        "contains",
        "unevaluatedItems",
        "unevaluatedProperties",
        "allOf",
        "anyOf",
        "oneOf",
        "not",
        "if",
        "then",
        "else",
        "dependentSchemas",
    ]
)
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_ONE = [
    "additionalProperties",
    "propertyNames",
    "contains",
    "unevaluatedItems",
    "unevaluatedProperties",
    "not",
    "if",
    "then",
    "else",
    "additionalItems",
    "contentSchema",
    "items",
]
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")


def unknown_keywords(schema: Any, path: str = "#") -> list[str]:
    """JSON pointers of the keys that are no JSON Schema keyword (extensions named `x-...` are allowed)."""
    if not isinstance(schema, Mapping):
        return []
    found = [f"{path}/{k}" for k in schema if k not in KEYWORDS and not str(k).startswith("x-")]
    for key in _SCHEMA_MAPS:
        if isinstance(schema.get(key), Mapping):
            for name, sub in schema[key].items():
                found += unknown_keywords(sub, f"{path}/{key}/{name}")
    for key in _SCHEMA_ONE:
        found += unknown_keywords(schema.get(key), f"{path}/{key}")
    for key in _SCHEMA_LISTS:
        if isinstance(schema.get(key), list):
            for i, sub in enumerate(schema[key]):
                found += unknown_keywords(sub, f"{path}/{key}/{i}")
    return found


_CONSTRAINING = sorted(KEYWORDS - ANNOTATIONS)
_CONSTRAINING_LOWER = {k.lower(): k for k in _CONSTRAINING}
_NOTED = 8  # paths named in one note at most


@dataclass(frozen=True)
class ReadSchema:
    """A client's schema as the engine compiles it, and what was dropped from it, said in `notes`."""

    schema: dict[str, Any]
    notes: tuple[str, ...] = ()


def read_schema(schema: Mapping[str, Any]) -> ReadSchema:
    """`schema` with its annotation keys dropped and other drafts' spellings read as 2020-12's; GrammarError
    where a key looks like a misspelt constraining keyword, or where the schema is no valid JSON Schema."""
    dropped: list[str] = []
    out = _read(schema, "#", dropped)
    if not isinstance(out, dict):
        raise GrammarError(f"a JSON Schema is an object, not {type(schema).__name__}")
    misspelt = [(p, _resembles(p.rsplit("/", 1)[1])) for p in dropped]
    misspelt = [(p, k) for p, k in misspelt if k is not None]
    if misspelt:
        named = ", ".join(f"{p} (did you mean {k!r}?)" for p, k in misspelt[:_NOTED])
        raise GrammarError(
            f"not a JSON Schema keyword: {named}", hint="fix its spelling, or name an extension x-..."
        )
    out.pop("$schema", None)  # read as 2020-12 from here on (the spellings above translated)
    check_schema(out)
    if not dropped:
        return ReadSchema(out)
    more = f" and {len(dropped) - _NOTED} more" if len(dropped) > _NOTED else ""
    note = f"schema keys that are no JSON Schema keyword, ignored: {', '.join(dropped[:_NOTED])}{more}"
    return ReadSchema(out, (note,))


def _resembles(key: str) -> str | None:
    """The constraining keyword `key` looks like a misspelling of (None: none)."""
    if key.startswith("x-") or key == "id":
        return None
    if key.lower() in _CONSTRAINING_LOWER:
        return _CONSTRAINING_LOWER[key.lower()]
    close = difflib.get_close_matches(key, _CONSTRAINING, n=1, cutoff=0.85)
    return close[0] if close else None


def _read(node: Any, path: str, dropped: list[str]) -> Any:
    if not isinstance(node, Mapping):
        return node  # a boolean schema, or a value the meta-schema check refuses
    out: dict[str, Any] = {}
    for key, value in node.items():
        where = f"{path}/{key}"
        if key not in KEYWORDS:  # draft-04's `id` too: local $refs resolve against the document's root
            dropped.append(where)
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            out[key] = [_read(sub, f"{where}/{i}", dropped) for i, sub in enumerate(value)]
        elif key in _SCHEMA_MAPS and isinstance(value, Mapping):
            out[key] = {name: _read(sub, f"{where}/{name}", dropped) for name, sub in value.items()}
        elif key in _SCHEMA_ONE:
            out[key] = _read(value, where, dropped)
        else:
            out[key] = value
    if isinstance(out.get("items"), list):  # drafts 04-07's tuple: 2020-12's prefixItems
        out["prefixItems"] = out.pop("items")
        if "additionalItems" in out:
            out["items"] = out.pop("additionalItems")
    for bound, limit in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(out.get(bound), bool):  # draft-04: a flag on minimum / maximum
            exclusive = out.pop(bound)
            if exclusive and limit in out:
                out[bound] = out.pop(limit)
    return out


def check_schema(schema: Mapping[str, Any]) -> None:
    """A schema that is not valid JSON Schema (2020-12 meta-schema), or holds a key that is no keyword (a
    misspelling a validator would ignore), is an error naming the key's path."""
    unknown = unknown_keywords(schema)
    if unknown:
        raise GrammarError(
            f"not a JSON Schema keyword: {', '.join(unknown[:8])}",
            hint="fix its spelling, or name an extension x-...",
        )
    import jsonschema

    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.path) or "(the root)"
        raise GrammarError(
            f"not a valid JSON Schema at {where}: {exc.message}", hint="fix the schema"
        ) from None
