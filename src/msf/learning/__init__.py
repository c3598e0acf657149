"""The learner: losses, advantage estimators, learning-rate schedules, PBT's decisions."""
