"""Flags, their validation and the saved experiment config."""

from msf.cfg.config import Config, Derived
from msf.cfg.validation import ConfigError, validate

__all__ = ["Config", "Derived", "ConfigError", "validate"]
