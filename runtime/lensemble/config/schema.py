"""``LensembleConfig``: the one validated source of truth that every substrate renders.

Pydantic v2, frozen, ``extra="forbid"``: an unknown key is an error, never silently ignored.
Every field carries a description with its unit so it shows in the exported JSON Schema
(``config/lensemble.schema.json``) and in editors through the yaml-language-server modeline.

The sections live in their own modules (:mod:`~lensemble.config.sections`,
:mod:`~lensemble.config.federation_section`, :mod:`~lensemble.config.network_section`,
:mod:`~lensemble.config.deployment_section`) and are re-exported here, the import path every
reader uses. Shorthands are resolved before validation (:mod:`lensemble.config.shorthands`).
Cross-field rules are the registry of :mod:`lensemble.config.rules`; each violation becomes one
:class:`~lensemble.errors.ConfigProblem` naming the field path, the value, what is expected and
the fix. All violations are reported together, not only the first.
"""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field, model_validator

from lensemble.config import rules
from lensemble.config.deployment_section import (
    CloudConfig,
    DeploymentConfig,
    GangSchedulingConfig,
    ImageConfig,
    NamespaceConfig,
    ResourcesConfig,
    RoleResources,
    StorageConfig,
    Toleration,
    TrustDomainPlacement,
)
from lensemble.config.federation_section import (
    NODE_RANK_ENV,
    RENDEZVOUS_HOST_ENV,
    AdamBeta,
    DivergenceGuardConfig,
    FederationConfig,
    InnerOptimizerConfig,
    MaskingConfig,
    OuterOptimizerConfig,
    ParticipantSpec,
    RankLayout,
    RankLayoutOverride,
    RobustnessConfig,
)
from lensemble.config.network_section import NetworkConfig, TLSConfig
from lensemble.config.privacy_section import CentralPrivacyConfig, PrivacyConfig
from lensemble.config.sections import (
    CUDA_TAG,
    DNS1123_LABEL,
    DNS1123_SUBDOMAIN,
    K8S_CPU,
    K8S_MEMORY,
    RESERVED_AGGREGATIONS,
    RESERVED_PARTICIPANT_IDS,
    UNPINNED_TAG,
    UNPINNED_TAG_ALLOWED_IN,
    DataConfig,
    Environment,
    EvaluationConfig,
    MiB,
    ModelConfig,
    ObservabilityConfig,
    RunConfig,
    _Section,
    unpinned_tag_refused,
)
from lensemble.config.shorthands import DEFAULT_PARTICIPANTS, resolve_shorthands
from lensemble.errors import ConfigError

__all__ = [
    "CUDA_TAG",
    "DEFAULT_PARTICIPANTS",
    "DNS1123_LABEL",
    "DNS1123_SUBDOMAIN",
    "K8S_CPU",
    "K8S_MEMORY",
    "NODE_RANK_ENV",
    "RENDEZVOUS_HOST_ENV",
    "RESERVED_AGGREGATIONS",
    "RESERVED_PARTICIPANT_IDS",
    "UNPINNED_TAG",
    "UNPINNED_TAG_ALLOWED_IN",
    "AdamBeta",
    "CentralPrivacyConfig",
    "CloudConfig",
    "DataConfig",
    "DeploymentConfig",
    "DivergenceGuardConfig",
    "Environment",
    "EvaluationConfig",
    "FederationConfig",
    "GangSchedulingConfig",
    "ImageConfig",
    "InnerOptimizerConfig",
    "LensembleConfig",
    "MaskingConfig",
    "MiB",
    "ModelConfig",
    "NamespaceConfig",
    "NetworkConfig",
    "ObservabilityConfig",
    "OuterOptimizerConfig",
    "ParticipantSpec",
    "PrivacyConfig",
    "RankLayout",
    "RankLayoutOverride",
    "ResourcesConfig",
    "RobustnessConfig",
    "RoleResources",
    "RunConfig",
    "StorageConfig",
    "TLSConfig",
    "Toleration",
    "TrustDomainPlacement",
    "resolve_shorthands",
    "unpinned_tag_refused",
]

SCHEMA_ID = "https://lensemble.dev/schema/lensemble-config-v1.json"


def _schema_extra(schema: dict[str, Any]) -> None:
    """The schema's ``$id``, and every cross-field rule JSON Schema can say (``allOf``)."""
    schema["$id"] = SCHEMA_ID
    schema["allOf"] = rules.json_schemas()


class LensembleConfig(_Section):
    """The whole Lensemble configuration (schema version 1)."""

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        allow_inf_nan=False,
        title="LensembleConfig",
        json_schema_extra=_schema_extra,
    )

    run: RunConfig = Field(default_factory=RunConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    federation: FederationConfig = Field(default_factory=FederationConfig)
    network: NetworkConfig = Field(default_factory=NetworkConfig)
    observability: ObservabilityConfig = Field(default_factory=ObservabilityConfig)
    evaluation: EvaluationConfig = Field(default_factory=EvaluationConfig)
    deployment: DeploymentConfig = Field(default_factory=DeploymentConfig)

    @model_validator(mode="before")
    @classmethod
    def _resolve_shorthands(cls, data: Any) -> Any:
        return resolve_shorthands(data)

    @model_validator(mode="after")
    def _cross_field_rules(self) -> LensembleConfig:
        problems = rules.problems(self)
        if problems:
            raise ConfigError(problems)
        return self

    # Convenience views used by every renderer.
    @property
    def participant_ids(self) -> list[str]:
        """Participant ids in canonical (sorted) order, the order of every reduction."""
        return sorted(p.id for p in self.federation.participants)

    def participant(self, participant_id: str) -> ParticipantSpec:
        """The participant with this id.

        Raises:
            KeyError: No participant has that id.
        """
        for p in self.federation.participants:
            if p.id == participant_id:
                return p
        raise KeyError(participant_id)

    def rank_layout(self, participant_id: str) -> RankLayout:
        """The participant's rank layout: ``federation.ranks`` with its own overrides applied.

        Raises:
            KeyError: No participant has that id.
        """
        own = self.participant(participant_id).ranks
        if own is None:
            return self.federation.ranks
        return self.federation.ranks.model_copy(update=own.model_dump(exclude_none=True))

    @property
    def trust_domains(self) -> list[str]:
        """Distinct trust domains, sorted."""
        return sorted({p.trust_domain for p in self.federation.participants})
