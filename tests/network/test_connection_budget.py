"""The open-file budget: the limit raised at start, and split between own files and ports."""

from __future__ import annotations

import json
import subprocess
import sys

from lensemble.network.coordinator.connection_budget import (
    FIXED_RESERVE,
    MAX_GRPC_CONNECTIONS,
    plan_budget,
)
from lensemble.network.shared.grpc_options import channel_options, ping_timeout_ms, server_options
from lensemble.network.shared.health import HEALTH_CONNECTIONS
from lensemble.network.shared.metrics_server import MAX_CONNECTIONS
from tests.support.federation import small_config

CHILD = """
import json, resource
from lensemble.network.shared.file_limits import raise_open_file_limit
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard))
limit = raise_open_file_limit()
print(json.dumps([limit.before, limit.soft, limit.hard, resource.getrlimit(resource.RLIMIT_NOFILE)]))
"""


def test_every_process_raises_its_soft_open_file_limit_to_the_hard_one() -> None:
    out = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    before, soft, hard, now = json.loads(out)
    assert before == min(256, hard)
    assert soft == hard == now[0] == now[1]


def test_the_ports_share_what_the_coordinators_own_files_leave() -> None:
    config = small_config()  # 4 participants
    budget = plan_budget(config, limit=1024, in_use=30)
    assert budget.per_address == 2 * 4 + 8
    assert budget.reserve == 30 + FIXED_RESERVE + 4 * 4
    assert budget.download == 2 * 4 + budget.per_address
    assert (budget.health, budget.metrics) == (HEALTH_CONNECTIONS, MAX_CONNECTIONS)
    # Everything together stays within the limit: running out is impossible by construction.
    assert budget.minimum_limit() == 1024
    assert not budget.short
    # However high the limit, the gRPC port's total stays bounded (each connection costs memory).
    assert plan_budget(config, limit=1 << 20, in_use=30).grpc == MAX_GRPC_CONNECTIONS


def test_a_limit_too_low_for_the_minimum_caps_is_reported() -> None:
    config = small_config()
    budget = plan_budget(config, limit=200, in_use=30)
    assert budget.short
    assert budget.grpc == 2 * 4 + budget.per_address  # the minimum, beyond the limit
    assert budget.minimum_limit() > 200


def test_the_per_address_cap_is_configurable() -> None:
    from lensemble.config.load import validate_mapping

    config = validate_mapping({"network": {"max_connections_per_address": 3}})
    assert plan_budget(config, limit=4096, in_use=30).per_address == 3


def test_pings_go_unanswered_for_liveness_minus_keepalive_at_most_on_both_sides() -> None:
    from lensemble.config.load import validate_mapping

    config = validate_mapping({"network": {"keepalive_s": 2, "liveness_timeout_s": 7}})
    assert ping_timeout_ms(config) == 5000
    server = dict(server_options(config, max_connections=123))
    channel = dict(channel_options(config))
    for options in (server, channel):
        assert options["grpc.keepalive_time_ms"] == 2000
        # grpcio bounds an unanswered ping by ping_timeout_ms (default 60 s), not keepalive's.
        assert options["grpc.http2.ping_timeout_ms"] == 5000
        assert options["grpc.keepalive_timeout_ms"] == 5000
    assert server["grpc.max_allowed_incoming_connections"] == 123
    assert server["grpc.server_handshake_timeout_ms"] == 5000  # handshake_timeout_s default
    assert server["grpc.max_connection_idle_ms"] == 10000  # max_connection_idle_s default
