"""``coordinator.runRecord``: the coordinator's run-record signing key, KMS or a mounted HMAC key."""

from __future__ import annotations

from typing import Any

import pytest

from lensemble.errors import ConfigError, UsageError
from tests.k8s.renders import values_of
from tests.support.tools import require

KMS_ARN = "arn:aws:kms:eu-central-1:111122223333:key/1234abcd-12ab-34cd-56ef-1234567890ab"


def _coordinator_pod(values: dict[str, Any]) -> dict[str, Any]:
    require("helm")
    from lensemble.render.k8s import render_chart

    [deployment] = [
        d
        for d in render_chart(values)
        if d["kind"] == "Deployment"
        and d["metadata"]["labels"].get("app.kubernetes.io/component") == "coordinator"
    ]
    return deployment["spec"]["template"]["spec"]


def _env(pod: dict[str, Any]) -> dict[str, str]:
    [container] = pod["containers"]
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def test_no_key_by_default() -> None:
    env = _env(_coordinator_pod(values_of("helm-sovereign-prod")))
    assert not {"LENSEMBLE_LEDGER_KMS_KEY_ID", "LENSEMBLE_LEDGER_KEY_FILE"} & env.keys()


def test_a_kms_key_reaches_the_coordinator_environment() -> None:
    values = values_of("helm-sovereign-prod")
    values.setdefault("coordinator", {})["runRecord"] = {"kmsKeyId": KMS_ARN}
    assert _env(_coordinator_pod(values))["LENSEMBLE_LEDGER_KMS_KEY_ID"] == KMS_ARN


def test_an_hmac_secret_is_mounted_read_only_and_named_by_the_key_file_variable() -> None:
    values = values_of("helm-staging")
    values.setdefault("coordinator", {})["runRecord"] = {"keySecret": "run-record-key"}
    pod = _coordinator_pod(values)
    path = _env(pod)["LENSEMBLE_LEDGER_KEY_FILE"]
    [volume] = [v for v in pod["volumes"] if v["name"] == "run-record-key"]
    assert volume["secret"]["secretName"] == "run-record-key"
    [container] = pod["containers"]
    [mount] = [m for m in container["volumeMounts"] if m["name"] == "run-record-key"]
    assert mount["readOnly"] is True
    assert path == f"{mount['mountPath']}/key"


def test_both_keys_at_once_is_refused_with_the_fix() -> None:
    values = values_of("helm-staging")
    values.setdefault("coordinator", {})["runRecord"] = {
        "kmsKeyId": KMS_ARN,
        "keySecret": "run-record-key",
    }
    with pytest.raises(UsageError) as err:
        _coordinator_pod(values)
    assert "not both" in str(err.value)


def test_a_secret_name_that_is_not_a_kubernetes_name_is_refused() -> None:
    values = values_of("helm-staging")
    values.setdefault("coordinator", {})["runRecord"] = {"keySecret": "Bad Name"}
    with pytest.raises(ConfigError):
        _coordinator_pod(values)
