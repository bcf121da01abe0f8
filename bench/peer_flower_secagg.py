"""Flower's SecAgg+ in one process, for ``bench/secagg.py --flwr-python`` (optional peer).

Runs in an interpreter with Flower installed (its own environment; it pins its own grpcio and
protobuf), e.g.::

    python3 -m venv /tmp/flwr-venv && /tmp/flwr-venv/bin/pip install 'flwr==1.42.*' numpy
    /tmp/flwr-venv/bin/python bench/peer_flower_secagg.py --n 20 --d 1000000

One round of Flower's ``SecAggPlusWorkflow`` (``DefaultWorkflow(fit_workflow=...)`` with FedAvg,
no evaluation) over an in-process grid that hands each message to a ``ClientApp`` with
``secaggplus_mod``, one client after another: no network; each message goes through Flower's
protobuf encoding and back, as Lensemble's in-process driver encodes and decodes its own.
Each client's ``fit`` returns one float32 array of d values (the global parameters scaled by a
constant). ``--shares`` is Flower's ``num_shares``: 1.0 (every client a neighbour of every
other: the full graph, as in Lensemble) or an odd count (SecAgg+'s sparse ring). Prints one
JSON line: the fastest of ``--repeat`` rounds, seconds of wall time for the whole round
(``one_process_s``) and the part spent inside the clients (``client_total_s``).
"""

from __future__ import annotations

import argparse
import json
import logging
import time
import types
import uuid
from collections.abc import Iterable

import numpy as np
from flwr.client import ClientApp, NumPyClient
from flwr.client.mod import secaggplus_mod
from flwr.common import Context, RecordDict, ndarrays_to_parameters
from flwr.common.logger import FLOWER_LOGGER
from flwr.common.serde import message_from_proto, message_to_proto
from flwr.server import Grid, LegacyContext, ServerConfig
from flwr.server.strategy import FedAvg
from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow


class LocalGrid(Grid):  # type: ignore[misc]
    """Every message goes straight to its node's ClientApp, in this process."""

    def __init__(self, n: int, app: ClientApp) -> None:
        self.app = app
        self.nodes = list(range(1, n + 1))
        self.contexts = {
            nid: Context(run_id=1, node_id=nid, node_config={}, state=RecordDict(), run_config={})
            for nid in self.nodes
        }
        self.client_s = 0.0

    def set_run(self, run_id: int) -> None:
        pass

    @property
    def run(self):  # type: ignore[no-untyped-def]
        return types.SimpleNamespace(run_id=1)

    def create_message(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        raise NotImplementedError

    def get_node_ids(self) -> Iterable[int]:
        return list(self.nodes)

    def push_messages(self, messages):  # type: ignore[no-untyped-def]
        raise NotImplementedError

    def pull_messages(self, message_ids):  # type: ignore[no-untyped-def]
        raise NotImplementedError

    def send_and_receive(self, messages, *, timeout=None):  # type: ignore[no-untyped-def]
        replies = []
        for message in messages:
            message.metadata.__dict__["_message_id"] = uuid.uuid4().hex
            # Each node gets its own copy, through Flower's wire format, as over a network
            # (the workflow shares one content object between nodes, which the mod changes).
            delivered = message_from_proto(message_to_proto(message))
            start = time.perf_counter()
            reply = self.app(delivered, self.contexts[message.metadata.dst_node_id])
            self.client_s += time.perf_counter() - start
            replies.append(message_from_proto(message_to_proto(reply)))
        return replies


def one_round(n: int, d: int, shares: float) -> dict[str, float]:
    base = (np.random.default_rng(0).standard_normal(d) * 0.01).astype(np.float32)

    class Scale(NumPyClient):  # type: ignore[misc]
        def fit(self, parameters, config):  # type: ignore[no-untyped-def]
            return [p * np.float32(0.999) for p in parameters], 1, {}

    app = ClientApp(client_fn=lambda context: Scale().to_client(), mods=[secaggplus_mod])
    grid = LocalGrid(n, app)
    strategy = FedAvg(
        fraction_fit=1.0,
        fraction_evaluate=0.0,
        min_fit_clients=n,
        min_available_clients=n,
        initial_parameters=ndarrays_to_parameters([base]),
    )
    context = LegacyContext(
        context=Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={}),
        config=ServerConfig(num_rounds=1),
        strategy=strategy,
    )
    neighbours = n if shares == 1.0 else int(shares)
    fit = SecAggPlusWorkflow(
        num_shares=1.0 if shares == 1.0 else int(shares),
        reconstruction_threshold=max(2, 2 * neighbours // 3 + 1),  # as Lensemble's default t
    )
    timed: dict[str, float] = {}

    def timed_fit(g, c):  # type: ignore[no-untyped-def]
        start = time.perf_counter()
        fit(g, c)
        timed["round"] = time.perf_counter() - start

    DefaultWorkflow(fit_workflow=timed_fit)(grid, context)
    # The clients' initial parameters are the strategy's: no client round trip before fit.
    return {"one_process_s": timed["round"], "client_total_s": grid.client_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, required=True)
    parser.add_argument("--d", type=int, required=True)
    parser.add_argument("--shares", type=float, default=1.0)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    FLOWER_LOGGER.setLevel(logging.ERROR)
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    runs = [one_round(args.n, args.d, args.shares) for _ in range(args.repeat)]
    best = min(runs, key=lambda r: r["one_process_s"])
    print(json.dumps({"n": args.n, "d": args.d, "shares": args.shares, **best}))


if __name__ == "__main__":
    main()
