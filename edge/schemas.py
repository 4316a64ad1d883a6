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
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

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
_ENFORCED_FORMATS = frozenset(
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
    _disjoint_one_of_as_any_of(out, out)
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
    if isinstance(out.get("format"), str) and out["format"] not in _ENFORCED_FORMATS and _may_be_string(out):
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


# keys whose values are data, not subschemas: a `oneOf` inside one of them is no keyword
_DATA_KEYS = frozenset(["const", "enum", "default", "examples"])
_TYPES = frozenset(["null", "boolean", "object", "array", "number", "string"])  # integer is a number


def _disjoint_one_of_as_any_of(node: Any, root: dict[str, Any]) -> None:
    """Each `oneOf` whose branches no value can match two of, as the `anyOf` it then equals. The engine proves
    this only where each branch names its own type: it refuses a `oneOf` of a `$ref` and an array of it, or
    of objects told apart by a required key, which real schemas are full of. A `oneOf` not proven so stays."""
    if isinstance(node, list):
        for sub in node:
            _disjoint_one_of_as_any_of(sub, root)
        return
    if not isinstance(node, dict):
        return
    for key, sub in node.items():
        if key not in _DATA_KEYS:
            _disjoint_one_of_as_any_of(sub, root)
    branches = node.get("oneOf")
    if not isinstance(branches, list):
        return
    pairs = [(a, b) for i, a in enumerate(branches) for b in branches[i + 1 :]]
    if all(_disjoint(a, b, root) for a, b in pairs):
        del node["oneOf"]
        if "anyOf" in node:  # both hold: the proven oneOf joins as an allOf member
            node["allOf"] = [*node.get("allOf", []), {"anyOf": branches}]
        else:
            node["anyOf"] = branches


def _disjoint(a: Any, b: Any, root: dict[str, Any]) -> bool:
    """Whether no JSON value matches both schemas, proven from their types, values and object keys (False:
    not proven). Sound only: each test reads constraints a schema holds, never ones it lacks."""
    common = _types(a, root) & _types(b, root)
    if not common:
        return True
    for values, other in ((_values(a, root), b), (_values(b, root), a)):
        if values is not None:  # a few named values: disjoint where none of them validates against the other
            return not any(_admits(root, other, json.loads(v)) for v in values)
    if common != {"object"}:
        return False
    fa, fb = _target(a, root), _target(b, root)
    return _keyed_apart(fa, fb, root) or _keyed_apart(fb, fa, root)


def _admits(root: dict[str, Any], node: Any, value: Any) -> bool:
    """Whether `value` validates against `node`, a subschema of `root` (True where it cannot be told)."""
    import jsonschema

    try:
        return jsonschema.Draft202012Validator(root).evolve(schema=node).is_valid(value)
    except Exception:  # a regex Python's re does not read, a $ref it cannot resolve: not proven apart
        return True


def _keyed_apart(a: Any, b: Any, root: dict[str, Any]) -> bool:
    """Objects of `a` and `b` differ by a key `a` requires: `b` forbids it, or requires it with other values."""
    if not isinstance(a, Mapping) or not isinstance(b, Mapping) or not isinstance(a.get("required"), list):
        return False
    props_a, props_b = a.get("properties", {}), b.get("properties", {})
    closed = b.get("additionalProperties") is False and not b.get("patternProperties")
    for key in a["required"]:
        if props_b.get(key) is False or (closed and key not in props_b):
            return True
        if key in props_a and key in props_b and key in b.get("required", []):
            values_a, values_b = _values(props_a[key], root), _values(props_b[key], root)
            if values_a is not None and values_b is not None and not values_a & values_b:
                return True
    return False


def _types(node: Any, root: dict[str, Any], depth: int = 0) -> frozenset[str]:
    """The JSON types a value of `node` can have (all where not known)."""
    if node is False:
        return frozenset()
    if not isinstance(node, Mapping) or depth > 32:
        return _TYPES
    out = _TYPES
    kind = node.get("type")
    if isinstance(kind, (str, list)):
        out &= {"number" if k == "integer" else k for k in ([kind] if isinstance(kind, str) else kind)}
    values = _values(node, root, depth)
    if values is not None:
        out &= {_type_of(json.loads(v)) for v in values}
    if isinstance(node.get("$ref"), str):
        out &= _types(_resolve(root, node["$ref"]), root, depth + 1)
    for key in ("anyOf", "oneOf"):
        if isinstance(node.get(key), list):
            out &= frozenset().union(*(_types(sub, root, depth + 1) for sub in node[key]))
    for sub in node.get("allOf", []) if isinstance(node.get("allOf"), list) else []:
        out &= _types(sub, root, depth + 1)
    return out


def _values(node: Any, root: dict[str, Any], depth: int = 0) -> frozenset[str] | None:
    """The values `node` admits as canonical JSON texts, where it names them (`const`, `enum`); else None."""
    if not isinstance(node, Mapping) or depth > 32:
        return None
    found: frozenset[str] | None = None
    if "const" in node:
        found = frozenset([_canonical(node["const"])])
    if isinstance(node.get("enum"), list):
        enum = frozenset(_canonical(v) for v in node["enum"])
        found = enum if found is None else found & enum
    if found is None and isinstance(node.get("$ref"), str):
        return _values(_resolve(root, node["$ref"]), root, depth + 1)
    return found


def _canonical(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # 1.0 and 1 are the same JSON Schema value
    return json.dumps(value, sort_keys=True)


def _type_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "string", list: "array", dict: "object"}[type(value)]


def _target(node: Any, root: dict[str, Any]) -> Any:
    """`node`, or what it refers to where it is only a `$ref` (with annotations): keys read together, such as
    `properties` with `additionalProperties`, must come from one schema object."""
    for _ in range(32):
        if not isinstance(node, Mapping) or not isinstance(node.get("$ref"), str):
            return node
        if any(k not in ANNOTATIONS for k in node if k != "$ref"):
            return node
        node = _resolve(root, node["$ref"])
    return node


def _resolve(root: dict[str, Any], ref: str) -> Any:
    """The subschema a local `$ref` names (None: not local, or not there)."""
    if not ref.startswith("#"):
        return None
    node: Any = root
    for part in (p for p in unquote(ref[1:]).split("/") if p):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


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
