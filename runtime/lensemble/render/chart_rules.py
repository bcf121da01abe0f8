"""The chart's ``templates/_rules.tpl``: the config's cross-field rules, as Go template checks.

Generated from the registry :data:`lensemble.config.rules.RULES` (``tools/regenerate.py``; a
test fails when the committed file drifts), so the chart refuses a config that breaks a rule with
the rule's own field path and message, prefixed ``config.`` (the key the config has in the
values). Each rule's condition, written in :mod:`lensemble.config.rule_language`, is translated
here into a Sprig/Go-template expression; each scope's named values are defined in Go by the
scope's prelude below, the counterpart of :func:`lensemble.config.rule_scopes.scoped_values`.

Numbers in Helm values are float64 (or int64), so every number is compared as ``float64``.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from pydantic import BaseModel

from lensemble.config.federation_section import MASKED_WORD_LIMIT
from lensemble.config.physics import KNOWN_PHYSICS
from lensemble.config.rule_language import Kind, NotExpressible, attribute_path, kind_of, parsed
from lensemble.config.rule_scopes import SERVED_PORTS, Rule, Scope, scope_names
from lensemble.config.rules import rules_of
from lensemble.config.schema import CUDA_TAG, LensembleConfig

Names = dict[str, Kind | type[BaseModel]]

_ORDER = {ast.Lt: "lt", ast.LtE: "le", ast.Gt: "gt", ast.GtE: "ge"}
_EQUALITY = {ast.Eq: "eq", ast.NotEq: "ne"}
_PLACEHOLDER = re.compile(r"\{([^{}]+)\}")


def _number(value: float) -> str:
    """A Go template float64 literal (``1`` would be an int, which ``lt`` cannot compare)."""
    return repr(float(value))


def _constant(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return _number(value)
    if isinstance(value, str):
        return json.dumps(value)
    raise NotExpressible(f"{value!r} has no Go template literal")


def _ref(node: ast.expr) -> str:
    ref = attribute_path(node)
    if ref is None:
        raise NotExpressible(f"{ast.unparse(node)} is not a name")
    return "$" + ".".join([ref[0], *ref[1]])


def _num(node: ast.expr, names: Names) -> str:
    """``node`` as a float64 Go expression."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return _number(node.value)
    return f"(float64 {go(node, names)})"


def _operand(node: ast.expr, names: Names, *, numeric: bool) -> str:
    """``node`` as a Go expression: float64 when compared as a number."""
    return _num(node, names) if numeric else go(node, names)


def _compare(node: ast.Compare, names: Names) -> str:
    op, left, right = node.ops[0], node.left, node.comparators[0]
    if isinstance(op, ast.Is | ast.IsNot):
        test = f'(kindIs "invalid" {go(left, names)})'
        return test if isinstance(op, ast.Is) else _negated(test)
    if isinstance(op, ast.In | ast.NotIn):
        numeric = kind_of(left, names) == "num"
        if isinstance(right, ast.Tuple | ast.List):
            items = (_operand(e, names, numeric=numeric) for e in right.elts)
            within = f"(list {' '.join(items)})"
        else:
            within = go(right, names)
        test = f"(has {_operand(left, names, numeric=numeric)} {within})"
        return test if isinstance(op, ast.In) else _negated(test)
    if type(op) in _ORDER:
        return f"({_ORDER[type(op)]} {_num(left, names)} {_num(right, names)})"
    numeric = "num" in (kind_of(left, names), kind_of(right, names))
    sides = (_operand(side, names, numeric=numeric) for side in (left, right))
    return f"({_EQUALITY[type(op)]} {' '.join(sides)})"


def _call(node: ast.Call, names: Names) -> str:
    name = node.func.id  # type: ignore[attr-defined]
    if name == "matches":
        pattern, text = node.args
        return f"(regexMatch {_constant(ast.literal_eval(pattern))} {go(text, names)})"
    if name == "max":
        return f"(maxf {' '.join(_num(a, names) for a in node.args)})"
    return f"(float64 (len {go(node.args[0], names)}))"


def go(node: ast.expr, names: Names) -> str:
    """The Go template expression of rule-language ``node``; names are ``$``-variables.

    Raises:
        NotExpressible: The expression uses something the translation lacks.
    """
    if isinstance(node, ast.Constant):
        return _constant(node.value)
    if isinstance(node, ast.Name | ast.Attribute):
        return _ref(node)
    if isinstance(node, ast.Compare):
        return _compare(node, names)
    if isinstance(node, ast.BoolOp):
        word = "and" if isinstance(node.op, ast.And) else "or"
        return f"({word} {' '.join(go(v, names) for v in node.values)})"
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return _negated(go(node.operand, names))
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
        left, right = (f"(int {go(side, names)})" for side in (node.left, node.right))
        return f"(float64 (mod {left} {right}))"
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        return f"(mulf {go(node.left, names)} {go(node.right, names)})"
    if isinstance(node, ast.Call):
        return _call(node, names)
    raise NotExpressible(f"{ast.unparse(node)} has no Go template translation")


