"""What every part uses: `torch.distributed` helpers, the console, random states, the worker layout, inputs."""
