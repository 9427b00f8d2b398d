"""The outer step: pseudo-gradients averaged over an instance (compressed or not, overlapped or not), outer SGD."""
