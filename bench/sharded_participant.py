"""A participant's inner step sharded over R = 1 and R = 2 gloo ranks: memory and throughput.

One run launches the same FSDP2 inner loop as :mod:`lensemble.ranks.worker` (``fully_shard``
over the world model, AdamW, the global batch split across ranks with
:func:`lensemble.ranks.sharded_loss.sharded_jepa_loss`) with torch's elastic launcher, first
with one rank and then with two, on a world model large enough to matter here
(``hidden_dim 2048``, ``depth 4``: about 25 M parameters). Per rank it reports:

- the bytes this rank holds between steps: its shard of the parameters, of their gradients
  and of the AdamW moments (from the local tensors, exact);
- its peak resident set size (``ru_maxrss``: interpreter, torch, the unsharded parameters
  FSDP2 gathers for compute, activations);
- inner-step throughput: global-batch windows per second over the timed steps (after a
  warm-up step), the slowest rank's time.

    nice -n 19 python bench/sharded_participant.py [--steps 4] [--batch 32] [--hidden 2048]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

REPO = Path(__file__).resolve().parents[1]


def _tensor_bytes(t: torch.Tensor) -> int:
    local = t.to_local() if hasattr(t, "to_local") else t
    return int(local.numel() * local.element_size())


def bench_rank(spec_text: str) -> None:
    """One rank: build, shard, train ``steps`` + 1 inner steps, report to ``spec['out']``."""
    from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

    from lensemble.data.envs import env_spec
    from lensemble.model.worldmodel import WorldModel
    from lensemble.ranks.sharded_loss import sharded_jepa_loss

    spec = json.loads(spec_text)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    env = env_spec("Pendulum-v1")
    torch.manual_seed(0)
    model = WorldModel(env, spec["latent"], spec["hidden"], spec["depth"])
    params = sum(p.numel() for p in model.parameters())
    fully_shard(model)
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    register_fsdp_forward_method(model, "encode")
    register_fsdp_forward_method(model, "rollout")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    batch, window = spec["batch"], spec["window"]
    rows = batch // world
    generator = torch.Generator().manual_seed(1)
    obs = torch.randn(batch, window + 1, env.obs_dim, generator=generator)
    actions = torch.randn(batch, window, env.action_dim, generator=generator)
    mine = slice(rank * rows, (rank + 1) * rows)
    times = []
    for step in range(spec["steps"] + 1):
        dist.barrier()
        start = time.perf_counter()
        terms = sharded_jepa_loss(
            model,
            obs[mine],
            actions[mine],
            regularizer="vicreg",
            weight=1.0,
            generator=generator,
        )
        optimizer.zero_grad(set_to_none=False)
        torch.autograd.backward(terms.total)
        optimizer.step()
        dist.barrier()
        if step > 0:  # the first step allocates the optimizer state
            times.append(time.perf_counter() - start)
    held = {
        "params": sum(_tensor_bytes(p) for p in model.parameters()),
        "grads": sum(_tensor_bytes(p.grad) for p in model.parameters() if p.grad is not None),
        "optimizer": sum(
            _tensor_bytes(v)
            for state in optimizer.state.values()
            for v in state.values()
            if isinstance(v, torch.Tensor) and v.dim() > 0
        ),
    }
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    row = torch.tensor(
        [held["params"], held["grads"], held["optimizer"], peak_rss, sum(times)],
        dtype=torch.float64,
    )
    table = [torch.zeros_like(row) for _ in range(world)]
    dist.all_gather(table, row)
    if rank == 0:
        out = {
            "world": world,
            "parameters": params,
            "ranks": [
                dict(
                    zip(
                        ("params", "grads", "optimizer", "peak_rss", "seconds"),
                        r.tolist(),
                        strict=True,
                    )
                )
                for r in table
            ],
            "windows_per_s": batch * spec["steps"] / max(float(r[4]) for r in table),
        }
        Path(spec["out"]).write_text(json.dumps(out), encoding="utf-8")
    dist.destroy_process_group()


def run(world: int, args: argparse.Namespace, folder: Path) -> dict[str, object]:
    """Launch ``world`` ranks with torch's elastic launcher and return rank 0's report."""
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from lensemble.network.launch.launcher import free_port

    out = folder / f"r{world}.json"
    spec = {
        "latent": args.latent,
        "hidden": args.hidden,
        "depth": args.depth,
        "batch": args.batch,
        "window": args.window,
        "steps": args.steps,
        "out": str(out),
    }
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=world,
        run_id=f"bench-{world}",
        rdzv_backend="c10d",
        rdzv_endpoint=f"127.0.0.1:{free_port()}",
        rdzv_configs={"is_host": True},
        max_restarts=0,
        start_method="spawn",
    )
    elastic_launch(config, bench_rank)(json.dumps(spec))
    result: dict[str, object] = json.loads(out.read_text(encoding="utf-8"))
    return result


def launch_overhead(folder: Path, rounds: int = 2) -> list[float]:
    """Seconds per round a 2-rank participant spends outside its inner steps (start-up).

    A small world model and one inner step, so the round is almost all start-up: spawning the
    ranks, importing torch, rendezvous, ``init_process_group``, state broadcast and gather.
    """
    from lensemble.config import load_config
    from lensemble.data.trajectories import load_or_collect
    from lensemble.model.inner_loop import initial_global_parameters
    from lensemble.network.launch.launcher import free_port
    from lensemble.ranks.learner import RankGroupLearner

    config = load_config(
        REPO / "config" / "local.yaml",
        [
            "federation.participants[0].ranks.processes_per_node=2",
            f"federation.ranks.rendezvous_port={free_port()}",
            f"run.output_dir={folder / 'run'}",
        ],
    )
    pid = config.participant_ids[0]
    learner = RankGroupLearner(config, pid, load_or_collect(config, pid))
    theta = initial_global_parameters(config)
    out = []
    try:
        for round_index in range(rounds):
            local = learner.train_round(theta, round_index, 1)
            out.append(learner.launch_seconds - local.compute_seconds)
    finally:
        learner.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=4, help="timed inner steps (after 1 warm-up)")
    parser.add_argument("--batch", type=int, default=32, help="global batch (windows)")
    parser.add_argument("--window", type=int, default=4, help="steps per window")
    parser.add_argument("--hidden", type=int, default=2048, help="hidden width")
    parser.add_argument("--depth", type=int, default=4, help="hidden layers per MLP")
    parser.add_argument("--latent", type=int, default=256, help="latent size")
    args = parser.parse_args()
    mib = 1024 * 1024
    with tempfile.TemporaryDirectory() as tmp:
        reports = [run(world, args, Path(tmp)) for world in (1, 2)]
        overhead = launch_overhead(Path(tmp))
    print(
        f"world model: {reports[0]['parameters'] / 1e6:.1f} M parameters (float32), "
        f"global batch {args.batch} windows of {args.window} steps, {args.steps} timed steps; "
        f"{os.cpu_count()} CPU cores, load average {os.getloadavg()[0]:.1f}"
    )
    print("| R | rank | params MiB | grads MiB | AdamW MiB | held MiB | peak RSS MiB | windows/s |")
    print("|---|---|---|---|---|---|---|---|")
    for report in reports:
        ranks = report["ranks"]
        assert isinstance(ranks, list)
        for i, r in enumerate(ranks):
            held = r["params"] + r["grads"] + r["optimizer"]
            rate = f"{report['windows_per_s']:.1f}" if i == 0 else ""
            print(
                f"| {report['world']} | {i} | {r['params'] / mib:.1f} | {r['grads'] / mib:.1f} | "
                f"{r['optimizer'] / mib:.1f} | {held / mib:.1f} | {r['peak_rss'] / mib:.0f} | "
                f"{rate} |"
            )
    print(
        "start-up of a 2-rank group per round (launch minus inner steps, default model): "
        + ", ".join(f"{v:.1f} s" for v in overhead)
    )


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main()
