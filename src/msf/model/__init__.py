"""Encoders, action heads and the actor-critic."""

from msf.model.actor_critic import ActorCritic, PolicyOutput

__all__ = ["ActorCritic", "PolicyOutput"]
