"""The program as a whole: releases, outputs, components, partitions and stack settings."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lensemble.errors import ConfigError
from tests.infra.conftest import (
    CLOUD_STACKS,
    PARTICIPANT_STACKS,
    REPO,
    STACKS,
    stack_lensemble_config,
)
from tests.infra.expected import REFERENCE_CA, REFERENCE_ENDPOINT, namespace_of, strings_in
from tests.support.tools import require

# pulumi_aws warns about its own deprecated classes whenever the engine loads them.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:pulumi_aws")

RELEASE = "kubernetes:helm.sh/v3:Release"


def expected_release(capture, stack):
    """(config, mode, trust domain, release namespace, overrides) a stack's release must have.

    A participant stack renders the config with the coordinator endpoint it was given, and
    pulls the image from its own region's repository.
    """
    config = stack_lensemble_config(stack)
    role = capture.exports["role"]
    overrides: dict = {"namespaces": {"create": False}}
    if role != "participant":
        if "runRecordKeyArn" in capture.exports:  # sovereign-prod signs its run record
            overrides["coordinator"] = {
                "runRecord": {"kmsKeyId": capture.exports["runRecordKeyArn"]}
            }
        return config, role, None, config.deployment.namespace.name, overrides
    [domain] = capture.of_type("lensemble:aws:ParticipantTrustDomain")
    [repository] = capture.of_type("aws:ecr/repository:Repository")
    pulled = capture.exports["imageRepositoryUrl"]
    assert pulled.endswith(f"/{repository.inputs['name']}")
    assert f".ecr.{capture.exports['region']}." in pulled
    host, port = REFERENCE_ENDPOINT.rsplit(":", 1)
    data = config.model_dump(mode="json")
    data["network"].update(host=host, port=int(port))
    effective = type(config).model_validate(data)
    overrides["image"] = {"repository": pulled}
    return effective, role, domain.name, namespace_of(config, domain.name), overrides


@pytest.mark.parametrize("stack", STACKS)
def test_release_values_equal_render_helm_values(captured, stack):
    from lensemble.config import config_hash
    from lensemble.render.helm_values import render_helm_values

    capture = captured(stack)
    [release] = capture.of_type(RELEASE)
    config, mode, trust_domain, namespace, overrides = expected_release(capture, stack)
    rendered, stack_owned = release.inputs["valueYamlFiles"]
    assert yaml.safe_load(rendered.text) == render_helm_values(
        config, mode=mode, trust_domain=trust_domain
    )
    assert yaml.safe_load(stack_owned.text) == overrides
    assert "values" not in release.inputs
    assert release.inputs["namespace"] == namespace
    assert (Path.cwd() / release.inputs["chart"]).resolve() == REPO / "charts" / "lensemble"
    # What a participant stack changes (where to dial) leaves the config hash alone.
    assert config_hash(config) == config_hash(stack_lensemble_config(stack))


def test_release_namespaces_are_made_by_pulumi_and_kept_on_destroy(captured):
    config = stack_lensemble_config("sovereign-prod")
    for stack in ("sovereign-prod", *PARTICIPANT_STACKS):
        capture = captured(stack)
        [release] = capture.of_type(RELEASE)
        made = {
            n.inputs["metadata"]["name"]: n for n in capture.of_type("kubernetes:core/v1:Namespace")
        }
        assert release.inputs["namespace"] in made
        for namespace in made.values():
            labels = namespace.inputs["metadata"]["labels"]
            assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
        assert set(made) <= {config.deployment.namespace.name} | {
            namespace_of(config, td) for td in config.trust_domains
        }


def test_local_registers_no_aws_resources(captured):
    capture = captured("local")
    config = stack_lensemble_config("local")
    assert not [
        r.type for r in capture.resources if r.type.startswith(("aws:", "pulumi:providers:aws"))
    ]
    [provider] = capture.of_type("pulumi:providers:kubernetes")
    assert provider.inputs["context"] == config.deployment.kube_context
    assert capture.of_type(RELEASE)[0].provider_id == f"{provider.name}-id"


@pytest.mark.parametrize("stack", CLOUD_STACKS)
def test_cloud_stack_outputs(captured, stack):
    capture = captured(stack)
    exports = capture.exports
    assert "kubeconfig" in capture.secret_exports
    assert '"command": "aws"' in exports["kubeconfig"]
    assert exports["imageRepositoryUrl"].endswith("/lensemble")
    for participant in exports["participants"].values():
        assert participant["bucket"] and participant["kmsKeyArn"].startswith("arn:")
    if stack in PARTICIPANT_STACKS:
        assert exports["coordinatorEndpoint"] == REFERENCE_ENDPOINT
        assert exports["coordinatorCa"] == REFERENCE_CA
        assert exports["egressIp"]
    else:
        from lensemble.render.helm_values import render_helm_values

        config = stack_lensemble_config(stack)
        dialed = render_helm_values(config)["config"]["network"]
        assert exports["coordinatorEndpoint"] == f"{dialed['host']}:{dialed['port']}"


@pytest.mark.parametrize("stack", STACKS)
def test_every_component_parents_its_children_and_registers_outputs(captured, stack):
    capture = captured(stack)
    components = [r for r in capture.resources if r.type.startswith("lensemble:")]
    assert components
    for component in components:
        assert component.urn in capture.component_outputs, f"{component.type} registered no outputs"
    for resource in capture.resources:
        if resource.type.startswith(("aws:", "kubernetes:helm.sh")):
            owner = next(capture.ancestors(resource), None)
            assert owner is not None and owner.type.startswith("lensemble:"), resource.name


@pytest.mark.parametrize("stack", CLOUD_STACKS)
def test_the_aws_stack_component_keeps_the_urns_its_children_had_at_the_root(captured, stack):
    capture = captured(stack)
    (component,) = capture.of_type("lensemble:aws:Stack")
    children = [r for r in capture.resources if r.parent == component.urn]
    assert {"lensemble:aws:Network", "lensemble:aws:Cluster", "pulumi:providers:aws"} <= {
        c.type for c in children
    }
    # Registered at the stack root before the component existed: each says so in an alias,
    # which Pulumi carries to its own children, so an existing stack updates in place.
    assert [c.name for c in children if not c.aliased_to_root] == []
    assert not component.aliased_to_root


def test_arns_follow_the_configured_partition(run_stack, tmp_path):
    data = yaml.safe_load((REPO / "config/staging.yaml").read_text())
    data["deployment"]["cloud"] = {
        "provider": "aws",
        "partition": "aws-eusc",
        "region": "eusc-de-east-1",
    }
    config_file = tmp_path / "eusc.yaml"
    config_file.write_text(yaml.safe_dump(data))
    capture = run_stack("staging", "aws-eusc", {"lensemble:configFile": str(config_file)})
    arns = [s for r in capture.resources for s in strings_in(r.inputs) if s.startswith("arn:")]
    assert any(":iam::aws:policy/AmazonEKSClusterPolicy" in a for a in arns)
    assert arns and all(a.startswith("arn:aws-eusc:") for a in arns), [
        a for a in arns if not a.startswith("arn:aws-eusc:")
    ]


def test_image_repository_is_immutable_scanned_and_keeps_sha_tags(captured):
    import json

    capture = captured("staging")
    [repository] = capture.of_type("aws:ecr/repository:Repository")
    assert repository.inputs["imageTagMutability"] == "IMMUTABLE"
    assert repository.inputs["imageScanningConfiguration"]["scanOnPush"] is True
    [lifecycle] = capture.of_type("aws:ecr/lifecyclePolicy:LifecyclePolicy")
    rules = json.loads(lifecycle.inputs["policy"])["rules"]
    sha_rules = [r for r in rules if r["selection"].get("tagPatternList") == ["sha-*"]]
    assert sha_rules and sha_rules[0]["selection"]["countType"] == "imageCountMoreThan"
    # Nothing else may expire tagged images (version tags and sha-* within the count stay).
    assert all(r["selection"]["tagStatus"] == "untagged" for r in rules if r not in sha_rules)


@pytest.mark.parametrize(
    ("stack", "extra", "key"),
    [
        ("sovereign-prod", {"lensemble:role": "all"}, "lensemble:role"),
        (
            "sovereign-prod",
            {"lensemble:apiAllowedCidrs": ["198.51.100.7/32"]},
            "lensemble:apiAllowedCidrs",
        ),
        (
            "sovereign-prod-org-berlin",
            {"lensemble:trustDomain": "org-atlantis"},
            "lensemble:trustDomain",
        ),
        (
            "sovereign-prod-org-berlin",
            {"lensemble:coordinatorStack": None},
            "lensemble:coordinatorStack",
        ),
        ("staging", {"lensemble:configFile": None}, "lensemble:configFile"),
        ("staging", {"lensemble:deployWith": "kubectl"}, "lensemble:deployWith"),
        ("sovereign-prod", {"lensemble:deployWith": "kustomize"}, "lensemble:deployWith"),
        (
            "sovereign-prod",
            {"lensemble:coordinatorIngressCidrs": ["0.0.0.0/0"]},
            "lensemble:coordinatorIngressCidrs",
        ),
    ],
)
def test_bad_stack_settings_name_the_key(run_stack, stack, extra, key):
    with pytest.raises(ConfigError) as caught:
        run_stack(stack, "aws", extra)
    assert caught.value.problems[0].path == key
    assert caught.value.problems[0].source == f"Pulumi.{stack}.yaml"


def test_participant_stack_can_take_the_coordinator_from_config(run_stack, tmp_path):
    ca = tmp_path / "consortium-ca.crt"
    ca.write_text("-----BEGIN CERTIFICATE-----\nDIRECT\n-----END CERTIFICATE-----\n")
    capture = run_stack(
        "sovereign-prod-org-paris",
        "aws",
        {
            "lensemble:coordinatorStack": None,
            "lensemble:coordinatorEndpoint": "coordinator.example.eu:443",
            "lensemble:coordinatorCaFile": str(ca),
        },
    )
    assert capture.of_type("pulumi:pulumi:StackReference") == []
    assert capture.exports["coordinatorEndpoint"] == "coordinator.example.eu:443"
    assert "DIRECT" in capture.exports["coordinatorCa"]


def test_every_sovereign_participant_has_a_stack_file():
    config = stack_lensemble_config("sovereign-prod")
    domains = set()
    for stack in PARTICIPANT_STACKS:
        document = yaml.safe_load((REPO / f"Pulumi.{stack}.yaml").read_text())["config"]
        assert document["lensemble:configFile"] == "config/sovereign-prod.yaml"
        domains.add(document["lensemble:trustDomain"])
    assert sorted(domains) == config.trust_domains


def test_every_stack_file_disables_default_providers():
    for stack in STACKS:
        document = yaml.safe_load((REPO / f"Pulumi.{stack}.yaml").read_text())["config"]
        assert document["pulumi:disable-default-providers"] == ["*"], stack


@pytest.mark.parametrize("stack", STACKS)
def test_every_resource_has_an_explicit_provider(captured, stack):
    capture = captured(stack)
    for resource in capture.resources:
        if resource.custom and resource.type.startswith(("aws:", "kubernetes:")):
            assert capture.provider_of(resource) is not None, resource.name


def test_program_imports_no_torch():
    require("pulumi")
    code = "import sys; import infra.program; sys.exit('torch' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr or "infra.program imported torch"


def certs_dir(root, identities):
    """A directory laid out as docs/architecture.md says `lensemble certs init` writes it."""
    root.mkdir()
    (root / "ca.crt").write_text("CA CERTIFICATE\n")
    (root / "ca.key").write_text("CA PRIVATE KEY\n")
    for identity in identities:
        (root / identity).mkdir()
        (root / identity / "tls.crt").write_text(f"{identity} CERTIFICATE\n")
        (root / identity / "tls.key").write_text(f"{identity} PRIVATE KEY\n")
        (root / identity / "ca.crt").write_text("CA CERTIFICATE\n")
    return root


def test_local_makes_a_tls_secret_per_identity_from_a_certs_directory(run_stack, tmp_path):
    config = stack_lensemble_config("local")
    identities = ["coordinator", *(p.id for p in config.federation.participants)]
    certs = certs_dir(tmp_path / "certs", identities)
    capture = run_stack("local", "aws", {"lensemble:tlsDir": str(certs)})
    secrets = {
        s.inputs["metadata"]["name"]: s for s in capture.of_type("kubernetes:core/v1:Secret")
    }
    assert sorted(secrets) == sorted(f"{config.run.name}-{i}-tls" for i in identities)
    for identity in identities:
        secret = secrets[f"{config.run.name}-{identity}-tls"]
        data = secret.inputs["stringData"]
        assert data["tls.crt"] == (certs / identity / "tls.crt").read_text()
        assert data["ca.crt"] == (certs / "ca.crt").read_text()
        assert secret.secret_paths & {"stringData", "stringData.tls.key"}
    # The development CA's own key never leaves the directory.
    ca_key = (certs / "ca.key").read_text()
    assert not any(ca_key in str(r.inputs) for r in capture.resources)


def test_participant_stack_trusts_the_coordinator_ca(run_stack, tmp_path):
    config = stack_lensemble_config("sovereign-prod-org-dublin")
    site = tmp_path / "dublin"
    site.mkdir()
    (site / "tls.crt").write_text(
        "-----BEGIN CERTIFICATE-----\nDUBLIN\n-----END CERTIFICATE-----\n"
    )
    (site / "tls.key").write_text(
        "-----BEGIN PRIVATE KEY-----\nSITE-ONLY\n-----END PRIVATE KEY-----\n"
    )
    (site / "ca.crt").write_text(
        "-----BEGIN CERTIFICATE-----\nSOME-OTHER-CA\n-----END CERTIFICATE-----\n"
    )
    capture = run_stack("sovereign-prod-org-dublin", "aws", {"lensemble:tlsDir": str(tmp_path)})
    [secret] = capture.of_type("kubernetes:core/v1:Secret")
    assert secret.inputs["type"] == "kubernetes.io/tls"
    assert secret.inputs["metadata"]["name"] == f"{config.run.name}-dublin-tls"
    assert secret.inputs["metadata"]["namespace"] == namespace_of(config, "org-dublin")
    data = secret.inputs["stringData"]
    assert data["ca.crt"] == REFERENCE_CA
    assert "DUBLIN" in data["tls.crt"] and "SITE-ONLY" in data["tls.key"]
    # The key reaches the engine only as a secret (Pulumi encrypts it in the state).
    assert secret.secret_paths & {"stringData", "stringData.tls.key"}


def test_missing_tls_file_names_the_setting(run_stack, tmp_path):
    with pytest.raises(ConfigError) as caught:
        run_stack("sovereign-prod-org-dublin", "aws", {"lensemble:tlsDir": str(tmp_path)})
    problem = caught.value.problems[0]
    assert problem.path == "lensemble:tlsDir"
    assert "dublin/tls.crt" in problem.message


def test_staging_can_deploy_its_kustomize_overlay(run_stack):
    capture = run_stack("staging", "aws", {"lensemble:deployWith": "kustomize"})
    [directory] = capture.of_type("kubernetes:kustomize/v2:Directory")
    assert (Path.cwd() / directory.inputs["directory"]).resolve() == REPO / "overlays/staging"
    assert capture.of_type(RELEASE) == []
    # The overlay makes the namespaces; Pulumi makes none that would collide with them.
    assert capture.of_type("kubernetes:core/v1:Namespace") == []


def test_a_port_mapped_coordinator_endpoint_turns_the_download_port_off():
    # Issue 41, item 13: behind a front door forwarding one port, participants rewrote only
    # the gRPC address and quietly fell back to FetchModel after dialing the download port.
    from infra.deployment import with_endpoint
    from lensemble.config import config_hash

    config = stack_lensemble_config("sovereign-prod")
    same = with_endpoint(config, f"coordinator.example.eu:{config.network.port}")
    assert same.network.download_port == config.network.download_port is not None
    mapped = with_endpoint(config, "coordinator.example.eu:443")
    assert (mapped.network.host, mapped.network.port) == ("coordinator.example.eu", 443)
    assert mapped.network.download_port is None  # FetchModel over the one forwarded port
    assert config_hash(mapped) == config_hash(config)
