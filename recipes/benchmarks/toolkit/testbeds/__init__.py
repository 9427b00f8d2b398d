"""The testbeds the benchmarks run workers on (root): `testbed`, one network namespace per worker with links
rate-limited by `tc tbf`; `machines`, a run's machines on it; `link_faults`, a link cut, stalled or slowed while a run
trains; `cgroups`, a slow worker in a cgroup with a CPU quota."""
