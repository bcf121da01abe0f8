"""Export ``LensembleConfig`` as a JSON Schema (draft 2020-12).

The committed copy is ``config/lensemble.schema.json``; a test fails when it drifts. The Helm
chart's ``values.schema.json`` embeds the same schema under ``config``.
"""

from __future__ import annotations

import json
from typing import Any

from lensemble.config.schema import LensembleConfig

DRAFT_2020_12 = "https://json-schema.org/draft/2020-12/schema"


def json_schema() -> dict[str, Any]:
    """The config's JSON Schema, with ``$schema`` naming draft 2020-12."""
    schema = LensembleConfig.model_json_schema(mode="validation")
    return {"$schema": DRAFT_2020_12, **schema}


def json_schema_text() -> str:
    """The schema as the exact text committed to ``config/lensemble.schema.json``."""
    return json.dumps(json_schema(), indent=2, sort_keys=False) + "\n"
