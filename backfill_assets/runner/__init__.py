"""What ``run``, ``launch``, ``verify``, the deadline plan and the canary do."""
