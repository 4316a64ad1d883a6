"""JSON Schemas as clients send them, read into what the grammar engine enforces.

Clients send schemas written for other tools: annotation keys that are no JSON Schema keyword (`javaType`,
`preferredOrder`, `x-...`), draft-04's spellings (`id`, `definitions`, boolean `exclusiveMinimum`). A validator
ignores a key it does not know, so the schema's meaning does not change by it: such keys are dropped from what
the engine compiles and reported (never silently). A key that looks like a misspelt constraining keyword
(`propertis`, `minimun`) stays an error: ignoring it would leave the answer less constrained than meant.
A `format` the engine does not know (`byte`, `regex`, `int64` on a string) is an annotation too: JSON Schema
2019-09 on asserts no format by default and draft 7 leaves it optional, so it is dropped and noted. `dependencies`
(and `dependentRequired` / `dependentSchemas`) are rewritten to the `anyOf` they mean, which the engine enforces.
"""

from __future__ import annotations

import difflib
import re
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


# the string formats llguidance enforces (1.9); any other is refused by it unless dropped as an annotation
ENFORCED_FORMATS = frozenset(
    ["date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uri", "uuid"]
)
# ECMA-262's named group, valid in a JSON Schema pattern (and in llguidance's regex), spelt (?P<..> in Python's
_ECMA_GROUP = re.compile(r"\(\?<(?=[A-Za-z_])")

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
    formats: list[str] = []
    out = _read(schema, "#", dropped, formats)
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
    notes = []
    if dropped:
        notes.append(f"schema keys that are no JSON Schema keyword, ignored: {_named(dropped)}")
    if formats:
        notes.append(f"formats the engine does not enforce, read as annotations: {_named(formats)}")
    return ReadSchema(out, tuple(notes))


def _named(paths: list[str]) -> str:
    more = f" and {len(paths) - _NOTED} more" if len(paths) > _NOTED else ""
    return ", ".join(paths[:_NOTED]) + more


def _resembles(key: str) -> str | None:
    """The constraining keyword `key` looks like a misspelling of (None: none)."""
    if key.startswith("x-") or key == "id":
        return None
    if key.lower() in _CONSTRAINING_LOWER:
        return _CONSTRAINING_LOWER[key.lower()]
    close = difflib.get_close_matches(key, _CONSTRAINING, n=1, cutoff=0.85)
    return close[0] if close else None


def _read(node: Any, path: str, dropped: list[str], formats: list[str]) -> Any:
    if not isinstance(node, Mapping):
        return node  # a boolean schema, or a value the meta-schema check refuses
    out: dict[str, Any] = {}
    for key, value in node.items():
        where = f"{path}/{key}"
        if key not in KEYWORDS:  # draft-04's `id` too: local $refs resolve against the document's root
            dropped.append(where)
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            out[key] = [_read(sub, f"{where}/{i}", dropped, formats) for i, sub in enumerate(value)]
        elif key in _SCHEMA_MAPS and isinstance(value, Mapping):
            out[key] = {name: _read(sub, f"{where}/{name}", dropped, formats) for name, sub in value.items()}
        elif key in _SCHEMA_ONE:
            out[key] = _read(value, where, dropped, formats)
        elif key == "dependencies" and isinstance(value, Mapping):
            out[key] = {
                name: sub if isinstance(sub, list) else _read(sub, f"{where}/{name}", dropped, formats)
                for name, sub in value.items()
            }
        else:
            out[key] = value
    if isinstance(out.get("format"), str) and out["format"] not in ENFORCED_FORMATS and _may_be_string(out):
        formats.append(f"{path}/format ({out.pop('format')})")
    if out.get("propertyNames") in (True, {}, {"type": "string"}):
        del out["propertyNames"]  # every key of a JSON object is a string: it holds of every value
    _dependencies_as_any_of(out)
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


def _may_be_string(node: Mapping[str, Any]) -> bool:
    """Whether `node`'s type admits a string (the engine ignores a format on a number: int32, double)."""
    kind = node.get("type")
    return kind is None or kind == "string" or (isinstance(kind, list) and "string" in kind)


def _dependencies_as_any_of(node: dict[str, Any]) -> None:
    """Draft-07's `dependencies` and 2019-09's `dependentRequired` / `dependentSchemas`, which the engine does
    not implement, as the `allOf` of `anyOf`s they mean: the property absent, or what it requires holds."""
    rules: list[tuple[str, Any]] = []
    for key in ("dependencies", "dependentRequired", "dependentSchemas"):
        value = node.get(key)
        if isinstance(value, Mapping):
            del node[key]
            for name, needs in value.items():
                rules.append((name, {"required": needs} if isinstance(needs, list) else needs))
    # an empty list or schema requires nothing: no branch to add
    rules = [(n, s) for n, s in rules if s not in ({"required": []}, {}, True)]
    if rules:
        node["allOf"] = [
            *node.get("allOf", []),
            *({"anyOf": [{"properties": {n: False}}, s]} for n, s in rules),
        ]


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
    formats = jsonschema.FormatChecker()

    # a pattern is an ECMA-262 regex: its named groups are no error, though Python's re spells them (?P<
    @formats.checks("regex", raises=re.error)
    def _ecma_regex(value: object) -> bool:
        return not isinstance(value, str) or re.compile(_ECMA_GROUP.sub("(?P<", value)) is not None

    try:
        cls.check_schema(schema, format_checker=formats)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.path) or "(the root)"
        raise GrammarError(
            f"not a valid JSON Schema at {where}: {exc.message}", hint="fix the schema"
        ) from None