def _printf(text: str) -> tuple[str, list[str]]:
    """``text`` with ``{name.attr}`` placeholders as a printf format and its Go arguments."""
    args = [_ref(parsed(m[1])) for m in _PLACEHOLDER.finditer(text)]
    return _PLACEHOLDER.sub("%v", text.replace("%", "%%")), args


def _negated(expression: str) -> str:
    """``(not X)`` for a Go expression, or ``X`` itself when the expression is ``(not X)``."""
    if expression.startswith("(not ") and _closing(expression, 0) == len(expression) - 1:
        return expression.removeprefix("(not ").removesuffix(")")
    return f"(not {expression})"


def _closing(text: str, start: int) -> int:
    """Index of the parenthesis closing the one at ``start`` (string literals are skipped)."""
    depth, quoted = 0, False
    for index in range(start, len(text)):
        char = text[index]
        if char == '"' and text[index - 1] != "\\":
            quoted = not quoted
        elif not quoted and char in "()":
            depth += 1 if char == "(" else -1
            if depth == 0:
                return index
    return -1


def check(rule: Rule, names: Names) -> str:
    """The template lines that ``fail`` with the rule's message when the values break it."""
    broken = _negated(go(parsed(rule.require), names))
    if rule.when is not None:
        broken = f"(and {go(parsed(rule.when), names)} {broken})"
    text, args = _printf(f"config.{rule.field}: {rule.message}")
    return (
        f"{{{{- /* {rule.id} */ -}}}}\n"
        f"{{{{- if {broken} -}}}}\n"
        f"{{{{- fail (printf {' '.join([json.dumps(text), *args])}) -}}}}\n"
        "{{- end -}}\n"
    )


def _checks(scope: Scope) -> str:
    names = scope_names(scope, LensembleConfig)
    return "".join(check(rule, names) for rule in rules_of(scope))


def _physics_table() -> str:
    """``KNOWN_PHYSICS`` as ``$physics``: env id -> parameter -> minimum and default."""
    lines = ["{{- $physics := dict -}}\n"]
    for env_id, params in KNOWN_PHYSICS.items():
        specs = "".join(
            f'\n  "{p.name}" (dict "minimum" {_number(p.minimum)} "default" {_number(p.default)})'
            for p in params
        )
        lines.append(f"{{{{- $_ := set $physics {json.dumps(env_id)} (dict{specs}) -}}}}\n")
    return "".join(lines)


# ------------------------------------------------------------------------------ the scopes
_CONFIG = """\
{{- $c := .Values.config -}}
{{- $n := float64 (len $c.federation.participants) -}}
{{- /* held: Python's round(episodes * holdout_fraction), halves to the even neighbour. */ -}}
{{- $episodes := float64 $c.data.episodes -}}
{{- $x := mulf $episodes (float64 $c.data.holdout_fraction) -}}
{{- $held := floor $x -}}
{{- $rest := subf $x $held -}}
{{- if or (gt $rest 0.5) (and (eq $rest 0.5) (eq (mod (int $held) 2) 1)) -}}
{{- $held = addf $held 1.0 -}}
{{- end -}}
{{- $train := subf $episodes $held -}}
{{- $gpus := float64 $c.deployment.resources.participant.gpu -}}
{{- $cuda := regexMatch CUDA $c.deployment.image.tag -}}
{{- $domain_set := list -}}
{{- range $c.federation.participants -}}
{{- $domain_set = append $domain_set .trust_domain -}}
{{- end -}}
{{- $domain_set = $domain_set | uniq | sortAlpha -}}
{{- $domains := join ", " $domain_set -}}
{{- $half := floor (divf $n 2.0) -}}
{{- $masking := $c.federation.masking | default dict -}}
{{- $threshold := addf (floor (divf (mulf 2.0 $n) 3.0)) 1.0 -}}
{{- if not (kindIs "invalid" $masking.threshold) -}}
{{- $threshold = float64 $masking.threshold -}}
{{- end -}}
{{- /* widest_bits: the largest f in 0..62 with n * ceil(clip * 2**f) <= 2**63 - 1, else -1,
  exactly: ceil(clip * 2**f) is an integer below 2**63 and at most (2**63 - 1) // n in int64. */ -}}
{{- $limit := div LIMIT (int (maxf $n 1.0)) -}}
{{- $widest_bits := -1.0 -}}
{{- $scale := 1.0 -}}
{{- range $bits := until 63 -}}
{{- $bound := ceil (mulf (float64 $masking.clip) $scale) -}}
{{- if and (lt $bound TWO63) (le (int64 $bound) $limit) -}}
{{- $widest_bits = float64 $bits -}}
{{- end -}}
{{- $scale = mulf $scale 2.0 -}}
{{- end -}}
"""

