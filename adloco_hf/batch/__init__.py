"""The batch of an instance: gradient-noise statistics, the size tests, the controller, switch mode, max batch, lr."""
