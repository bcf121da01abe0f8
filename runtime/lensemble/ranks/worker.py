"""One rank of a participant's group: FSDP2-sharded inner steps on its rows of each batch.

:func:`rank_main` is the entry point torch's elastic agent starts on every rank (see
:mod:`lensemble.ranks.launch`). Per round:

1. rank 0 reads the global model (and the inner optimizer state) from the round folder; both
   reach every rank through ``set_model_state_dict`` / ``set_optimizer_state_dict`` with
   ``broadcast_from_rank0``, which shard them as they arrive;
2. the model is wrapped by ``fully_shard`` (``MixedPrecisionPolicy`` with bf16 compute and
   fp32 reduction for ``mixed_precision: bf16`` on nccl);
3. every rank draws the same global batch from the participant's batch seed and trains on its
   own ``B / R`` rows (:mod:`lensemble.ranks.sharded_loss`);
4. the full state dict and optimizer state are gathered to rank 0 with
   ``get_model_state_dict`` / ``get_optimizer_state_dict`` (``full_state_dict``,
   ``cpu_offload``), which writes them back into the round folder.

Ranks are numbered by node rank: rank ``node_rank x processes_per_node + LOCAL_RANK``, so rank 0
is always local rank 0 of node 0, the node that holds the round folder's inputs and talks to the
coordinator. The ``RANK`` the elastic agent hands out is not used: torch's c10d rendezvous numbers
the nodes in the sorted order of their (host name, process id), so which node's ranks come first
depends on host names, and on one host on the process ids (after a pid wrap the follower comes
first, and its rank 0 had no global model to read).

A group restarted by the elastic agent (``TORCHELASTIC_RESTART_COUNT > 0``) only reports the
round as failed: a rank died, so the round's update is given up, never half-trained. It does so
without ``init_process_group`` or any other use of the store: torch's agent hands a restarted
group the same shared TCPStore as the group that died (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE``
unset, pytorch/pytorch#135712), whose keys still hold the dead ranks' gloo addresses, so a
restarted rank that reads them first connects to a process that is gone, or to whatever listens
on its port now and never answers, and waits out the process group's timeout.
"""

from __future__ import annotations

import os
import signal
import time
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file

from lensemble.ranks.exchange import (
    FAILED,
    GLOBAL,
    INNER,
    INNER_OUT,
    LOCAL,
    STOPPED,
    RoundJob,
    RoundResult,
)
from lensemble.ranks.placement import group_rank, node_rank

_MOMENTS = ("exp_avg", "exp_avg_sq", "step")

#: How long a rank whose collective failed waits for the elastic agent to end the group before
#: it raises (seconds). A collective fails because another rank died; when that rank is on this
#: node, the agent (polling every ``monitor_interval``, 0.1 s) sees it and ends the group, and
#: reports the rank that died rather than this one's traceback of the consequence. A rank forked
#: from the fork server (``ranks.launch.START_METHOD``) exits without an interpreter shutdown,
#: so without the wait it could be gone within one poll and be reported first. A rank of another
#: node is not this agent's to see: after the wait the error is raised as it was.
PEER_DEATH_GRACE_S = 5.0


