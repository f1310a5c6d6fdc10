"""The Dagster side: assets, checks, the apply step, usage, sensors, resources, settings, planning
and launching.
"""
