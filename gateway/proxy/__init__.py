"""The upstream side of the gateway: pooled sessions, attempts with failover, SSE relay."""
