"""A rendered pod as the cluster would run it: its TLS volume laid out on disk, its config read.

The chart tests fill each identity's Secret the way the cluster would (cert-manager, or the
organisations' CAs), write a pod's projected TLS volume under a folder, and read the config
the pod mounts with its TLS paths moved there, so the runtime's own code can run on them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from lensemble.config import LensembleConfig
from lensemble.config.load import validate_mapping
from lensemble.render.container import TLS_DIR

Docs = list[dict[str, Any]]
#: (namespace, Secret name) -> the Secret's data.
Secrets = dict[tuple[str, str], dict[str, bytes]]


def find(docs: Docs, kind: str, namespace: str, name: str) -> dict[str, Any]:
    """The document of ``kind`` named ``name`` in ``namespace``."""
    return next(
        d
        for d in docs
        if d["kind"] == kind
        and d["metadata"]["name"] == name
        and d["metadata"]["namespace"] == namespace
    )


def pods_of(docs: Docs, component: str) -> list[tuple[str, dict[str, Any]]]:
    """(namespace, pod template) of every workload of ``component`` (coordinator, participant)."""
    return [
        (d["metadata"]["namespace"], d["spec"]["template"])
        for d in docs
        if d["kind"] in ("Deployment", "StatefulSet")
        and d["metadata"]["labels"]["app.kubernetes.io/component"] == component
    ]


def volume(pod: dict[str, Any], name: str) -> dict[str, Any]:
    """The pod's volume called ``name``."""
    return next(v for v in pod["spec"]["volumes"] if v["name"] == name)


def lay_out(namespace: str, pod: dict[str, Any], secrets: Secrets, root: Path) -> None:
    """Write the pod's projected TLS volume under ``root``, as the kubelet would."""
    for source in volume(pod, "tls")["projected"]["sources"]:
        ref = source["secret"]
        data = secrets[(namespace, ref["name"])]
        for item in ref["items"]:
            path = root / item["path"]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data[item["key"]])


def pod_config(docs: Docs, namespace: str, pod: dict[str, Any], root: Path) -> LensembleConfig:
    """The config the pod mounts, its TLS paths moved from the mount point to ``root``."""
    name = volume(pod, "config")["configMap"]["name"]
    mapping = yaml.safe_load(find(docs, "ConfigMap", namespace, name)["data"]["config.yaml"])
    tls = mapping["network"]["tls"]
    for field in ("ca_file", "cert_file", "key_file"):
        assert tls[field].startswith(f"{TLS_DIR}/")
        tls[field] = tls[field].replace(TLS_DIR, str(root), 1)
    return validate_mapping(mapping)
