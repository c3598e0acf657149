"""The learner: losses, advantage estimators, normalisers, learning-rate schedules."""
