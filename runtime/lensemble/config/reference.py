"""Render the config field reference (Markdown) from the JSON Schema.

The committed copy is ``docs/config-reference.md``; a test fails when it drifts, so the reference
can never disagree with the schema.
"""

from __future__ import annotations

import json
from typing import Any

from lensemble.config.schema_export import json_schema


def range_text(spec: dict[str, Any]) -> str:
    """The range a numeric schema enforces, in interval notation: ``in [0, 1)``, ``>= 1``.

    Returns:
        The empty string when the schema sets no bound.
    """
    low = ("[", spec["minimum"]) if "minimum" in spec else None
    low = ("(", spec["exclusiveMinimum"]) if "exclusiveMinimum" in spec else low
    high = ("]", spec["maximum"]) if "maximum" in spec else None
    high = (")", spec["exclusiveMaximum"]) if "exclusiveMaximum" in spec else high
    if low and high:
        return f"in {low[0]}{low[1]}, {high[1]}{high[0]}"
    if low:
        return f"{'>=' if low[0] == '[' else '>'} {low[1]}"
    if high:
        return f"{'<=' if high[0] == ']' else '<'} {high[1]}"
    return ""


def _type_of(spec: dict[str, Any], defs: dict[str, Any]) -> str:
    if "$ref" in spec:
        return "section"
    if "enum" in spec:
        return " \\| ".join(f"`{v}`" for v in spec["enum"])
    if "const" in spec:
        return f"`{spec['const']}`"
    if "anyOf" in spec:
        return " or ".join(_type_of(s, defs) for s in spec["anyOf"])
    kind = spec.get("type", "any")
    if kind in ("number", "integer") and range_text(spec):
        return f"{kind} {range_text(spec)}"
    if kind == "array":
        if "prefixItems" in spec:
            return "[" + ", ".join(_type_of(s, defs) for s in spec["prefixItems"]) + "]"
        return f"list of {_type_of(spec.get('items', {}), defs)}"
    if kind == "object" and "additionalProperties" in spec:
        inner = spec["additionalProperties"]
        return f"map of {_type_of(inner, defs) if isinstance(inner, dict) else 'any'}"
    return str(kind)


def _default(spec: dict[str, Any]) -> str:
    if "default" not in spec:
        return "required" if spec.get("_required") else ""
    return f"`{json.dumps(spec['default'])}`"


def _rows(name: str, defs: dict[str, Any], prefix: str, out: list[str]) -> None:
    definition = defs[name]
    required = set(definition.get("required", []))
    for field, spec in definition.get("properties", {}).items():
        path = f"{prefix}.{field}" if prefix else field
        if "$ref" in spec:
            _rows(str(spec["$ref"]).rsplit("/", 1)[-1], defs, path, out)
            continue
        item_ref = spec.get("items", {}).get("$ref")
        if item_ref:
            out.append(
                f"| `{path}` | list of objects | {_default(spec)} | {spec.get('description', '')} |"
            )
            _rows(item_ref.rsplit("/", 1)[-1], defs, f"{path}[]", out)
            continue
        map_ref = spec.get("additionalProperties") or {}
        if isinstance(map_ref, dict) and "$ref" in map_ref:
            out.append(
                f"| `{path}` | map of objects | {_default(spec)} | {spec.get('description', '')} |"
            )
            _rows(map_ref["$ref"].rsplit("/", 1)[-1], defs, f"{path}.<key>", out)
            continue
        default = _default({**spec, "_required": field in required})
        description = spec.get("description", "").replace("|", "\\|")
        out.append(f"| `{path}` | {_type_of(spec, defs)} | {default} | {description} |")


def render_reference() -> str:
    """The config reference as Markdown: one table row per leaf field, in schema order."""
    schema = json_schema()
    defs = {**schema["$defs"], "LensembleConfig": schema}
    lines = [
        "# Config reference",
        "",
        "Generated from `LensembleConfig` by `lensemble config reference`; do not edit by hand.",
        "Units are in each description (seconds, bytes, count); a number's type column gives",
        "the range the schema enforces (`[` and `]` include the bound, `(` and `)` exclude it).",
        "",
    ]
    for section, spec in schema["properties"].items():
        ref = spec["$ref"].rsplit("/", 1)[-1]
        lines += [
            f"## `{section}`",
            "",
            defs[ref].get("description", ""),
            "",
            "| field | type | default | description |",
            "|---|---|---|---|",
        ]
        rows: list[str] = []
        _rows(ref, defs, section, rows)
        lines += [*rows, ""]
    return "\n".join(lines)
