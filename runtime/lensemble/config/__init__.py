"""The validated ``LensembleConfig`` and everything that reads, hashes and exports it."""

from lensemble.config.hashing import HASH_ALGORITHM, config_hash, differing_fields
from lensemble.config.load import default_config_path, dump_config, load_config
from lensemble.config.schema import LensembleConfig, ParticipantSpec
from lensemble.config.schema_export import json_schema

__all__ = [
    "HASH_ALGORITHM",
    "LensembleConfig",
    "ParticipantSpec",
    "config_hash",
    "default_config_path",
    "differing_fields",
    "dump_config",
    "json_schema",
    "load_config",
]
