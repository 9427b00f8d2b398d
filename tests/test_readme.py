"""The README's first example runs as written: 4 CPU workers launched as the README says, without `use_cpu`."""

import os
import re

import pytest
from helpers import REPO, launch


def readme_example() -> str:
    text = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    section = text[text.index("## Use it in your script") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.mark.multiprocess
def test_the_first_example_of_the_readme_trains_on_cpu_workers(tmp_path):
    code = readme_example()
    assert "use_cpu" not in code  # AdLoCoConfig forms the CPU world itself
    # Only shorter: fewer steps, and every path under tmp_path.
    code = code.replace("max_steps=200", "max_steps=40").replace("eval_steps=100", "eval_steps=40")
    code = code.replace('"out"', repr(str(tmp_path / "out"))).replace('"cache"', repr(str(tmp_path / "cache")))
    script = tmp_path / "train.py"
    script.write_text(code + "\nassert trainer.args.world_size == 4, trainer.args.world_size\n")
    result = launch(str(script), num_processes=4, timeout=600)
    output = result.stdout + result.stderr
    assert os.path.isfile(tmp_path / "out" / "merged" / "model.safetensors")
    assert "round 2 (step 40)" in output  # the round line reaches the user's console at log_level="info"
