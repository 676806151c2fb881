"""The names a model's ``routing.policy`` may take (:data:`POLICY_NAMES`), and the config
field type that accepts them (:data:`PolicyName`). What builds each policy is
:mod:`gateway.routing.factory`, which checks that it builds exactly these."""

from __future__ import annotations

from typing import Annotated, Final, TypeAlias

from pydantic import BeforeValidator, WithJsonSchema
from pydantic_core import PydanticCustomError

ADAPTIVE: Final = "adaptive"
ALWAYS_SPEC: Final = "always-spec"
ALWAYS_BASE: Final = "always-base"
TEMPERATURE: Final = "temperature"
# The two static baselines the adaptive policy is measured against.
STATIC_BASELINES: Final = (ALWAYS_SPEC, ALWAYS_BASE)
# every policy name, in the order they are listed to users
POLICY_NAMES: Final[tuple[str, ...]] = (ADAPTIVE, ALWAYS_SPEC, ALWAYS_BASE, TEMPERATURE)


def _registered(name: object) -> object:
    if not isinstance(name, str) or name not in POLICY_NAMES:
        quoted = [repr(n) for n in POLICY_NAMES]
        raise PydanticCustomError(
            "literal_error",
            "Input should be {expected}",
            {"expected": f"{', '.join(quoted[:-1])} or {quoted[-1]}"},
        )
    return name


# The config's policy field: a registered name (validated, and listed in the JSON schema).
PolicyName: TypeAlias = Annotated[
    str,
    BeforeValidator(_registered),
    WithJsonSchema({"enum": list(POLICY_NAMES), "type": "string"}),
]
