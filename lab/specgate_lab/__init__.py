"""The lab: the emulated engine pair and the gateway composed in one process.

``demo`` (``specgate demo``) puts the gateway in front of an emulated pair and shows where
sample requests go; ``promlab`` adds a real Prometheus scraping both, for the end-to-end
telemetry test and the dashboard renderer. The lab sits above :mod:`gateway.api`,
:mod:`specgate_lab.emulator` and :mod:`gateway.telemetry`: it imports them, they never import it.
"""
