"""The virtual clock's parts: `link_model`, links, device profiles (step seconds by micro-batch size) and the time
of a ring all-reduce and of small control collectives; `virtual_clock`, the library's `Clock` priced by a device
profile and links (the worker's `--clock virtual`); `device_profiles`, the profiles kept under
`docs/results/device_profiles/`, read with their source."""
