"""Evaluation while several instances train: each instance's model on the whole eval set."""
