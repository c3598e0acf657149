"""Device-group runner, process supervision and launching."""
