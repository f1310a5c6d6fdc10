"""The Dagster definitions: one folder per asset group (labels, posts, reporting), their
partitions, resources, sensors and the sealing that keeps run config out."""
