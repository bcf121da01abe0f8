"""Table-driven: every invalid config gets exit 2, the field path, and a message with the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.cli import run_cli

LOCAL = "config/local.yaml"
PROD = "config/sovereign-prod.yaml"
STAGING = "config/staging.yaml"

# (id, base config or inline YAML text, --set overrides, expected path, expected message part)
CASES: list[tuple[str, str, list[str], str, str]] = [
    ("unknown-top-level-key", "modle: {}\n", [], "modle", "did you mean 'model'"),
    ("unknown-nested-key", LOCAL, ["federation.roundz=3"], "roundz=3", "did you mean 'rounds'"),
    (
        "wrong-type-int",
        LOCAL,
        ["federation.rounds=abc"],
        "federation.rounds",
        "expected a valid integer",
    ),
    (
        "wrong-type-bool",
        LOCAL,
        ["data.residency_enforced=maybe"],
        "data.residency_enforced",
        "valid boolean",
    ),
    (
        "wrong-type-list",
        LOCAL,
        ["federation.participants=7"],
        "federation.participants",
        "valid list",
    ),
    (
        "unknown-transport",
        LOCAL,
        ["federation.transport=carrier-pigeon"],
        "federation.transport",
        "use 'in_process' or 'network'",
    ),
    (
        "unknown-quantization",
        LOCAL,
        ["federation.quantization=int4"],
        "federation.quantization",
        "'none', 'fp16', 'bf16' or 'int8'",
    ),
    (
        "quorum-above-participants",
        LOCAL,
        ["federation.quorum=9"],
        "federation.quorum",
        "outside 1..4",
    ),
    ("quorum-negative", LOCAL, ["federation.quorum=-1"], "federation.quorum", "out of range"),
    (
        "duplicate-participant-id",
        LOCAL,
        ["federation.participants[1].id=alpine"],
        "federation.participants[1].id",
        "already used by participants[0]",
    ),
    (
        "participant-id-not-dns",
        LOCAL,
        ["federation.participants[0].id=Alpine_1"],
        "federation.participants[0].id",
        "DNS-1123",
    ),
    (
        "participant-id-missing",
        "federation:\n  participants:\n    - trust_domain: x\n",
        [],
        "federation.participants[0].id",
        "is required",
    ),
    (
        "residency-off-with-network",
        LOCAL,
        ["federation.transport=network", "data.residency_enforced=false"],
        "data.residency_enforced",
        "set data.residency_enforced: true",
    ),
    (
        "rpc-timeout-not-below-round",
        LOCAL,
        ["network.rpc_timeout_s=60"],
        "network.rpc_timeout_s",
        "must be below federation.round_timeout_s",
    ),
    (
        "join-timeout-below-round",
        LOCAL,
        ["federation.join_timeout_s=30"],
        "federation.join_timeout_s",
        "must be at least federation.round_timeout_s",
    ),
    (
        "masking-over-the-network-without-client-certificates",
        LOCAL,
        [
            "federation.aggregation=masking",
            "federation.transport=network",
            "network.auth=token",
            "network.tls.client_auth=false",
        ],
        "network.tls.client_auth",
        "signs its secure-aggregation keys with the key of its client certificate",
    ),
    (
        "masking-int8",
        LOCAL,
        ["federation.aggregation=masking", "federation.quantization=int8"],
        "federation.quantization",
        "the masked upload is 64-bit fixed point",
    ),
    (
        "aggregation-tee",
        LOCAL,
        ["federation.aggregation=tee"],
        "federation.aggregation",
        "'tee' is not yet supported",
    ),
    (
        "prod-in-process",
        PROD,
        ["federation.transport=in_process"],
        "federation.transport",
        "not allowed in sovereign-prod",
    ),
    ("prod-token-auth", PROD, ["network.auth=token"], "network.auth", "set network.auth: mtls"),
    (
        "prod-insecure",
        PROD,
        ["network.auth=insecure", "network.tls.enabled=false"],
        "network.auth",
        "'insecure' is not allowed in sovereign-prod",
    ),
    (
        "prod-no-confidential",
        PROD,
        ["deployment.confidential_compute=false"],
        "deployment.confidential_compute",
        "not allowed in sovereign-prod",
    ),
    (
        "prod-missing-region",
        PROD,
        ["federation.participants[2].region=null"],
        "federation.participants[2].region",
        "is missing for participant 'paris'",
    ),
    (
        "prod-shared-trust-domain",
        PROD,
        ["federation.participants[1].trust_domain=org-berlin"],
        "federation.participants[1].trust_domain",
        "shared with participant 'berlin'",
    ),
    (
        "prod-single-namespace",
        PROD,
        ["deployment.namespace.strategy=single"],
        "deployment.namespace.strategy",
        "per-trust-domain",
    ),
    (
        "gpu-without-cuda-tag",
        STAGING,
        ["deployment.resources.participant.gpu=1"],
        "deployment.image.tag",
        "not a CUDA build",
    ),
    (
        "latest-tag-in-staging",
        STAGING,
        ["deployment.image.tag=latest"],
        "deployment.image.tag",
        "'latest' is not allowed in staging",
    ),
    (
        "unknown-physics-param",
        LOCAL,
        ["federation.participants[0].env_params.gravity=9"],
        "federation.participants[0].env_params.gravity",
        "not a physics parameter of Pendulum-v1",
    ),
    (
        "negative-physics-param",
        LOCAL,
        ["federation.participants[0].env_params.m=-1"],
        "federation.participants[0].env_params.m",
        "finite number above 0",
    ),
    (
        "mtls-without-client-auth",
        STAGING,
        ["network.tls.client_auth=false"],
        "network.tls.client_auth",
        "set network.tls.client_auth: true",
    ),
    (
        "tls-missing-ca",
        STAGING,
        ["network.tls.ca_file=null"],
        "network.tls.ca_file",
        "is required when TLS is on",
    ),
    (
        "tls-off-with-mtls",
        STAGING,
        ["network.tls.enabled=false"],
        "network.tls.enabled",
        "enable TLS or set network.auth: insecure",
    ),
    (
        "holdout-leaves-nothing",
        LOCAL,
        ["data.holdout_fraction=0.01"],
        "data.holdout_fraction",
        "leaves no train or no held-out episode",
    ),
    (
        "holdout-out-of-range",
        LOCAL,
        ["data.holdout_fraction=1.5"],
        "data.holdout_fraction",
        "out of range",
    ),
    (
        "window-too-long",
        LOCAL,
        ["data.window=100"],
        "data.window",
        "must be below data.episode_steps",
    ),
    (
        "metrics-port-clash",
        LOCAL,
        ["network.metrics_port=50051"],
        "network.metrics_port",
        "give each its own port",
    ),
    (
        "placement-unknown-trust-domain",
        LOCAL,
        ["deployment.trust_domains={nowhere: {node_selector: {a: b}}}"],
        "deployment.trust_domains.nowhere",
        "not the trust domain of any participant",
    ),
    (
        "int8-chunk-without-int8",
        LOCAL,
        ["federation.int8_chunk=1024"],
        "federation.int8_chunk",
        "only applies to int8",
    ),
    ("run-name-not-dns", LOCAL, ["run.name=My Run"], "run.name", "DNS-1123"),
    ("port-out-of-range", LOCAL, ["network.port=70000"], "network.port", "out of range"),
    (
        "bad-cpu-quantity",
        LOCAL,
        ["deployment.resources.participant.cpu=two"],
        "deployment.resources.participant.cpu",
        "does not match",
    ),
    ("empty-file", "# nothing but a comment\n", [], "config.yaml", "is empty"),
    (
        "set-index-past-the-end",
        LOCAL,
        ["federation.participants[9].region=eu-west-1"],
        "federation.participants[9]",
        "the list has 4 item(s) here; check the index",
    ),
    (
        "set-index-of-generated-participants",
        STAGING,
        ["federation.participants[1].region=eu-west-1"],
        "federation.participants[1]",
        "list them under federation.participants",
    ),
    (
        "set-below-a-value",
        LOCAL,
        ["run.name.first=x"],
        "run.name.first",
        "run.name is a value, not a mapping or list",
    ),
]


@pytest.mark.parametrize(
    ("base", "overrides", "path", "message"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_invalid_config_is_reported_with_path_and_fix(
    in_repo: Path, tmp_path: Path, base: str, overrides: list[str], path: str, message: str
) -> None:
    if base.endswith(".yaml"):
        file = base
    else:
        file = str(tmp_path / "config.yaml")
        Path(file).write_text(base, encoding="utf-8")
    args = ["config", "validate", file]
    for item in overrides:
        args += ["--set", item]
    result = run_cli(*args)
    assert result.code == 2, result
    assert result.out == ""
    lines = [line for line in result.err.splitlines() if line.startswith("error: ")]
    assert lines, result.err
    matching = [line for line in lines if path in line and message in line]
    assert matching, f"no line names {path!r} with {message!r}:\n{result.err}"


def test_there_are_at_least_25_distinct_cases() -> None:
    assert len({case[0] for case in CASES}) == len(CASES) >= 25


def test_malformed_yaml_reports_file_line_and_column(tmp_path: Path) -> None:
    file = tmp_path / "broken.yaml"
    file.write_text("federation:\n  rounds: 5\n  quorum: [1, 2\nrun: {}\n", encoding="utf-8")
    result = run_cli("config", "validate", str(file))
    assert result.code == 2
    assert f"error: {file}:4:4: malformed YAML" in result.err


def test_top_level_must_be_a_mapping(tmp_path: Path) -> None:
    file = tmp_path / "list.yaml"
    file.write_text("- a\n- b\n", encoding="utf-8")
    result = run_cli("config", "validate", str(file))
    assert result.code == 2
    assert "not a mapping" in result.err


def test_value_errors_point_at_their_line(tmp_path: Path) -> None:
    file = tmp_path / "c.yaml"
    file.write_text("run:\n  name: ok\nfederation:\n  rounds: zero\n", encoding="utf-8")
    result = run_cli("config", "validate", str(file))
    assert f"{file}:4:11: federation.rounds" in result.err


def test_all_problems_are_reported_together(in_repo: Path) -> None:
    result = run_cli(
        "config",
        "validate",
        PROD,
        "--set",
        "deployment.confidential_compute=false",
        "--set",
        "network.auth=token",
        "--set",
        "federation.participants[0].region=null",
    )
    assert result.code == 2
    assert len([line for line in result.err.splitlines() if line.startswith("error:")]) == 3


def test_missing_file_and_bad_set_flag(in_repo: Path) -> None:
    missing = run_cli("config", "validate", "nope.yaml")
    assert missing.code == 2
    assert "nope.yaml: does not exist" in missing.err
    bad_flag = run_cli("config", "validate", LOCAL, "--set", "federation.rounds")
    assert bad_flag.code == 2
    assert "is not of the form path.to.field=value" in bad_flag.err


def test_rules_between_fields_wait_for_valid_fields_and_say_so(in_repo: Path) -> None:
    both = run_cli(
        "config", "validate", LOCAL, "--set", "federation.rounds=-3", "--set", "federation.quorum=7"
    )
    assert both.code == 2
    assert "federation.rounds" in both.err and "federation.quorum" not in both.err
    assert "note: the rules between fields" in both.err
    rule_only = run_cli("config", "validate", LOCAL, "--set", "federation.quorum=7")
    assert rule_only.code == 2
    assert "federation.quorum" in rule_only.err and "note:" not in rule_only.err


@pytest.mark.parametrize(
    ("flag", "field"),
    [
        ("nonexist.key=1", "nonexist"),
        ("federation.nonexist.key=1", "federation.nonexist"),
        ("federation.participants[0].nope.x=1", "federation.participants[0].nope"),
    ],
)
def test_an_unknown_key_a_set_flag_creates_is_blamed_on_the_flag(
    in_repo: Path, flag: str, field: str
) -> None:
    # Issue 41, item 6: the unknown key was blamed on the config file, which does not have it.
    result = run_cli("config", "validate", LOCAL, "--set", flag)
    assert result.code == 2
    assert result.err.startswith(f"error: --set {flag}: {field}: unknown key"), result.err
    assert LOCAL not in result.err