def rank_main(folder_text: str) -> None:
    """Run this rank's part of one round described by ``<folder_text>/job.json``.

    Args:
        folder_text: The round folder (see :mod:`lensemble.ranks.exchange`).

    Raises:
        RuntimeError: A collective failed (another rank died); the elastic agent restarts the
            group, which then reports the round as failed.
    """
    from lensemble.config import LensembleConfig

    folder = Path(folder_text)
    job = RoundJob.read(folder)
    config = LensembleConfig.model_validate_json(job.config_json)
    layout = config.rank_layout(job.participant_id)
    rank = group_rank(node_rank(layout), int(os.environ.get("LOCAL_RANK", "0")), layout)
    if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0:
        # A rank died this round: say so and stop, touching neither the store nor the peers
        # (the shared store still holds the dead group's addresses; see the module notes).
        if rank == 0:
            (folder / FAILED).write_text("a rank died during this round\n", encoding="utf-8")
        return
    torch.set_num_threads(1)  # bit-identical reductions (lensemble.machinery.determinism)
    # A collective that waits on a rank that is gone fails within a round's time instead of
    # gloo's 30 minutes (the agent usually ends the group at once, when the dead rank exits).
    timeout = timedelta(seconds=config.federation.round_timeout_s)
    dist.init_process_group(
        layout.backend, rank=rank, world_size=layout.world_size, timeout=timeout
    )
    try:
        job = _agree(folder, job)
        if job.stop:
            if int(os.environ.get("LOCAL_RANK", "0")) == 0 and dist.get_rank() != 0:
                (folder / STOPPED).write_text("node 0 ended the group\n", encoding="utf-8")
            return
        _train(folder, job, config)
    except RuntimeError:  # what gloo and nccl raise when a peer is gone
        time.sleep(PEER_DEATH_GRACE_S)  # the agent's SIGTERM ends this rank first, if it comes
        raise
    finally:
        dist.destroy_process_group()


def _agree(folder: Path, job: RoundJob) -> RoundJob:
    """Rank 0's round, steps, fault and stop flag, for every rank (other nodes know none)."""
    device = torch.device("cpu")
    if dist.get_backend() == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    mine = [job.round_index, job.steps, job.kill_rank, int(job.stop)]
    header = torch.tensor(mine if dist.get_rank() == 0 else [0, 0, 0, 0], device=device)
    dist.broadcast(header, src=0)
    round_index, steps, kill, stop = (int(v) for v in header.tolist())
    return RoundJob(job.config_json, job.participant_id, round_index, steps, kill, bool(stop))


def _device(backend: str) -> torch.device:
    """The device this rank computes on: its local GPU under nccl, else the CPU."""
    if backend != "nccl":
        return torch.device("cpu")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(device)
    return device


def _sharded_model(config: Any, spec: Any, mixed_precision: str, device: torch.device) -> Any:
    """The world model on ``device``, wrapped by FSDP2's ``fully_shard``."""
    from torch.distributed.fsdp import (
        MixedPrecisionPolicy,
        fully_shard,
        register_fsdp_forward_method,
    )

    from lensemble.model.worldmodel import build_model

    model = build_model(config, spec).to(device)
    policy = MixedPrecisionPolicy()
    if mixed_precision == "bf16":
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    fully_shard(model, mp_policy=policy)
    # encode's output is a view; nothing here changes it in place, which is what FSDP2 warns of.
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    # jepa_loss calls encode and rollout, never forward: let FSDP2 gather around them.
    register_fsdp_forward_method(model, "encode")
    register_fsdp_forward_method(model, "rollout")
    return model


def _load_round_inputs(
    folder: Path, model: Any, optimizer: Any, *, names: list[str], opt: Any, device: torch.device
) -> None:
    """Load rank 0's global model, and inner optimizer state when the folder has one.

    Both reach every rank sharded, as they arrive.
    """
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    rank = dist.get_rank()
    full = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    # Collectives run on the backend's device (nccl reduces CUDA tensors only).
    has_inner = torch.tensor([int(rank == 0 and (folder / INNER).exists())], device=device)
    dist.broadcast(has_inner, src=0)
    global_params: dict[str, Any] = dict(load_file(folder / GLOBAL)) if rank == 0 else {}
    set_model_state_dict(model, global_params, options=full)
    if int(has_inner):
        state = _optimizer_state(load_file(folder / INNER), names, opt) if rank == 0 else {}
        set_optimizer_state_dict(model, optimizer, state, options=full)


