"""The device-group runner, the training loop and the launching of a node's device groups (with restarts)."""
