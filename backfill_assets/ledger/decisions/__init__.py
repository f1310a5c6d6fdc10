"""People in the loop: moderators' decisions, which outrank the model, and old classifiers'
results kept as baselines (issue 50)."""
