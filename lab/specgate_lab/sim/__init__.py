"""Socket-free discrete-event simulation of the routing core against the engine model.

The same decision core the gateway runs (:mod:`gateway.routing`) drives the emulator's
pure engine model and shared device timeline (:mod:`specgate_lab.emulator.engine`,
:mod:`specgate_lab.emulator.device`) in virtual time, with a scraper-like view of each
engine refreshed every simulated second. ``specgate simulate`` sweeps QPS × policies.
"""

from specgate_lab.sim.records import SimConfig, SimResult
from specgate_lab.sim.run import simulate

__all__ = ["SimConfig", "SimResult", "simulate"]
