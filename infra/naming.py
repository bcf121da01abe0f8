"""Labels of the namespaces the Pulumi program makes in place of the chart.

Every object name and label key comes from :mod:`lensemble.render.names`, the one place the
chart's names are computed in Python.
"""

from __future__ import annotations

from lensemble.config import LensembleConfig
from lensemble.render.names import RUN_LABEL, TRUST_DOMAIN_LABEL

__all__ = ["namespace_labels"]


def namespace_labels(config: LensembleConfig, trust_domain: str | None = None) -> dict[str, str]:
    """Labels of a namespace Pulumi makes.

    The chart's Pod Security Admission ``restricted`` profile (enforce, audit, warn), the run,
    and the trust domain when the namespace has one.
    """
    labels = {
        "app.kubernetes.io/part-of": "lensemble",
        RUN_LABEL: config.run.name,
        **{
            f"pod-security.kubernetes.io/{mode}": "restricted"
            for mode in ("enforce", "audit", "warn")
        },
    }
    if trust_domain is not None:
        labels[TRUST_DOMAIN_LABEL] = trust_domain
    return labels
