"""Engines behind the gateway: runtime state, metric scraping and health checks."""
