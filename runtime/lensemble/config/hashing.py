"""Config hash (``sha256-canon-v1``) and field-level config differences.

The hash covers exactly the fields that change what is trained: the seed, the model, the data,
the federation maths and the evaluation. It leaves out names, paths, log settings, the network
address and TLS paths, deployment placement, the transport (transport parity is an invariant),
timeouts, ``federation.masking`` unless the aggregation is ``masking`` (its one reader; so
adding that section kept the hash of every other config), the outer optimizer's schedules while
they are unset, and a participant's ``privacy`` and ``federation.central_privacy`` while they
are null (so adding them kept the hash of every config without a schedule or differential
privacy), ``federation.final_model`` while it is ``last`` (so adding it kept the hash of
every config that ends with its last round), and ``federation.overlap`` while its mode is
``blocking`` (likewise). Two processes of one federation must agree on
it; when they do not, :func:`differing_fields` names the field paths that differ.

Algorithm ``sha256-canon-v1``: the resolved config (defaults filled in) as JSON, with the
excluded paths removed, serialised with sorted keys, compact separators and ASCII escapes, then
SHA-256. Upstream Lensemble uses the same algorithm id for the same construction; what the hash
is for: docs/concepts.md#determinism-and-the-hash-chain.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from lensemble.config.schema import LensembleConfig

HASH_ALGORITHM = "sha256-canon-v1"

#: Paths left out of the hash: they do not change what is trained.
EXCLUDED_PATHS: tuple[str, ...] = (
    "run.name",
    "run.output_dir",
    "federation.transport",
    "federation.round_timeout_s",
    "federation.join_timeout_s",
    "federation.max_round_retries",
    "network",
    "observability",
    "deployment",
)


#: ``federation.outer_optimizer`` fields left out while unset (null: no schedule), so adding them
#: kept the hash of every config without one.
OPTIONAL_SCHEDULES = ("lr_half_life_rounds", "momentum_half_life_rounds", "lr_hold_rounds")


def hashed_view(config: LensembleConfig) -> dict[str, Any]:
    """The part of the resolved config that the hash covers, as plain JSON data."""
    data = config.model_dump(mode="json")
    if config.federation.aggregation != "masking":
        data["federation"].pop("masking", None)
    outer = data["federation"]["outer_optimizer"]
    for schedule in OPTIONAL_SCHEDULES:
        if outer.get(schedule) is None:
            outer.pop(schedule, None)
    if data["federation"].get("final_model") == "last":
        data["federation"].pop("final_model", None)
    if data["federation"].get("overlap", {}).get("mode") == "blocking":
        data["federation"].pop("overlap", None)
    if data["federation"].get("central_privacy") is None:
        data["federation"].pop("central_privacy", None)
    for participant in data["federation"]["participants"]:
        if participant.get("privacy") is None:
            participant.pop("privacy", None)
    for path in EXCLUDED_PATHS:
        *parents, leaf = path.split(".")
        node = data
        for key in parents:
            node = node[key]
        node.pop(leaf, None)
    return data


def canonical_json(data: Any) -> bytes:
    """Canonical JSON bytes: sorted keys, compact separators, ASCII only."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def config_hash(config: LensembleConfig) -> str:
    """The config hash, prefixed with its algorithm id.

    Returns:
        ``"sha256-canon-v1:<64 hex>"``.
    """
    digest = hashlib.sha256(canonical_json(hashed_view(config))).hexdigest()
    return f"{HASH_ALGORITHM}:{digest}"


def _flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(data, dict):
        for key, value in data.items():
            out.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    elif isinstance(data, list) and data and all(isinstance(v, dict) for v in data):
        for i, value in enumerate(data):
            out.update(_flatten(value, f"{prefix}[{i}]"))
        out[f"{prefix}.__len__"] = len(data)
    else:
        out[prefix] = data
    return out


def differing_fields(
    a: LensembleConfig, b: LensembleConfig, *, hashed_only: bool = True
) -> list[str]:
    """Field paths whose values differ between two configs, sorted.

    Args:
        a: One config.
        b: The other config.
        hashed_only: Compare only the fields the config hash covers (the default), so the
            result explains a hash mismatch exactly.

    Returns:
        Dotted paths such as ``federation.inner_steps`` or ``federation.participants[1].region``;
        a differing participant count shows as ``federation.participants``.
    """
    view_a = hashed_view(a) if hashed_only else a.model_dump(mode="json")
    view_b = hashed_view(b) if hashed_only else b.model_dump(mode="json")
    return differing_paths(view_a, view_b)


def differing_paths(view_a: Any, view_b: Any) -> list[str]:
    """Dotted paths whose values differ between two plain-JSON config views, sorted."""
    return sorted({path for path, _, _ in differences(view_a, view_b)})


def differences(view_a: Any, view_b: Any) -> list[tuple[str, Any, Any]]:
    """``(path, value in a, value in b)`` for every differing leaf of two plain-JSON views.

    A leaf present on one side only has ``None`` on the other; a differing participant count
    shows as ``federation.participants`` with both counts.
    """
    flat_a, flat_b = _flatten(view_a), _flatten(view_b)
    out = []
    for key in sorted(flat_a.keys() | flat_b.keys()):
        a, b = flat_a.get(key), flat_b.get(key)
        if key not in flat_a or key not in flat_b or a != b:
            out.append((key.removesuffix(".__len__"), a, b))
    return out
