"""Encoders, action heads and the actor-critic."""

from msf.model.actor_critic import ActorCritic, PolicyOutput
from msf.model.encoders import register_encoder

__all__ = ["ActorCritic", "PolicyOutput", "register_encoder"]
