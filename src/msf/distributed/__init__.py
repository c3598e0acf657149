"""Topology, node discovery, rendezvous and the collectives of a process group."""
