"""Checkpoints: folders written atomically, the manifest, the run settings, and elastic resume."""
