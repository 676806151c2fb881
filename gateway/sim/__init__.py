"""Socket-free discrete-event simulation of the routing core against the engine model.

The same decision core the gateway runs (:mod:`gateway.routing`) drives the emulator's
pure engine model and shared device timeline (:mod:`gateway.emulator.engine`,
:mod:`gateway.emulator.device`) in virtual time, with a scraper-like view of each
engine refreshed every simulated second. ``specgate simulate`` sweeps QPS × policies.
"""

from gateway.sim.records import SimConfig, SimResult
from gateway.sim.run import simulate

__all__ = ["SimConfig", "SimResult", "simulate"]
