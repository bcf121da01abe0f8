"""The small expression language the config's cross-field rules are written in.

A rule's condition is a Python expression over named values of its scope (``c`` the config,
``p`` a participant, ``l`` a rank layout, derived numbers such as ``n`` or ``world``). The subset
is small on purpose, so that one text can be

- evaluated in Python (:func:`holds`), which is how ``LensembleConfig`` checks a config;
- translated into a Go-template condition (:mod:`lensemble.render.chart_rules`), which is how
  the Helm chart checks the same config; and
- where JSON Schema can say it exactly, compiled into a JSON Schema over the config
  (:func:`value_schema`, :func:`guard_schema`).

The subset: names and attribute chains; string, number, boolean and ``None`` constants; one
comparison per ``Compare`` (``< <= > >= == != in`` ``not in`` over a literal tuple or a list
name, ``is None``, ``is not None``); ``and``, ``or``, ``not``; ``%`` and ``*``; and the calls
``max(a, b)``, ``len(x)`` and ``matches(pattern, text)`` (an unanchored regular-expression
search, as in JSON Schema's ``pattern`` and Sprig's ``regexMatch``).
"""

from __future__ import annotations

import ast
import functools
import re
import types
import typing
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel

Kind = Literal["num", "str", "bool", "list", "model", "any"]

#: The functions an expression may call, as Python evaluates them.
FUNCTIONS: dict[str, Any] = {
    "max": max,
    "len": len,
    "matches": lambda pattern, text: re.search(pattern, text) is not None,
}


class NotExpressible(ValueError):
    """The expression uses something a target language (Go template, JSON Schema) lacks."""


@functools.cache
def parsed(text: str) -> ast.expr:
    """The expression's syntax tree.

    Raises:
        NotExpressible: ``text`` uses syntax outside the rule language.
    """
    tree = ast.parse(text, mode="eval").body
    allowed = (
        ast.Name, ast.Attribute, ast.Constant, ast.Compare, ast.BoolOp, ast.UnaryOp, ast.BinOp,
        ast.Call, ast.Tuple, ast.List, ast.Load, ast.And, ast.Or, ast.Not, ast.Mod, ast.Mult,
        ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.Eq, ast.NotEq, ast.In, ast.NotIn, ast.Is, ast.IsNot,
    )  # fmt: skip
    for node in ast.walk(tree):
        if not isinstance(node, allowed):
            raise NotExpressible(f"{type(node).__name__} is outside the rule language: {text}")
        if isinstance(node, ast.Compare) and len(node.ops) != 1:
            raise NotExpressible(f"chained comparison in a rule: {text}")
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") not in FUNCTIONS:
            raise NotExpressible(f"unknown function in a rule: {text}")
    return tree


@functools.cache
def _compiled(text: str) -> types.CodeType:
    return compile(ast.Expression(parsed(text)), f"<rule {text}>", "eval")


def holds(text: str, scope: dict[str, Any]) -> bool:
    """Whether expression ``text`` is true for the named values of ``scope``."""
    # The texts are constants of the rule registry, parsed into the subset above first; no
    # builtins are in reach, only the scope's values and FUNCTIONS.
    return bool(eval(_compiled(text), {"__builtins__": {}, **FUNCTIONS}, scope))  # noqa: S307


def attribute_path(node: ast.expr) -> tuple[str, list[str]] | None:
    """``c.network.port`` as ``("c", ["network", "port"])``; None for anything else."""
    keys: list[str] = []
    while isinstance(node, ast.Attribute):
        keys.insert(0, node.attr)
        node = node.value
    return (node.id, keys) if isinstance(node, ast.Name) else None


def _kind_of_annotation(annotation: Any) -> Kind | type[BaseModel]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        return _kind_of_annotation(args[0]) if len(args) == 1 else "any"
    if origin is Literal:
        return _kind_of_annotation(type(get_args(annotation)[0]))
    if origin is typing.Annotated:
        return _kind_of_annotation(get_args(annotation)[0])
    kinds: dict[Any, Kind] = {bool: "bool", int: "num", float: "num", str: "str"}
    if annotation in kinds:
        return kinds[annotation]
    return "list" if origin in (list, tuple) else "any"


def _kind_of_value(node: ast.expr) -> Kind | None:
    """The kind of a constant or an operation's result; None for names and fields."""
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool):
            return "bool"
        return "num" if isinstance(node.value, int | float) else "str"
    if isinstance(node, ast.Tuple | ast.List):
        return "list"
    if isinstance(node, ast.Compare | ast.BoolOp | ast.UnaryOp):
        return "bool"
    if isinstance(node, ast.BinOp):
        return "num"
    if isinstance(node, ast.Call):
        return "bool" if getattr(node.func, "id", "") == "matches" else "num"
    return None


