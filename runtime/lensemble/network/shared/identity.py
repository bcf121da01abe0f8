"""Who this process is: the participant id from a flag, the environment or a pod name.

A participant names itself on every call it makes (:data:`PARTICIPANT_KEY`).

First match wins (``docs/architecture.md``, "One image, every role"):

1. ``--id``;
2. ``LENSEMBLE_PARTICIPANT_ID``;
3. the StatefulSet pod name in ``LENSEMBLE_POD_NAME`` (else ``HOSTNAME``): ``<name>-<ordinal>``
   is the ordinal-th participant, in config order, of trust domain ``LENSEMBLE_TRUST_DOMAIN``
   when that is set, else of all participants.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from lensemble.config import LensembleConfig
from lensemble.errors import UsageError

COORDINATOR_IDENTITY = "coordinator"
PARTICIPANT_ID_ENV = "LENSEMBLE_PARTICIPANT_ID"
#: Metadata key carrying the participant id a caller claims (every call of a participant): the
#: coordinator authenticates that claim before it reads any request
#: (:mod:`lensemble.network.coordinator.call_guard`).
PARTICIPANT_KEY = "lensemble-participant"
_POD_NAME = re.compile(r"^(?P<name>.+)-(?P<ordinal>\d+)$")


def resolve_participant_id(
    config: LensembleConfig, explicit: str | None, env: Mapping[str, str]
) -> str:
    """The participant id of this process.

    Args:
        config: The run's config.
        explicit: The ``--id`` flag, if given.
        env: The process environment.

    Returns:
        A participant id of the config.

    Raises:
        UsageError: No source names a participant, or the one found is not in the config.
    """
    ids = [p.id for p in config.federation.participants]
    for source, value in (("--id", explicit), (PARTICIPANT_ID_ENV, env.get(PARTICIPANT_ID_ENV))):
        if value:
            if value not in ids:
                raise UsageError(
                    f"{source} '{value}' is not a participant of this config;",
                    remediation=f"use one of {', '.join(sorted(ids))}.",
                )
            return value
    pod_var = "LENSEMBLE_POD_NAME" if env.get("LENSEMBLE_POD_NAME") else "HOSTNAME"
    pod = env.get(pod_var, "")
    match = _POD_NAME.match(pod)
    if match is None:
        raise UsageError(
            "no participant id: pass --id, set LENSEMBLE_PARTICIPANT_ID, or run as a "
            f"StatefulSet pod named <name>-<ordinal> ({pod_var} is {pod!r});",
            remediation=f"participants of this config: {', '.join(sorted(ids))}.",
        )
    domain = env.get("LENSEMBLE_TRUST_DOMAIN", "")
    members = [
        p.id for p in config.federation.participants if not domain or p.trust_domain == domain
    ]
    if domain and not members:
        raise UsageError(
            f"LENSEMBLE_TRUST_DOMAIN '{domain}' is not the trust domain of any participant;",
            remediation=f"use one of {', '.join(config.trust_domains)}.",
        )
    ordinal = int(match["ordinal"])
    if ordinal >= len(members):
        scope = f"trust domain '{domain}'" if domain else "the config"
        raise UsageError(
            f"pod {pod!r} has ordinal {ordinal}, but {scope} has only {len(members)} "
            "participant(s);",
            remediation="scale the StatefulSet to the participant count of the config.",
        )
    return members[ordinal]


def identity_path(template: str | None, identity: str) -> str | None:
    """A TLS or token path with ``{identity}`` replaced (``coordinator`` or a participant id)."""
    return None if template is None else template.replace("{identity}", identity)
