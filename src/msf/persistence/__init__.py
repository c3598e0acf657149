"""Checkpoints and summaries (TensorBoard, summary.json, the log file)."""
