"""Topology, process-group set-up, DDP wrapping and cross-rank agreement."""