_PARTICIPANTS_OPEN = """\
{{- $first_ids := dict -}}
{{- $owners := dict -}}
PHYSICS{{- $known := get $physics $c.data.env_id -}}
{{- range $i, $p := $c.federation.participants -}}
{{- $first_id := -1 -}}
{{- if hasKey $first_ids $p.id -}}{{- $first_id = get $first_ids $p.id -}}{{- end -}}
{{- $owner := "" -}}
{{- if hasKey $owners $p.trust_domain -}}{{- $owner = get $owners $p.trust_domain -}}{{- end -}}
"""

_ENV_PARAMS_OPEN = """\
{{- if $known -}}
{{- $names := keys $known | sortAlpha | join ", " -}}
{{- range $key, $value := $p.env_params -}}
{{- $spec := get $known $key -}}
{{- $known_key := not (empty $spec) -}}
{{- $minimum := 0.0 -}}
{{- $default := 0.0 -}}
{{- if $known_key -}}{{- $minimum = $spec.minimum -}}{{- $default = $spec.default -}}{{- end -}}
"""

_ENV_PARAMS_CLOSE = """\
{{- end -}}
{{- end -}}
"""

_PARTICIPANTS_CLOSE = """\
{{- if not (hasKey $first_ids $p.id) -}}{{- $_ := set $first_ids $p.id $i -}}{{- end -}}
{{- if not (hasKey $owners $p.trust_domain) -}}
{{- $_ := set $owners $p.trust_domain $p.id -}}
{{- end -}}
{{- end -}}
"""

_LAYOUTS_OPEN = """\
{{- $served := list -}}
{{- range $name := list SERVED -}}
{{- with get $c.network $name -}}
{{- $served = append $served (list (printf "network.%s" $name) .) -}}
{{- end -}}
{{- end -}}
{{- $layouts := list (dict "where" "federation.ranks" "who" "every participant"
  "l" $c.federation.ranks) -}}
{{- range $i, $p := $c.federation.participants -}}
{{- if $p.ranks -}}
{{- $own := dict -}}
{{- range $k, $v := $c.federation.ranks -}}{{- $_ := set $own $k $v -}}{{- end -}}
{{- range $k, $v := $p.ranks -}}
{{- if not (kindIs "invalid" $v) -}}{{- $_ := set $own $k $v -}}{{- end -}}
{{- end -}}
{{- $layouts = append $layouts (dict "where" (printf "federation.participants[%d].ranks" $i)
  "who" (printf "participant '%s'" $p.id) "l" $own) -}}
{{- end -}}
{{- end -}}
{{- range $layouts -}}
{{- $where := .where -}}
{{- $who := .who -}}
{{- $l := .l -}}
{{- $world := mulf (float64 $l.nodes) (float64 $l.processes_per_node) -}}
{{- $clash := "" -}}
{{- range $served -}}
{{- if and (not $clash) (eq (float64 (index . 1)) (float64 $l.rendezvous_port)) -}}
{{- $clash = index . 0 -}}
{{- end -}}
{{- end -}}
"""

_PLACEMENTS_OPEN = """\
{{- range $key, $_ := $c.deployment.trust_domains -}}
"""

_CLOSE = "{{- end -}}\n"


def _layouts_open() -> str:
    return _LAYOUTS_OPEN.replace("SERVED", " ".join(json.dumps(name) for name in SERVED_PORTS))


def rules_template() -> str:
    """The exact text committed to ``charts/lensemble/templates/_rules.tpl``."""
    header = (
        "{{/*\n"
        "Generated from lensemble.config.rules (the registry of LensembleConfig's cross-field\n"
        "rules) by `python -m tools.regenerate`: do not edit. Each check fails with the rule's\n"
        "field path and message, the same a pod's config validation reports. The chart-only\n"
        "checks on chart knobs are lensemble.validate in _helpers.tpl.\n"
        "*/}}\n"
    )
    return (
        header
        + '{{- define "lensemble.configRules" -}}\n'
        + _CONFIG.replace("CUDA", json.dumps(CUDA_TAG.pattern))
        .replace("LIMIT", str(MASKED_WORD_LIMIT))
        .replace("TWO63", _number(MASKED_WORD_LIMIT + 1))
        + _PARTICIPANTS_OPEN.replace("PHYSICS", _physics_table(), 1)
        + _checks("participant")
        + _ENV_PARAMS_OPEN
        + _checks("env_param")
        + _ENV_PARAMS_CLOSE
        + _PARTICIPANTS_CLOSE
        + _checks("config")
        + _layouts_open()
        + _checks("layout")
        + _CLOSE
        + _PLACEMENTS_OPEN
        + _checks("placement")
        + _CLOSE
        + "{{- end -}}\n"
    )
