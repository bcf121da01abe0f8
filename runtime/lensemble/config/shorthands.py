"""Shorthands of a raw config mapping, resolved before validation.

So ``lensemble config show`` prints the resolved values:

- ``federation.participant_count`` sets the number of participants. Entries listed under
  ``federation.participants`` come first; the list is truncated to, or extended up to, that count
  with generated participants whose physics spread over the environment's range.
- ``federation.quorum`` defaults to a strict majority of participants.
- ``federation.participants[].trust_domain`` defaults to the participant id.
"""

from __future__ import annotations

from typing import Any

from lensemble.config.physics import generated_env_params

DEFAULT_PARTICIPANTS = 4


def _count_of(fed: dict[str, Any], listed: list[Any]) -> int | None:
    """The resolved participant count, or None when ``participant_count`` is not a count."""
    count = fed.get("participant_count", 0)
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        return None
    return count or len(listed) or DEFAULT_PARTICIPANTS


def _extended(listed: list[Any], count: int, env: str) -> list[Any]:
    """``listed`` cut to ``count``, or extended with generated ``site-N`` participants."""
    participants: list[Any] = list(listed[:count])
    used = {p.get("id") for p in participants if isinstance(p, dict)}
    index = 0
    while len(participants) < count:
        pid = f"site-{index}"
        if pid not in used:
            participants.append({"id": pid, "env_params": generated_env_params(env, index)})
            used.add(pid)
        index += 1
    return participants


def _with_trust_domain(participant: Any) -> Any:
    """The participant with ``trust_domain`` defaulted to its id (anything else unchanged)."""
    named = isinstance(participant, dict) and "id" in participant
    if not named or participant.get("trust_domain"):
        return participant
    return {**participant, "trust_domain": participant["id"]}


def resolve_shorthands(data: Any) -> Any:
    """Expand ``participant_count``, default trust domains and quorum in a raw config mapping.

    Leaves anything it does not understand alone so that field validation reports it.

    Args:
        data: The raw mapping (from YAML plus overrides).

    Returns:
        A new mapping with ``federation.participants``, ``participant_count`` and ``quorum``
        resolved.
    """
    fed = data.get("federation", {}) if isinstance(data, dict) else None
    listed = fed.get("participants", []) if isinstance(fed, dict) else None
    if not isinstance(fed, dict) or not isinstance(listed, list):
        return data
    count = _count_of(fed, listed)
    if count is None:
        return data
    data_section = data.get("data")
    env = data_section.get("env_id", "Pendulum-v1") if isinstance(data_section, dict) else ""
    participants = [_with_trust_domain(p) for p in _extended(listed, count, str(env))]
    fed = {**fed, "participants": participants, "participant_count": count}
    if fed.get("quorum", 0) in (0, None):
        fed["quorum"] = count // 2 + 1
    return {**data, "federation": fed}
