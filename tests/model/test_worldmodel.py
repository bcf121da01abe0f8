"""The world model's parameters and the JEPA objective's anti-collapse terms."""

from __future__ import annotations

import torch

from lensemble.data.envs import env_spec
from lensemble.model.objective import jepa_loss, sigreg_regularizer, vicreg_regularizer
from lensemble.model.worldmodel import build_model, initial_parameters
from tests.model.conftest import MakeConfig


def test_initial_parameters_names_shapes_and_dtype(make_config: MakeConfig) -> None:
    config = make_config()  # obs 3, action 1, hidden 32, latent 8, depth 2
    params = initial_parameters(config, env_spec("Pendulum-v1"))
    assert {k: tuple(v.shape) for k, v in params.items()} == {
        "encoder.layers.0.weight": (32, 3),
        "encoder.layers.0.bias": (32,),
        "encoder.layers.1.weight": (32, 32),
        "encoder.layers.1.bias": (32,),
        "encoder.layers.2.weight": (8, 32),
        "encoder.layers.2.bias": (8,),
        "predictor.layers.0.weight": (32, 9),
        "predictor.layers.0.bias": (32,),
        "predictor.layers.1.weight": (32, 32),
        "predictor.layers.1.bias": (32,),
        "predictor.layers.2.weight": (8, 32),
        "predictor.layers.2.bias": (8,),
    }
    assert all(v.dtype == torch.float32 for v in params.values())
    # Every parameter is federated: the state_dict holds exactly these names, no buffers.
    assert set(build_model(config, env_spec("Pendulum-v1")).state_dict()) == set(params)


def test_initial_parameters_are_deterministic_per_root_seed(make_config: MakeConfig) -> None:
    spec = env_spec("Pendulum-v1")
    a = initial_parameters(make_config(), spec)
    b = initial_parameters(make_config(), spec)
    c = initial_parameters(make_config("run.root_seed=8"), spec)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not any(torch.equal(a[k], c[k]) for k in a)


def test_bfloat16_model_dtype(make_config: MakeConfig) -> None:
    params = initial_parameters(make_config("model.dtype=bfloat16"), env_spec("Pendulum-v1"))
    assert all(v.dtype == torch.bfloat16 for v in params.values())


def test_vicreg_penalises_collapsed_latents() -> None:
    spread = torch.randn(512, 8, generator=torch.Generator().manual_seed(0))
    collapsed = torch.ones(512, 8) + 1e-3 * spread
    correlated = spread[:, :1].repeat(1, 8)
    assert vicreg_regularizer(spread) < 0.1
    assert vicreg_regularizer(collapsed) > 0.9  # the variance hinge is fully active
    assert vicreg_regularizer(correlated) > vicreg_regularizer(spread) + 0.1  # covariance term


def test_sigreg_is_deterministic_and_penalises_non_gaussian_latents() -> None:
    gaussian = torch.randn(1024, 8, generator=torch.Generator().manual_seed(0))

    def sigreg(z: torch.Tensor) -> torch.Tensor:
        return sigreg_regularizer(z, torch.Generator().manual_seed(5))

    assert torch.equal(sigreg(gaussian), sigreg(gaussian))
    assert sigreg(gaussian) < 0.01
    assert sigreg(torch.zeros(1024, 8)) > 10 * sigreg(gaussian)
    assert sigreg(3.0 * gaussian) > 10 * sigreg(gaussian)


def test_jepa_loss_trains_encoder_and_predictor(make_config: MakeConfig) -> None:
    config = make_config()
    spec = env_spec("Pendulum-v1")
    model = build_model(config, spec)
    model.load_state_dict(initial_parameters(config, spec))
    obs = torch.randn(16, 5, 3)
    actions = torch.rand(16, 4, 1) * 4 - 2
    terms = jepa_loss(
        model, obs, actions, regularizer="vicreg", weight=1.0, generator=torch.Generator()
    )
    assert terms.total.shape == () and torch.isfinite(terms.total)
    assert torch.allclose(terms.total.detach(), terms.prediction + terms.regularizer)
    terms.total.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
