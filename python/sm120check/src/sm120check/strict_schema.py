"""A strict reader of the subset of JSON Schema (draft 2020-12) that sm120check's own schema files use.

The doctor runs on the standard library alone, so the files the roles write and the doctor reads (the node manifest,
manifest.schema.json; the pcie_p2p fact file, doctor/pcie/pcie_p2p.schema.json) are validated here; the unit tests
check that this reader and the `jsonschema` package agree on both. A keyword this reader does not implement is an
error in the schema, never skipped silently. Messages name the field (`cuda.lib_dir`, `kernel_params[1]`) and say
what it must be (the schema node's `description`).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

_ANNOTATIONS = frozenset({"$schema", "$id", "$comment", "title", "description", "$defs"})
_KEYWORDS = _ANNOTATIONS | {
    "$ref",
    "type",
    "const",
    "properties",
    "required",
    "additionalProperties",
    "propertyNames",
    "pattern",
    "minLength",
    "maxLength",
    "maxProperties",
    "items",
    "maxItems",
}
_TYPES: Mapping[str, tuple[type, ...]] = {
    "object": (dict,),
    "string": (str,),
    "integer": (int,),
    "boolean": (bool,),
    "array": (list,),
}


class SchemaViolation(ValueError):
    """A value breaks the schema; the message names the field and what it must be."""


@dataclass(frozen=True)
class Schema:
    """A loaded schema: `file` and `version` are named in messages; the values of fields under `quiet` (tokens)
    are never echoed, only their kind."""

    file: str
    version: int
    root: Mapping[str, object]
    quiet: tuple[str, ...] = ()


@functools.cache
def _regex(pattern: str) -> re.Pattern[str]:
    # JSON Schema patterns are ECMA-262: a final `$` is the end of the string, where Python's also matches before a
    # final newline ("13.0.1\n" would pass).
    return re.compile(pattern[:-1] + r"\Z" if pattern.endswith("$") and not pattern.endswith("\\$") else pattern)


def _node(schema: Schema, node: object) -> Mapping[str, object]:
    """A schema node, its local $ref followed; an unknown keyword is an error (this reader would silently skip it)."""
    if not isinstance(node, dict):
        raise RuntimeError(f"{schema.file}: a schema node is not an object: {node!r}")
    unknown = sorted(set(node) - _KEYWORDS)
    if unknown:
        raise RuntimeError(f"{schema.file} uses {unknown}, which sm120check's schema reader does not implement")
    ref = node.get("$ref")
    if ref is None:
        return node
    if not (isinstance(ref, str) and ref.startswith("#/$defs/")) or len(node) > 1:
        raise RuntimeError(f"{schema.file}: only a bare local $ref (#/$defs/NAME) is supported, not {node!r}")
    defs = schema.root.get("$defs")
    target = defs.get(ref.removeprefix("#/$defs/")) if isinstance(defs, dict) else None
    if target is None:
        raise RuntimeError(f"{schema.file}: {ref} is not defined")
    return _node(schema, target)


def shown(schema: Schema, where: str, value: object) -> str:
    """A value for a message: its JSON (cut at 80 characters), or for a quiet field only its kind and size."""
    top = where.split(".", 1)[0].split("[", 1)[0]
    if top in schema.quiet and where not in schema.quiet:  # a quiet value: its kind, never its text
        kinds = {str: "a string", bool: "a boolean", int: "a number", float: "a number", dict: "an object"}
        return f"{kinds.get(type(value), 'a JSON value')} of {len(json.dumps(value))} characters"
    text = json.dumps(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


def _type_ok(kind: str, value: object) -> bool:
    if kind == "boolean":
        return isinstance(value, bool)
    return isinstance(value, _TYPES[kind]) and not isinstance(value, bool)


def _check(schema: Schema, raw_node: object, value: object, where: str) -> None:
    node = _node(schema, raw_node)
    what = str(node.get("description", "valid"))
    kind = node.get("type")
    if kind is not None and not _type_ok(str(kind), value):
        raise SchemaViolation(f"field `{where}` must be {what}, not {shown(schema, where, value)}")
    if "const" in node and not (value == node["const"] and type(value) is type(node["const"])):
        raise SchemaViolation(f"field `{where}` must be {what}, not {shown(schema, where, value)}")
    if isinstance(value, str):
        min_length, max_length = node.get("minLength"), node.get("maxLength")
        if isinstance(max_length, int) and len(value) > max_length:
            raise SchemaViolation(f"field `{where}` must be {what}, not a string of {len(value)} characters")
        if isinstance(min_length, int) and len(value) < min_length:
            raise SchemaViolation(f"field `{where}` must be {what}, not {shown(schema, where, value)}")
        pattern = node.get("pattern")
        if isinstance(pattern, str) and not _regex(pattern).search(value):
            raise SchemaViolation(f"field `{where}` must be {what}, not {shown(schema, where, value)}")
    if isinstance(value, list):
        most = node.get("maxItems")
        if isinstance(most, int) and len(value) > most:
            raise SchemaViolation(f"field `{where}` has {len(value)} items, more than {most}")
        items = node.get("items")
        if items is not None:
            for index, item in enumerate(value):
                _check(schema, items, item, f"{where}[{index}]")
    if isinstance(value, dict):
        _check_object(schema, node, value, where)


def _check_object(schema: Schema, node: Mapping[str, object], value: dict[str, object], where: str) -> None:
    prefix = f"{where}." if where else ""
    most = node.get("maxProperties")
    if isinstance(most, int) and len(value) > most:
        raise SchemaViolation(f"field `{where}` has {len(value)} entries, more than {most}")
    required = node.get("required", [])
    for name in required if isinstance(required, list) else []:
        if name not in value:
            raise SchemaViolation(f"has no `{prefix}{name}` field")
    names = node.get("propertyNames")
    properties = node.get("properties", {})
    extra = node.get("additionalProperties", True)
    for key, item in value.items():
        if names is not None:
            name_node = _node(schema, names)
            try:
                _check(schema, name_node, key, "")
            except SchemaViolation:
                shown = json.dumps(key) if len(key) <= 80 else f"a key of {len(key)} characters"
                raise SchemaViolation(
                    f"field `{where}` has the key {shown}, not {name_node.get('description', 'a valid key')}"
                ) from None
        if isinstance(properties, dict) and key in properties:
            _check(schema, properties[key], item, prefix + key)
        elif extra is False:
            shown = json.dumps(key) if len(key) <= 80 else f"of {len(key)} characters"
            raise SchemaViolation(
                f"has an unknown field {shown} in `{where or '(top level)'}` (schema {schema.version})"
            )
        elif isinstance(extra, dict):
            _check(schema, extra, item, prefix + key)


def validate(schema: Schema, raw: object) -> None:
    """Raise SchemaViolation naming the first field of `raw` that breaks `schema`."""
    _check(schema, schema.root, raw, "")
