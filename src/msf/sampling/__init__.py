"""Rollout workers, inference workers, the shared-memory trajectory buffer and the published weights."""
