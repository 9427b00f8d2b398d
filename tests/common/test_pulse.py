"""`Pulse` on a real TCPStore: a beating worker is not silent, a stopped or never-started one is.

`silent` compares every counter before and after a wait of a few periods. Here the wait lasts until the beating
worker has beaten once, however long the machine takes to run its thread: nothing depends on the machine's speed,
and the stopped and absent workers cannot beat in any wait, long or short.
"""

import datetime
import threading
import types

import torch.distributed as dist
from helpers import free_port

from adloco_hf.common import pulse as pulse_module
from adloco_hf.common.pulse import Pulse


def test_a_stopped_or_absent_pulse_is_silent_and_a_beating_one_is_not(monkeypatch):
    store = dist.TCPStore("127.0.0.1", free_port(), 1, is_master=True, timeout=datetime.timedelta(seconds=10))
    beating, stopped = Pulse(store, 1, period=0.01).start(), Pulse(store, 2, period=0.01).start()
    stopped.stop()  # it beat once when it started, and never again

    def until_rank_1_beats(seconds):  # or a minute: a pulse that never beats then fails the assertion below
        before, waited = store.add("adloco/pulse/1", 0), 0
        while store.add("adloco/pulse/1", 0) == before and waited < 6000:
            threading.Event().wait(0.01)
            waited += 1

    monkeypatch.setattr(pulse_module, "time", types.SimpleNamespace(sleep=until_rank_1_beats))
    watcher = Pulse(store, 0)  # rank 0 looks; rank 3 never beat
    assert watcher.silent([0, 1, 2, 3]) == [2, 3]
    assert watcher.silent([]) == [] and watcher.silent([0]) == []  # nothing to wait for, itself excluded
    beating.stop()
    monkeypatch.setattr(pulse_module, "time", types.SimpleNamespace(sleep=lambda seconds: None))
    assert watcher.silent([1]) == [1]  # no beat after stop() returns
