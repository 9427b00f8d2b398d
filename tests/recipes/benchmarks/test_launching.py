"""`adloco_hf.testing`, the launcher the benchmarks share with the test suite: the command lines it builds (what
accelerate parses), running them (output, environment, timeouts that kill every process), a module target on CPU
workers, and the tiny model."""

import os
import sys
import time

import pytest
from helpers import REPO

from adloco_hf.testing import WorkersFailed, free_port, launch_command, run_workers, tiny_llama, tiny_llama_config


def test_launch_command_runs_a_script_or_a_module_on_n_cpu_workers():
    command = launch_command("worker.py", "spec.json", "--flag", num_processes=3, main_process_port=12345)
    assert command[:3] == [sys.executable, "-m", "accelerate.commands.launch"]
    assert command[command.index("--num_processes") + 1] == "3"
    assert command[command.index("--main_process_port") + 1] == "12345"
    assert "--multi_gpu" in command and "--cpu" not in command  # DESIGN §6: --cpu alone runs one process
    assert command[-3:] == ["worker.py", "spec.json", "--flag"]
    assert "--module" not in command
    module = launch_command("recipes.benchmarks.toolkit.worker", "--worker", "{}", num_processes=2, module=True)
    assert module[-4:] == ["--module", "recipes.benchmarks.toolkit.worker", "--worker", "{}"]
    assert 0 < int(module[module.index("--main_process_port") + 1]) < 65536
    assert 0 < free_port() < 65536
    with pytest.raises(ValueError):
        launch_command("worker.py", num_processes=0)


def test_launch_command_is_what_accelerate_parses():
    from accelerate.commands.launch import launch_command_parser

    command = launch_command("recipes.benchmarks.toolkit.worker", "spec.json", num_processes=4, module=True)
    parsed = launch_command_parser().parse_args(command[3:])
    assert parsed.multi_gpu and parsed.num_processes == 4 and parsed.module
    assert parsed.training_script == "recipes.benchmarks.toolkit.worker"
    assert parsed.training_script_args == ["spec.json"]


def test_run_workers_returns_the_output_with_the_given_environment(tmp_path):
    code = "import os, sys; print(os.environ['OMP_NUM_THREADS'], os.environ['X']); print('err', file=sys.stderr)"
    result = run_workers([sys.executable, "-c", code], timeout=60, env={"X": "y"}, threads=3, cwd=tmp_path)
    assert result.ok and result.returncode == 0 and not result.timed_out
    assert result.stdout.split() == ["3", "y"] and result.stderr.strip() == "err"
    # A module found through `pythonpath`, the output in a log file.
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "hello.py").write_text(
        "import sys\nprint('hello', sys.argv[1], flush=True)\nprint('e', file=sys.stderr)\n"
    )
    log = tmp_path / "launch.log"
    result = run_workers([sys.executable, "-m", "pkg.hello", "x"], timeout=60, pythonpath=[tmp_path], log_path=log)
    assert result.stdout.split() == ["hello", "x", "e"] and result.stderr == ""
    assert log.read_text() == result.stdout


def test_run_workers_raises_with_the_output_or_returns_the_failure():
    code = "import sys; print('the cause'); sys.exit(3)"
    with pytest.raises(WorkersFailed) as failure:
        run_workers([sys.executable, "-c", code], timeout=60)
    assert isinstance(failure.value, AssertionError)  # a test that launches workers fails, with their output
    assert "exit 3" in str(failure.value) and "the cause" in str(failure.value)
    assert failure.value.result.returncode == 3
    result = run_workers([sys.executable, "-c", code], timeout=60, check=False)
    assert result.returncode == 3 and not result.ok


def test_run_workers_kills_every_process_of_the_launch_at_the_timeout(tmp_path):
    # A parent that starts a child and both sleep: the child must not outlive the timeout.
    pid_file = tmp_path / "child.pid"
    code = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "print('started', flush=True)\n"
        "time.sleep(600)\n"
    )
    # The timeout leaves the parent time to start its child on a machine doing other work; the kill itself takes at
    # most kill_grace after it.
    result = run_workers([sys.executable, "-c", code], timeout=15, check=False, kill_grace=2)
    assert result.timed_out and result.returncode == 124 and not result.ok
    assert "started" in result.stdout
    assert result.seconds < 300  # SIGTERM, then SIGKILL after kill_grace: never waits for the 600-s sleeps
    child = int(pid_file.read_text())
    for _ in range(50):
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the launch's child process {child} survived the timeout")
    with pytest.raises(WorkersFailed, match="did not finish"):
        run_workers([sys.executable, "-c", "import time; time.sleep(600)"], timeout=1, kill_grace=1)


@pytest.mark.multiprocess
def test_a_module_target_runs_on_n_cpu_workers_in_one_gloo_group(tmp_path):
    # How the benchmarks launch their workers: `--module`, from the repository root, no path edits in the workers.
    command = launch_command("tests.scripts.probe_world_size", "2", str(tmp_path), num_processes=2, module=True)
    run_workers(command, timeout=120, cwd=REPO, pythonpath=[REPO])
    for rank in (0, 1):
        assert (tmp_path / f"rank-{rank}").read_text().split() == ["2", "gloo"]


def test_tiny_llama_is_small_and_seeded():
    config = tiny_llama_config()
    assert (config.vocab_size, config.hidden_size, config.num_hidden_layers) == (64, 32, 2)
    assert config.intermediate_size == 64
    wide = tiny_llama_config(vocab_size=4096, hidden_size=64, intermediate_size=256, max_position_embeddings=256)
    assert (wide.intermediate_size, wide.max_position_embeddings) == (256, 256)
    a, b, c = tiny_llama(seed=0), tiny_llama(seed=0), tiny_llama(seed=1)
    weights = [next(m.parameters()).detach() for m in (a, b, c)]
    assert (weights[0] == weights[1]).all() and not (weights[0] == weights[2]).all()


def test_launch_command_keeps_one_machine_by_default_and_checks_multi_machine_arguments():
    one = launch_command("worker.py", num_processes=2, main_process_port=1234)
    assert one[one.index("--num_machines") + 1] == "1"
    assert "--machine_rank" not in one and "--main_process_ip" not in one
    with pytest.raises(ValueError):
        launch_command("worker.py", num_processes=4, num_machines=4, machine_rank=0)  # no address, no port
    with pytest.raises(ValueError):
        launch_command("w.py", num_processes=3, num_machines=2, main_process_ip="10.0.0.1", main_process_port=1)
    with pytest.raises(ValueError):
        launch_command(
            "w.py", num_processes=4, num_machines=4, machine_rank=4, main_process_ip="x", main_process_port=1
        )
    with pytest.raises(ValueError):
        launch_command("w.py", num_processes=2, machine_rank=1)
