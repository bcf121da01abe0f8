"""The scopes the config's cross-field rules are checked in, and what a rule is.

A rule is checked once per element of its *scope*: the config, each participant, each physics
override of a participant, each placement in ``deployment.trust_domains``, or each rank layout
(``federation.ranks``, then each participant's own). A scope offers named values to the rule's
condition and message; :data:`SCOPE_NAMES` lists them. :func:`scoped_values` computes them in
Python; the chart's generated template defines the same names in Go
(:mod:`lensemble.render.chart_rules`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel

from lensemble.config.federation_section import (
    ParticipantSpec,
    RankLayout,
    widest_fractional_bits,
)
from lensemble.config.physics import KNOWN_PHYSICS
from lensemble.config.rule_language import Kind, holds
from lensemble.config.sections import CUDA_TAG
from lensemble.errors import ConfigProblem

if TYPE_CHECKING:
    from lensemble.config.schema import LensembleConfig

Scope = Literal["config", "participant", "env_param", "placement", "layout"]
SCOPES: tuple[Scope, ...] = ("config", "participant", "env_param", "placement", "layout")
#: The scope each scope runs inside: its rules also see the enclosing scope's names.
ENCLOSING: dict[Scope, Scope | None] = {
    "config": None,
    "participant": "config",
    "env_param": "participant",
    "placement": "config",
    "layout": "config",
}
ROOT = "root"
#: The ports a process listens on beside a rank group's rendezvous, in the order named.
SERVED_PORTS = ("port", "health_port", "metrics_port", "download_port")
#: Names each scope adds, with their kinds (``ROOT`` is the config model itself).
SCOPE_NAMES: dict[Scope, dict[str, Kind | type[BaseModel] | str]] = {
    "config": {
        "c": ROOT,  # the config
        "n": "num",  # participants (count)
        "held": "num",  # held-out episodes: round(episodes * holdout_fraction), half to even
        "train": "num",  # training episodes: episodes - held
        "gpus": "num",  # GPUs of one participant pod
        "cuda": "bool",  # whether deployment.image.tag names a CUDA build
        "domain_set": "list",  # distinct trust domains, sorted
        "domains": "str",  # the same, joined by ", "
        "half": "num",  # n // 2
        "threshold": "num",  # Shamir's t: federation.masking.threshold, else floor(2n/3) + 1
        # The most fractional bits whose masked sum over n cannot overflow int64, else -1.
        "widest_bits": "num",
    },
    "participant": {
        "i": "num",  # its index in federation.participants
        "p": ParticipantSpec,
        "first_id": "num",  # index of an earlier participant with the same id, else -1
        "owner": "str",  # id of an earlier participant of the same trust domain, else ""
    },
    "env_param": {
        "key": "str",  # the physics parameter's name
        "value": "num",
        "known_key": "bool",  # whether data.env_id has such a parameter
        "minimum": "num",  # the parameter's exclusive lower bound (0 when unknown)
        "default": "num",  # its upstream default (0 when unknown)
        "names": "str",  # the environment's parameters, sorted, joined by ", "
    },
    "placement": {"key": "str"},  # a key of deployment.trust_domains
    "layout": {
        "where": "str",  # field path of the layout: federation.ranks or ...participants[i].ranks
        "who": "str",  # "every participant" or "participant '<id>'"
        "l": RankLayout,  # the layout (a participant's over federation.ranks)
        "world": "num",  # ranks: nodes * processes_per_node
        "clash": "str",  # the first served port (network.*) equal to l.rendezvous_port, else ""
    },
}


@dataclass(frozen=True)
class Rule:
    """One cross-field rule.

    Attributes:
        id: Stable name of the rule (tests key their breaking examples by it).
        scope: What the rule is checked for (see the module docstring).
        field: Path of the field the problem names; ``{name}`` placeholders take the scope's
            values (e.g. ``federation.participants[{i}].id``).
        require: Condition a valid config meets, in the rule language.
        message: The sentence after the field path: the value, what is expected and the fix;
            ``{name}`` or ``{name.attr}`` placeholders take the scope's values.
        when: Guard: the rule applies only when it holds (None: always).
        schema: JSON Schema form given by hand, where the compiler cannot derive the exact
            one (the physics tables); None lets :func:`schema_of` compile it.
    """

    id: str
    scope: Scope
    field: str
    require: str
    message: str
    when: str | None = None
    schema: Callable[[], dict[str, Any]] | None = None

    def broken(self, values: dict[str, Any]) -> bool:
        """Whether the scope's ``values`` break the rule."""
        applies = self.when is None or holds(self.when, values)
        return applies and not holds(self.require, values)

    def problem(self, values: dict[str, Any]) -> ConfigProblem:
        """The problem to report for the scope's ``values``."""
        return ConfigProblem(self.field.format_map(values), self.message.format_map(values))


