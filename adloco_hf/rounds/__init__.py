"""A round: the pure decision taken at its end, and the running tally a worker keeps during it."""
