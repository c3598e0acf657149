"""Rollout workers, inference workers and the shared-memory trajectory buffer."""
