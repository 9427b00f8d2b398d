"""`Pulse` on a real TCPStore: a beating worker is not silent, a stopped or never-started one is."""

import datetime

import torch.distributed as dist
from helpers import free_port

from adloco_hf.common.pulse import Pulse


def test_a_stopped_or_absent_pulse_is_silent_and_a_beating_one_is_not():
    store = dist.TCPStore("127.0.0.1", free_port(), 1, is_master=True, timeout=datetime.timedelta(seconds=10))
    period = 0.05
    beating, stopped = Pulse(store, 1, period).start(), Pulse(store, 2, period).start()
    stopped.stop()
    watcher = Pulse(store, 0, period)  # rank 0 looks; rank 3 never beat
    assert watcher.silent([0, 1, 2, 3], periods=20) == [2, 3]  # a second: the beating thread gets the CPU
    assert watcher.silent([]) == [] and watcher.silent([0]) == []  # nothing to wait for, itself excluded
    beating.stop()
    assert watcher.silent([1], periods=4) == [1]
