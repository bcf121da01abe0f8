"""Lensemble: federated world-model training across sovereign participants (DiLoCo).

Importing this package is cheap: it does not import torch, grpc or any substrate tooling.
The config schema lives in :mod:`lensemble.config`; the runtime in :mod:`lensemble.federation`.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