def _inner_steps(
    model: Any, optimizer: Any, *, data: Any, config: Any, job: RoundJob, device: torch.device
) -> tuple[torch.Tensor, float]:
    """The round's inner steps on this rank's rows of each global batch.

    Returns:
        This rank's summed loss (float64, CPU) and the steps' wall seconds.
    """
    from lensemble.model.inner_loop import sample_windows
    from lensemble.ranks.sharded_loss import sharded_jepa_loss
    from lensemble.seeds import derive

    rank, world = dist.get_rank(), dist.get_world_size()
    batch = config.federation.inner_optimizer.batch_size
    rows = batch // world
    seed = derive(config.run.root_seed, f"batches:{job.participant_id}:round:{job.round_index}")
    generator = torch.Generator().manual_seed(seed)
    obs_all, actions_all = data.train.obs, data.train.actions
    total = torch.zeros((), dtype=torch.float64)
    m = config.model
    start = time.perf_counter()
    for step in range(job.steps):
        obs, actions = sample_windows(obs_all, actions_all, config.data.window, generator, batch)
        mine = slice(rank * rows, (rank + 1) * rows)
        terms = sharded_jepa_loss(
            model,
            obs[mine].to(device),
            actions[mine].to(device),
            regularizer=m.regularizer,
            weight=m.regularizer_weight,
            generator=generator,
        )
        optimizer.zero_grad(set_to_none=True)
        torch.autograd.backward(terms.total)
        optimizer.step()
        total += terms.total.detach().double().cpu()
        if step == 0 and rank == job.kill_rank:
            os.kill(os.getpid(), signal.SIGKILL)  # the rank_kill fault: die mid-round
    return total, time.perf_counter() - start


def _write_round_outputs(
    folder: Path, model: Any, optimizer: Any, *, names: list[str], mean_loss: float, seconds: float
) -> None:
    """Gather the full model and optimizer state to rank 0, which writes them and the result."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    gathered = StateDictOptions(full_state_dict=True, cpu_offload=True)
    params: dict[str, Any] = dict(get_model_state_dict(model, options=gathered))
    optim: dict[str, Any] = dict(get_optimizer_state_dict(model, optimizer, options=gathered))
    if dist.get_rank() == 0:
        save_file({n: params[n].detach().contiguous() for n in names}, folder / LOCAL)
        inner: dict[str, torch.Tensor] = {}
        for n in names:
            for key in _MOMENTS:
                value = optim["state"][n][key]
                inner[f"optimizer.{key}.{n}"] = torch.as_tensor(value, dtype=torch.float32)
        save_file({k: v.contiguous() for k, v in inner.items()}, folder / INNER_OUT)
        RoundResult(mean_loss, seconds).write(folder)


def _train(folder: Path, job: RoundJob, config: Any) -> None:
    from lensemble.data.trajectories import load_or_collect

    layout = config.rank_layout(job.participant_id)
    data = load_or_collect(config, job.participant_id)
    device = _device(layout.backend)
    model = _sharded_model(config, data.spec, layout.mixed_precision, device)
    names = [name for name, _ in model.named_parameters()]
    opt = config.federation.inner_optimizer
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=opt.lr,
        betas=opt.betas,
        eps=opt.eps,
        weight_decay=opt.weight_decay,
        foreach=True,
    )
    _load_round_inputs(folder, model, optimizer, names=names, opt=opt, device=device)
    total, seconds = _inner_steps(
        model, optimizer, data=data, config=config, job=job, device=device
    )
    summed = total.to(device)
    dist.all_reduce(summed)
    mean = float(summed.cpu()) / dist.get_world_size() / max(job.steps, 1)
    _write_round_outputs(folder, model, optimizer, names=names, mean_loss=mean, seconds=seconds)
    dist.barrier()


def _optimizer_state(flat: dict[str, torch.Tensor], names: list[str], opt: Any) -> dict[str, Any]:
    """The full optimizer state dict (by parameter name) of the learner's inner-state tensors."""
    state = {n: {key: flat[f"optimizer.{key}.{n}"] for key in _MOMENTS} for n in names}
    group = {
        "lr": opt.lr,
        "betas": tuple(opt.betas),
        "eps": opt.eps,
        "weight_decay": opt.weight_decay,
        "params": list(names),
    }
    return {"state": state, "param_groups": [group]}
