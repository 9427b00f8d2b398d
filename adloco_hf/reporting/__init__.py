"""What a run leaves behind: the run log, its summary and plot, model cards and Hub uploads."""
