"""The policy registry is the one list of names: config validation and the command lines follow it."""

from __future__ import annotations

import argparse

import pytest
from pydantic import ValidationError

from gateway.api import cli_serve
from gateway.routing.config import RoutingConfig
from gateway.routing.factory import POLICIES, POLICY_NAMES, STATIC_BASELINES, build_policy
from specgate_lab import demo as cli_demo
from specgate_lab.bench import cli_bench
from specgate_lab.sim import cli_simulate


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_every_registered_name_is_valid_config_and_builds_that_policy(name: str) -> None:
    policy = build_policy(RoutingConfig(policy=name))
    assert policy.name == name
    assert policy.snapshot()["policy"] == name


def test_an_unregistered_name_is_rejected_with_the_registered_ones() -> None:
    with pytest.raises(ValidationError) as exc:
        RoutingConfig(policy="magic")
    (err,) = exc.value.errors()
    assert err["loc"] == ("policy",)
    assert all(repr(n) in err["msg"] for n in POLICIES)
    assert RoutingConfig.model_json_schema()["properties"]["policy"]["enum"] == list(POLICY_NAMES)


def _choices(configure: object, flag: str) -> tuple[str, ...]:
    parser = argparse.ArgumentParser()
    configure(parser)  # type: ignore[operator]
    action = next(a for a in parser._actions if flag in a.option_strings)
    return tuple(action.choices or ())


def test_command_lines_offer_the_registered_names() -> None:
    assert _choices(cli_serve.configure, "--policy") == POLICY_NAMES
    assert _choices(cli_demo.configure, "--policy") == POLICY_NAMES
    assert cli_bench.POLICIES == POLICY_NAMES
    assert cli_simulate.POLICIES[: len(POLICY_NAMES)] == POLICY_NAMES
    assert set(STATIC_BASELINES) < set(POLICY_NAMES)
