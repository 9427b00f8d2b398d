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


@pytest.mark.parametrize(
    ("worker_timeout", "peer_timeout", "expected"),
    [
        (1800, None, 45.0),  # the defaults: a dead peer named within a minute, transfers wait 30 minutes
        (61, None, 45.0),
        (60, None, 0.0),  # worker_timeout names a lost worker within a minute itself: the watch stays off
        (30, None, 0.0),
        (1800, 0, 0.0),  # off
        (1800, 120, 120.0),
        (30, 30, 30.0),
        (30, 3, 3.0),
    ],
)
def test_peer_timeout_resolves_to_the_watch_that_runs(tmp_path, worker_timeout, peer_timeout, expected):
    config = make(
        tmp_path, worker_timeout=worker_timeout, ddp_timeout=max(worker_timeout, 60), peer_timeout=peer_timeout
    )
    assert config.peer_timeout == expected
    assert config.to_dict()["peer_timeout"] == expected  # the saved config holds what ran


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        (dict(peer_timeout=2), "peer_timeout=2: set 0 (off) or at least 3 s"),
        (dict(peer_timeout=-1), "peer_timeout=-1: set 0 (off) or at least 3 s"),
        (
            dict(peer_timeout=90, worker_timeout=60, ddp_timeout=60),
            "peer_timeout=90 is above worker_timeout=60: worker_timeout would name a lost worker first",
        ),
    ],
)
def test_an_inconsistent_peer_timeout_is_refused_naming_the_fix(tmp_path, kwargs, expected):
    with pytest.raises(ValueError) as raised:
        make(tmp_path, **kwargs)
    assert expected in str(raised.value), str(raised.value)
    assert "docs/faults.md#timeouts" in str(raised.value) or "at least 3 s" in str(raised.value)


def test_peer_timeout_is_a_command_line_flag(tmp_path):
    from transformers import HfArgumentParser

    argv = f"--output_dir {tmp_path} --use_cpu --report_to none --max_steps 40 --inner_steps 10 --peer_timeout 20"
    (config,) = HfArgumentParser(AdLoCoConfig).parse_args_into_dataclasses(argv.split())
    assert config.peer_timeout == 20.0
