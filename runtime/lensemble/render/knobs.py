"""The base of every chart knob model: camelCase keys, unknown keys refused."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class Knobs(BaseModel):
    """Chart values use camelCase keys (Helm convention) and reject unknown keys."""

    model_config = ConfigDict(
        extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True
    )
