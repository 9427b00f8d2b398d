"""Instances (AdLoCo §4.1): the table of instances and their workers, merges, and their health."""
