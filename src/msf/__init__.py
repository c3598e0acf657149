"""multi-sample-factory: asynchronous PPO (APPO) with a data-parallel learner."""

__version__ = "0.1.0"
