"""Read a config file, apply ``--set`` overrides, validate, and report every problem clearly.

Each problem is reported with the file, line and column it came from (or the ``--set`` flag
that introduced it), the dotted field path, and one sentence with the value, what is expected
and the fix. Malformed YAML is reported with its file, line and column.
"""

from __future__ import annotations

import copy
import difflib
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from lensemble.config.schema import DNS1123_LABEL, LensembleConfig
from lensemble.errors import ConfigError, ConfigProblem

#: Packaged copy of ``config/local.yaml`` used when no config is given and none is in the cwd.
PACKAGED_DEFAULT = Path(__file__).with_name("local.yaml")
DEFAULT_CONFIG = Path("config/local.yaml")

Marks = dict[str, tuple[int, int]]


def default_config_path() -> Path:
    """``config/local.yaml`` in the working directory if present, else the packaged copy."""
    return DEFAULT_CONFIG if DEFAULT_CONFIG.is_file() else PACKAGED_DEFAULT


def _path_of(loc: Iterable[str | int]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _walk_marks(node: yaml.Node, prefix: str, marks: Marks) -> None:
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = str(key_node.value)
            path = f"{prefix}.{key}" if prefix else key
            marks[path] = (value_node.start_mark.line + 1, value_node.start_mark.column + 1)
            marks[f"{path}#key"] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            _walk_marks(value_node, path, marks)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            path = f"{prefix}[{i}]"
            marks[path] = (item.start_mark.line + 1, item.start_mark.column + 1)
            _walk_marks(item, path, marks)


def parse_yaml(text: str, source: str) -> tuple[dict[str, Any], Marks]:
    """Parse config YAML into a mapping plus the line/column of every field path.

    Raises:
        ConfigError: The YAML is malformed or empty, or its top level is not a mapping.
    """
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or "malformed YAML"
        raise ConfigError(
            [
                ConfigProblem(
                    path="",
                    message=f"malformed YAML: {problem}; fix the syntax at this position.",
                    source=source,
                    line=mark.line + 1 if mark else None,
                    column=mark.column + 1 if mark else None,
                )
            ]
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError(
            [ConfigProblem(path="", message=f"malformed YAML: {exc}.", source=source)]
        ) from None
    if data is None:
        # An empty file is more often a truncated or wrong file than a wish for every default.
        raise ConfigError(
            [
                ConfigProblem(
                    path="",
                    message="is empty (no YAML content); write the sections you change, or '{}' "
                    "to take every default.",
                    source=source,
                )
            ]
        )
    if not isinstance(data, dict):
        raise ConfigError(
            [
                ConfigProblem(
                    path="",
                    message=f"the top level is a {type(data).__name__}, not a mapping; a config "
                    "is a mapping of sections such as 'federation:' and 'data:'.",
                    source=source,
                    line=1,
                    column=1,
                )
            ]
        )
    marks: Marks = {}
    if node is not None:
        _walk_marks(node, "", marks)
    return data, marks


_INDEX = re.compile(r"^(?P<name>[^\[\]]+)(?P<indexes>(\[\d+\])*)$")


def _split_path(path: str) -> list[str | int]:
    parts: list[str | int] = []
    for segment in path.split("."):
        if segment.isdigit():
            parts.append(int(segment))
            continue
        match = _INDEX.match(segment)
        if not match:
            raise ValueError(segment)
        parts.append(match["name"])
        parts.extend(int(i) for i in re.findall(r"\[(\d+)\]", match["indexes"]))
    return parts


def _unreachable(
    data: dict[str, Any], parts: list[str | int], parent: Any, source: str
) -> ConfigError:
    """The error for an override path whose last part is not in ``parent``."""
    part = parts[-1]
    if isinstance(parent, list) and isinstance(part, int):
        problem = f"does not exist: the list has {len(parent)} item(s) here;"
        federation = data.get("federation")
        generated = isinstance(federation, dict) and "participant_count" in federation
        if parts[:2] == ["federation", "participants"] and generated:
            problem += (
                " this file generates its participants from federation.participant_count; list "
                "them under federation.participants to set one participant's fields."
            )
        else:
            problem += " check the index."
    elif isinstance(parent, dict | list):
        problem = "does not exist or cannot be set; check the path."
    else:
        problem = f"does not exist: {_path_of(parts[:-1])} is a value, not a mapping or list."
    return ConfigError([ConfigProblem(_path_of(parts), problem, source=source)])


def apply_overrides(
    data: dict[str, Any], overrides: Sequence[str]
) -> tuple[dict[str, Any], dict[str, str]]:
    """Apply ``path.to.field=value`` overrides; values are parsed as YAML scalars or flows.

    List items are addressed as ``federation.participants[1].region`` (or ``.1.``).

    Returns:
        The updated mapping (the input is not modified) and, per overridden path, the flag
        that set it.

    Raises:
        ConfigError: An override is not ``path=value``, its value is malformed, or its path
            walks through something that is not a mapping or list.
    """
    data = copy.deepcopy(data)
    touched: dict[str, str] = {}
    for raw in overrides:
        parts, value = _parsed_override(raw)
        _set_at(data, parts, value, source=f"--set {raw}")
        touched[_path_of(parts)] = f"--set {raw}"
    return data, touched


def _parsed_override(raw: str) -> tuple[list[str | int], Any]:
    """The path (keys and list indices) and YAML value of one ``path=value`` override.

    Raises:
        ConfigError: It is not ``path=value``, or its path or value does not parse.
    """
    source = f"--set {raw}"
    path, sep, text = raw.partition("=")
    path = path.strip()
    if not sep or not path:
        raise ConfigError(
            [
                ConfigProblem(
                    "",
                    "is not of the form path.to.field=value; e.g. --set federation.rounds=5.",
                    source=source,
                )
            ]
        )
    try:
        return _split_path(path), (yaml.safe_load(text) if text.strip() else "")
    except (ValueError, yaml.YAMLError):
        raise ConfigError(
            [
                ConfigProblem(
                    path,
                    "cannot be parsed; quote the value or fix the path "
                    "(list items are written participants[0]).",
                    source=source,
                )
            ]
        ) from None


def _has_item(node: Any, part: str | int) -> bool:
    """Whether ``node[part]`` is an existing list item."""
    return isinstance(node, list) and isinstance(part, int) and part < len(node)


def _set_at(data: dict[str, Any], parts: list[str | int], value: Any, *, source: str) -> None:
    """Set ``value`` at ``parts`` in ``data``, creating missing mappings (and lists) on the way.

    Raises:
        ConfigError: The path walks through something that is not a mapping or list.
    """
    node: Any = data
    for i, part in enumerate(parts[:-1]):
        if isinstance(node, dict) and isinstance(part, str):
            node = node.setdefault(part, [] if isinstance(parts[i + 1], int) else {})
        elif _has_item(node, part):
            node = node[part]
        else:
            raise _unreachable(data, parts[: i + 1], node, source)
    last = parts[-1]
    if not ((isinstance(node, dict) and isinstance(last, str)) or _has_item(node, last)):
        raise _unreachable(data, parts, node, source)
    node[last] = value


def _model_at(loc: Sequence[str | int]) -> type[BaseModel] | None:
    """The pydantic model whose fields live at ``loc`` (for 'did you mean' suggestions)."""
    model: type[BaseModel] | None = LensembleConfig
    for part in loc:
        if model is None:
            return None
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        if field is None:
            return None
        annotation = field.annotation
        candidates = [annotation, *getattr(annotation, "__args__", ())]
        model = next(
            (c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None
        )
    return model


def _describe(error: Mapping[str, Any]) -> str:
    kind = error["type"]
    loc = error["loc"]
    value = error.get("input")
    ctx = error.get("ctx") or {}
    if kind == "extra_forbidden":
        key = str(loc[-1])
        model = _model_at(loc[:-1])
        known = sorted(model.model_fields) if model else []
        close = difflib.get_close_matches(key, known, n=1)
        hint = f"did you mean '{close[0]}'?" if close else f"valid keys: {', '.join(known)}."
        return f"unknown key '{key}'; {hint} Remove or rename it."
    if kind == "missing":
        return "is required; add it."
    if kind == "literal_error":
        return f"{value!r} is not allowed; use {ctx.get('expected')}."
    if kind == "string_pattern_mismatch":
        if ctx.get("pattern") == DNS1123_LABEL:
            return (
                f"{value!r} is not a DNS-1123 label; use lower-case letters, digits and '-', "
                "starting and ending with a letter or digit."
            )
        return f"{value!r} does not match the expected form {ctx.get('pattern')}; fix it."
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        return f"{value!r} is out of range: {error['msg'].lower()}; change it."
    if kind in ("string_too_long", "string_too_short", "too_short", "too_long"):
        return f"{value!r} has the wrong length: {error['msg'].lower()}; change it."
    expected = error["msg"].removeprefix("Input should be ").rstrip(".")
    return f"{value!r} is not valid: expected {expected}; change it."


def _locate(
    problem: ConfigProblem,
    source: str,
    marks: Marks,
    touched: Mapping[str, str],
    *,
    key: bool = False,
) -> ConfigProblem:
    path = problem.path
    for candidate in _prefixes(path):
        if candidate in touched:
            return ConfigProblem(path, problem.message, source=touched[candidate])
        mark = marks.get(f"{candidate}#key" if key and candidate == path else candidate)
        if mark:
            return ConfigProblem(path, problem.message, source, mark[0], mark[1])
        if candidate == path:
            # Not in the file: an override below it created it (--set nonexist.key=1 makes
            # the unknown key 'nonexist'), so that flag is to blame, not the file.
            below = next((t for t in touched if t.startswith((f"{path}.", f"{path}["))), None)
            if below is not None:
                return ConfigProblem(path, problem.message, source=touched[below])
    return ConfigProblem(path, problem.message, source)


def _prefixes(path: str) -> list[str]:
    out = [path]
    while path:
        cut = max(path.rfind("."), path.rfind("["))
        path = path[:cut] if cut > 0 else ""
        if path:
            out.append(path)
    return out


def validate_mapping(
    data: Mapping[str, Any],
    *,
    source: str = "<config>",
    marks: Marks | None = None,
    touched: Mapping[str, str] | None = None,
) -> LensembleConfig:
    """Validate a raw mapping into a :class:`LensembleConfig`.

    Raises:
        ConfigError: With one :class:`ConfigProblem` per invalid field or broken rule.
    """
    marks = marks or {}
    touched = touched or {}
    try:
        return LensembleConfig.model_validate(dict(data))
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            path = _path_of(err["loc"])
            problem = ConfigProblem(path, _describe(err))
            problems.append(
                _locate(problem, source, marks, touched, key=err["type"] == "extra_forbidden")
            )
        # Pydantic runs the rules between fields only once every field is valid.
        raise ConfigError(problems, rules_checked=False) from None
    except ConfigError as exc:
        raise ConfigError([_locate(p, source, marks, touched) for p in exc.problems]) from None


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> LensembleConfig:
    """Load, override and validate a config file.

    Args:
        path: YAML file; ``None`` uses :func:`default_config_path`.
        overrides: ``path.to.field=value`` strings, applied in order after the file.

    Returns:
        The validated, frozen config with every default and shorthand resolved.

    Raises:
        ConfigError: The file is missing or unreadable, the YAML is malformed, an override is
            malformed, or validation fails (one problem per field or rule).
    """
    file = Path(path) if path is not None else default_config_path()
    source = str(path) if path is not None else str(file)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            [
                ConfigProblem(
                    "",
                    "does not exist; pass an existing config file (see config/ for examples).",
                    source=source,
                )
            ]
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "it is not UTF-8 text"
        raise ConfigError(
            [
                ConfigProblem(
                    "", f"cannot be read ({reason}); check the path and permissions.", source=source
                )
            ]
        ) from None
    data, marks = parse_yaml(text, source)
    data, touched = apply_overrides(data, overrides)
    return validate_mapping(data, source=source, marks=marks, touched=touched)


def dump_config(config: LensembleConfig) -> str:
    """The resolved config as YAML, in schema field order."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False, allow_unicode=False)
