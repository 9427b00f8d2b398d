"""The timeout hierarchy (`adloco_hf/config/timeouts.py`): `worker_timeout` <= `ddp_timeout`, refused otherwise
before any data is built, the message naming both fields and the fix."""

import pytest

from adloco_hf import AdLoCoConfig


def make(tmp_path, **kwargs):
    base = dict(output_dir=str(tmp_path), max_steps=40, inner_steps=10, save_steps=20, use_cpu=True, report_to=[])
    return AdLoCoConfig(**{**base, **kwargs})


def test_worker_timeout_above_ddp_timeout_is_refused_naming_both_and_the_fix(tmp_path):
    with pytest.raises(ValueError) as raised:
        make(tmp_path, worker_timeout=120, ddp_timeout=60)
    message = str(raised.value)
    assert "worker_timeout=120 is above ddp_timeout=60" in message, message
    assert "Set ddp_timeout >= worker_timeout (e.g. ddp_timeout=120)" in message, message


@pytest.mark.parametrize(("worker_timeout", "ddp_timeout"), [(30, 60), (60, 60), (1800, 1800)])
def test_a_consistent_hierarchy_is_accepted(tmp_path, worker_timeout, ddp_timeout):
    config = make(tmp_path, worker_timeout=worker_timeout, ddp_timeout=ddp_timeout)
    assert (config.worker_timeout, config.ddp_timeout) == (worker_timeout, ddp_timeout)


def test_the_defaults_are_consistent(tmp_path):
    config = make(tmp_path)
    assert config.worker_timeout <= config.ddp_timeout