def kind_of(node: ast.expr, names: dict[str, Kind | type[BaseModel]]) -> Kind:
    """The kind of value ``node`` stands for, given the kinds (or models) of the scope's names.

    Raises:
        NotExpressible: ``node`` names something the scope lacks, or no field of a model.
    """
    found = _kind_of_value(node)
    if found is not None:
        return found
    ref = attribute_path(node)
    if ref is None or ref[0] not in names:
        raise NotExpressible(f"{ast.unparse(node)} names nothing the rule's scope has")
    kind: Kind | type[BaseModel] = names[ref[0]]
    for key in ref[1]:
        if not (isinstance(kind, type) and key in kind.model_fields):
            raise NotExpressible(f"{ast.unparse(node)} is no field of the config")
        kind = _kind_of_annotation(kind.model_fields[key].annotation)
    return "model" if isinstance(kind, type) else kind


# ---------------------------------------------------------------------------- JSON Schema
def at(path: list[str], schema: dict[str, Any]) -> dict[str, Any]:
    """A schema requiring the value at ``path`` and applying ``schema`` to it (for guards)."""
    node = schema
    for key in reversed(path):
        node = {"properties": {key: node}, "required": [key]}
    return node


def within(path: list[str], schema: dict[str, Any]) -> dict[str, Any]:
    """A schema applying ``schema`` to the value at ``path`` where there is one.

    A config file may leave a field out (its default applies), so a rule's requirement never
    requires the field's presence: it cannot refuse a valid file. (The chart's values carry the
    whole resolved config, so there the requirement always meets the value.)
    """
    node = schema
    for key in reversed(path):
        node = {"properties": {key: node}}
    return node


def _constant(node: ast.expr) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    raise NotExpressible(f"{ast.unparse(node)} is not a constant")


_BOUNDS = {
    ast.Lt: "exclusiveMaximum",
    ast.LtE: "maximum",
    ast.Gt: "exclusiveMinimum",
    ast.GtE: "minimum",
}


def _compare_schema(op: ast.cmpop, right: ast.expr) -> dict[str, Any]:
    """The JSON Schema of values ``v`` for which ``v <op> right`` holds."""
    if isinstance(op, ast.Is | ast.IsNot):
        if _constant(right) is not None:
            raise NotExpressible("'is' compares with None only")
        null = {"type": "null"}
        return null if isinstance(op, ast.Is) else {"not": null}
    if isinstance(op, ast.In | ast.NotIn):
        if not isinstance(right, ast.Tuple | ast.List):
            raise NotExpressible("'in' compiles over a literal tuple only")
        enum = {"enum": [_constant(e) for e in right.elts]}
        return enum if isinstance(op, ast.In) else {"not": enum}
    value = _constant(right)
    if isinstance(op, ast.Eq | ast.NotEq):
        return {"const": value} if isinstance(op, ast.Eq) else {"not": {"const": value}}
    return {_BOUNDS[type(op)]: value}


def value_schema(node: ast.expr, subject: tuple[str, list[str]]) -> dict[str, Any]:
    """The JSON Schema, at ``subject``, of the values for which ``node`` holds.

    Raises:
        NotExpressible: ``node`` is not a condition on ``subject`` alone.
    """
    if isinstance(node, ast.Compare) and attribute_path(node.left) == subject:
        return _compare_schema(node.ops[0], node.comparators[0])
    if isinstance(node, ast.Call) and node.func.id == "matches":  # type: ignore[attr-defined]
        pattern, text = node.args
        if attribute_path(text) == subject:
            return {"pattern": _constant(pattern)}
    raise NotExpressible(f"{ast.unparse(node)} is not a condition on one field and constants")


def guard_schema(node: ast.expr, root: str = "c") -> dict[str, Any]:
    """A JSON Schema over the config that holds exactly when guard ``node`` holds.

    The guard's fields must be present: where a file leaves one out, the rule is not checked
    (never a wrong refusal). ``not`` is refused, since it would turn that around.

    Raises:
        NotExpressible: The guard compares anything but fields of ``root`` with constants.
    """
    if isinstance(node, ast.BoolOp):
        word = "allOf" if isinstance(node.op, ast.And) else "anyOf"
        return {word: [guard_schema(v, root) for v in node.values]}
    subject = attribute_path(node.left) if isinstance(node, ast.Compare) else None
    if subject is None and isinstance(node, ast.Call) and len(node.args) == 2:
        subject = attribute_path(node.args[1])
    if subject is None or subject[0] != root:
        raise NotExpressible(f"{ast.unparse(node)} is not a comparison of a config field")
    return at(subject[1], value_schema(node, subject))