def scope_names(scope: Scope, root: type[BaseModel]) -> dict[str, Kind | type[BaseModel]]:
    """Every name a rule of ``scope`` may use (its own and its enclosing scopes'), with kinds."""
    names: dict[str, Kind | type[BaseModel]] = {}
    current: Scope | None = scope
    while current is not None:
        for name, kind in SCOPE_NAMES[current].items():
            names.setdefault(name, root if kind == ROOT else kind)  # type: ignore[arg-type]
        current = ENCLOSING[current]
    return names


# --------------------------------------------------------------- the scopes, in Python
def _config_values(cfg: LensembleConfig) -> dict[str, Any]:
    held = round(cfg.data.episodes * cfg.data.holdout_fraction)
    domain_set = sorted({p.trust_domain for p in cfg.federation.participants})
    n = len(cfg.federation.participants)
    masking = cfg.federation.masking
    widest = widest_fractional_bits(masking.clip, n)
    return {
        "c": cfg,
        "n": n,
        "held": held,
        "train": cfg.data.episodes - held,
        "gpus": cfg.deployment.resources.participant.gpu,
        "cuda": bool(CUDA_TAG.search(cfg.deployment.image.tag)),
        "domain_set": domain_set,
        "domains": ", ".join(domain_set),
        "half": n // 2,
        "threshold": masking.resolved_threshold(n),
        "widest_bits": -1 if widest is None else widest,
    }


def _participant_values(top: dict[str, Any]) -> Iterator[dict[str, Any]]:
    first: dict[str, int] = {}
    owners: dict[str, str] = {}
    for i, p in enumerate(top["c"].federation.participants):
        yield {
            **top,
            "i": i,
            "p": p,
            "first_id": first.get(p.id, -1),
            "owner": owners.get(p.trust_domain, ""),
        }
        first.setdefault(p.id, i)
        owners.setdefault(p.trust_domain, p.id)


def _env_param_values(participant: dict[str, Any]) -> Iterator[dict[str, Any]]:
    known = KNOWN_PHYSICS.get(participant["c"].data.env_id)
    if known is None:
        return
    specs = {spec.name: spec for spec in known}
    for key, value in participant["p"].env_params.items():
        spec = specs.get(key)
        yield {
            **participant,
            "key": key,
            "value": value,
            "known_key": spec is not None,
            "minimum": spec.minimum if spec else 0.0,
            "default": spec.default if spec else 0.0,
            "names": ", ".join(sorted(specs)),
        }


def _layout_values(top: dict[str, Any]) -> Iterator[dict[str, Any]]:
    cfg = top["c"]
    layouts: list[tuple[str, str, RankLayout]] = [
        ("federation.ranks", "every participant", cfg.federation.ranks)
    ]
    for i, p in enumerate(cfg.federation.participants):
        if p.ranks is not None:
            own = cfg.federation.ranks.model_copy(update=p.ranks.model_dump(exclude_none=True))
            layouts.append((f"federation.participants[{i}].ranks", f"participant '{p.id}'", own))
    served = {f"network.{name}": getattr(cfg.network, name) for name in SERVED_PORTS}
    for where, who, layout in layouts:
        clashes = [name for name, port in served.items() if port == layout.rendezvous_port]
        yield {
            **top,
            "where": where,
            "who": who,
            "l": layout,
            "world": layout.world_size,
            "clash": clashes[0] if clashes else "",
        }


def scoped_values(cfg: LensembleConfig) -> Iterator[tuple[Scope, dict[str, Any]]]:
    """Every (scope, values) the rules are checked for, in reporting order."""
    top = _config_values(cfg)
    for participant in _participant_values(top):
        yield "participant", participant
        for param in _env_param_values(participant):
            yield "env_param", param
    yield "config", top
    for layout in _layout_values(top):
        yield "layout", layout
    for key in cfg.deployment.trust_domains:
        yield "placement", {**top, "key": key}
