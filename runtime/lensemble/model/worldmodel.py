"""The federated world model: a small action-conditioned latent dynamics model in torch.

An encoder MLP maps an observation to a latent state; a predictor MLP maps a latent state and an
action to the next latent state as a residual update, ``z' = z + f(z, a)``. Both have
``model.depth`` hidden layers of ``model.hidden_dim`` units. Observations and continuous actions
are first scaled by fixed, per-environment constants (:class:`~lensemble.data.envs.EnvSpec`), so
every participant feeds the shared model identically scaled inputs.

Every parameter is federated: the model has no buffers in its ``state_dict``. Parameter names
look like ``encoder.layers.0.weight`` and ``predictor.layers.2.bias``.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch
from torch import nn

from lensemble.errors import ArchitectureMismatch
from lensemble.seeds import derive

if TYPE_CHECKING:
    from lensemble.config.schema import LensembleConfig
    from lensemble.data.envs import EnvSpec

Params = dict[str, torch.Tensor]

# The predictor's last layer starts this much smaller than a default layer, so that a fresh
# model predicts "the latent state barely changes" (a residual near identity) instead of noise.
_PREDICTOR_OUTPUT_GAIN = 0.1


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of ``model.dtype`` (``float32`` or ``bfloat16``)."""
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


class MLP(nn.Module):
    """Linear layers with SiLU between them.

    Args:
        in_dim: Input features (count).
        hidden_dim: Width of each hidden layer (count).
        depth: Hidden layers (count); the MLP has ``depth + 1`` linear layers.
        out_dim: Output features (count).
    """

    def __init__(self, in_dim: int, hidden_dim: int, depth: int, out_dim: int) -> None:
        super().__init__()
        widths = [in_dim] + [hidden_dim] * depth + [out_dim]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in itertools.pairwise(widths))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map ``[..., in_dim]`` to ``[..., out_dim]``."""
        for layer in self.layers[:-1]:
            x = nn.functional.silu(layer(x))
        out: torch.Tensor = self.layers[-1](x)
        return out


class WorldModel(nn.Module):
    """Encoder (observation -> latent) and residual predictor ((latent, action) -> latent).

    Args:
        spec: The environment's shapes and input scales.
        latent_dim: Latent size ``D`` (count).
        hidden_dim: Hidden width (count).
        depth: Hidden layers in the encoder and in the predictor (count).
    """

    obs_center: torch.Tensor
    obs_scale: torch.Tensor
    action_center: torch.Tensor
    action_scale: torch.Tensor

    def __init__(self, spec: EnvSpec, latent_dim: int, hidden_dim: int, depth: int) -> None:
        super().__init__()
        self.encoder = MLP(spec.obs_dim, hidden_dim, depth, latent_dim)
        self.predictor = MLP(latent_dim + spec.action_dim, hidden_dim, depth, latent_dim)
        center = spec.obs_center or (0.0,) * spec.obs_dim
        scale = spec.obs_scale or (1.0,) * spec.obs_dim
        # Fixed input scaling: not parameters, not in the state_dict, never federated.
        self.register_buffer("obs_center", torch.tensor(center), persistent=False)
        self.register_buffer("obs_scale", torch.tensor(scale), persistent=False)
        if spec.discrete:
            a_center, a_scale = [0.0] * spec.action_dim, [1.0] * spec.action_dim
        else:
            a_center = [
                (lo + hi) / 2 for lo, hi in zip(spec.action_low, spec.action_high, strict=True)
            ]
            a_scale = [
                (hi - lo) / 2 for lo, hi in zip(spec.action_low, spec.action_high, strict=True)
            ]
        self.register_buffer("action_center", torch.tensor(a_center), persistent=False)
        self.register_buffer("action_scale", torch.tensor(a_scale), persistent=False)

    def encode(self, obs: torch.Tensor) -> torch.Tensor:
        """Latent states of observations: ``[..., obs_dim]`` float -> ``[..., D]``."""
        x = (obs - self.obs_center) / self.obs_scale
        out: torch.Tensor = self.encoder(x.to(self.obs_center.dtype))
        return out

    def predict(self, latent: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """Next latent state: ``[..., D]`` and ``[..., action_dim]`` -> ``[..., D]``."""
        a = ((action - self.action_center) / self.action_scale).to(latent.dtype)
        step: torch.Tensor = self.predictor(torch.cat([latent, a], dim=-1))
        return latent + step

    def rollout(self, latent: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """Unroll the predictor over a sequence of actions.

        Args:
            latent: ``[B, D]`` start latents.
            actions: ``[B, K, action_dim]`` actions.

        Returns:
            ``[B, K, D]``: the predicted latent after each action.
        """
        out = []
        for t in range(actions.shape[1]):
            latent = self.predict(latent, actions[:, t])
            out.append(latent)
        return torch.stack(out, dim=1)


def build_model(config: LensembleConfig, spec: EnvSpec) -> WorldModel:
    """An uninitialised :class:`WorldModel` shaped by ``config.model`` and ``spec``, in dtype."""
    m = config.model
    model = WorldModel(spec, m.latent_dim, m.hidden_dim, m.depth)
    return model.to(torch_dtype(m.dtype))


def initial_parameters(config: LensembleConfig, spec: EnvSpec) -> Params:
    """The deterministic initial parameters of the global model.

    Every tensor is drawn uniformly, in parameter order, from one generator seeded by
    ``derive(root_seed, "model-init")``: weights from ``+-sqrt(3 / fan_in)`` (LeCun: unit
    variance in, unit variance out, so a fresh encoder is a generic nonlinear map rather than
    the almost linear one PyTorch's smaller default gives), biases from ``+-1/sqrt(fan_in)``,
    and the predictor's output layer from a tenth of PyTorch's default range, so a fresh
    predictor is close to the identity.

    Args:
        config: The run's config (``run.root_seed`` and ``model``).
        spec: The environment's spec.

    Returns:
        Parameter name -> tensor in ``model.dtype`` (float32 by default), e.g.
        ``encoder.layers.0.weight`` of shape ``[hidden_dim, obs_dim]``.
    """
    generator = torch.Generator().manual_seed(derive(config.run.root_seed, "model-init"))
    m = config.model
    model = WorldModel(spec, m.latent_dim, m.hidden_dim, m.depth)
    out: Params = {}
    last = f"predictor.layers.{m.depth}."
    with torch.no_grad():
        shapes = {name: p.shape for name, p in model.named_parameters()}
        for name, shape in shapes.items():
            fan_in = shapes[name.rsplit(".", 1)[0] + ".weight"][1]
            if name.startswith(last):
                bound = _PREDICTOR_OUTPUT_GAIN * fan_in**-0.5
            elif len(shape) == 2:
                bound = (3.0 / fan_in) ** 0.5  # LeCun: weight variance 1 / fan_in
            else:
                bound = fan_in**-0.5
            value = torch.rand(shape, generator=generator) * (2 * bound) - bound
            out[name] = value.to(torch_dtype(m.dtype))
    return out


def check_architecture(
    params: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor], what: str
) -> None:
    """Raise unless ``params`` has exactly the names and shapes of ``expected``.

    Raises:
        ArchitectureMismatch: A name is missing or extra, or a shape differs.
    """
    missing, extra = sorted(set(expected) - set(params)), sorted(set(params) - set(expected))
    if missing or extra:
        raise ArchitectureMismatch(
            f"{what} do not match the world model: missing {missing or 'none'}, unexpected "
            f"{extra or 'none'}.",
            remediation="Use the same model.* settings for every participant and the coordinator.",
        )
    for name, tensor in expected.items():
        if tuple(params[name].shape) != tuple(tensor.shape):
            raise ArchitectureMismatch(
                f"{what}: '{name}' has shape {tuple(params[name].shape)}, the world model "
                f"expects {tuple(tensor.shape)}.",
                remediation="Use the same model.* settings for every participant and the "
                "coordinator.",
            )
