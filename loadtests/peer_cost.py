"""CPU a gateway replica spends on the peer channel per request of another replica:
applying its witness (the request priced into this replica's mix and mode), its outcome
(learned from) and its in-flight counts, on the in-memory bus (no sockets).

    python loadtests/peer_cost.py [--n 5000]
"""

from __future__ import annotations

import argparse
import asyncio
import time

from gateway.config import load_config
from gateway.config.models import PeersConfig
from gateway.engines.runtime import ModelRuntime
from gateway.peers.bus import MemoryHub
from gateway.peers.messages import Counts, encode, learned_of, witness_of
from gateway.peers.service import PeerService
from gateway.routing.factory import build_policy
from gateway.routing.types import Outcome, RequestFeatures, Route


async def measure(n: int) -> tuple[dict[str, float], int]:
    """µs per message of each kind, and how many messages the service took (none refused)."""
    cfg = load_config(None, env={})
    m = cfg.models[0]
    model = ModelRuntime.from_config(m, build_policy(m.routing))
    svc = PeerService(PeersConfig(replica_id="b"), MemoryHub().bus(), {m.name: model})
    f = RequestFeatures(m.name, temperature=0.5, max_tokens=200, prompt_tokens=400, overlap=0.6, kind="edit")
    spec = model.pairs[0].spec.name
    o = Outcome(m.name, Route.SPEC, spec, "edit", 0.5, True, 400, 200, 0.02, 0.005, 0.6)
    learned = learned_of("a", m.name, o)
    assert learned is not None
    messages = {
        "witness": encode(witness_of("a", m.name, f, Route.SPEC, (3.0, 0.0))),
        "outcome": encode(learned),
        "counts": encode(Counts(r="a", engines={spec: 3})),
    }
    out = {}
    for name, data in messages.items():
        t0 = time.perf_counter()
        for _ in range(n):
            svc.apply(data)
        out[name] = (time.perf_counter() - t0) / n * 1e6
    return out, svc.stats["received"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=5000, help="messages applied per kind")
    us, _ = asyncio.run(measure(p.parse_args().n))
    for name, v in us.items():
        print(f"{name:>8}: {v:6.1f} µs per message")
    per_request = us["witness"] + us["outcome"] + 2 * us["counts"]
    print(f"per peer request (witness + outcome + 2 counts): {per_request:.0f} µs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
