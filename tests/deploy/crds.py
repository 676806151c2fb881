"""Schemas of the Prometheus Operator kinds kubernetes-validate does not know, by the
fields of monitoring.coreos.com/v1 this project uses, checked strictly."""

from __future__ import annotations

from typing import Any

_DURATION = {"type": "string", "pattern": "^(([0-9]+)(ms|s|m|h|d|w|y))+$"}
_STRINGS = {"type": "object", "additionalProperties": {"type": "string"}}
_NAME = {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"}

_RULE: dict[str, Any] = {
    "type": "object",
    "required": ["expr"],
    "additionalProperties": False,
    "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
    "properties": {
        "alert": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"},
        "record": {"type": "string"},
        "expr": {"anyOf": [{"type": "string", "minLength": 1}, {"type": "integer"}]},
        "for": _DURATION,
        "keep_firing_for": _DURATION,
        "labels": _STRINGS,
        "annotations": _STRINGS,
    },
}

PROMETHEUSRULE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PrometheusRule"},
        "metadata": {
            "type": "object",
            "required": ["name"],
            "additionalProperties": False,
            "properties": {
                "name": _NAME,
                "namespace": {"type": "string"},
                "labels": _STRINGS,
                "annotations": _STRINGS,
            },
        },
        "spec": {
            "type": "object",
            "required": ["groups"],
            "additionalProperties": False,
            "properties": {
                "groups": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["name", "rules"],
                        "additionalProperties": False,
                        "properties": {
                            "name": {"type": "string", "minLength": 1},
                            "interval": _DURATION,
                            "labels": _STRINGS,
                            "rules": {"type": "array", "minItems": 1, "items": _RULE},
                        },
                    },
                }
            },
        },
    },
}
