"""What the docs say switch mode does with a capped request, checked against `plan_batch` and the config's warning:
the README example's settings and its comments' numbers, and the algorithm page's worked example (issue 27)."""

import ast
import dataclasses
import math
import os
import re

from helpers import REPO

from adloco_hf import AdLoCoConfig
from adloco_hf.batch.switch_mode import BatchPlan, plan_batch, split_sizes


def read(path: str) -> str:
    return open(os.path.join(REPO, path), encoding="utf-8").read()


def readme_example() -> str:
    text = read("README.md")
    section = text[text.index("## Use it in your script") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def example_settings(code: str) -> dict:
    """The literal keyword arguments of the example's `AdLoCoConfig(...)`, over `AdLoCoConfig`'s defaults."""
    call = next(
        node
        for node in ast.walk(ast.parse(code))
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "AdLoCoConfig"
    )
    given = {}
    for keyword in call.keywords:
        try:
            given[keyword.arg] = ast.literal_eval(keyword.value)
        except ValueError:  # fp16=torch.cuda.is_available()
            pass
    defaults = {f.name: f.default for f in dataclasses.fields(AdLoCoConfig) if f.default is not dataclasses.MISSING}
    return {**defaults, **given}


def comments(code: str) -> str:
    """The example's comments as one line of prose (a comment may go on over the next lines)."""
    return " ".join(match.strip() for match in re.findall(r"#(.*)$", code, re.M))


def test_the_readme_example_runs_requests_as_its_comments_say():
    code = readme_example()
    settings, prose = example_settings(code), comments(code)
    cap, limit, gamma = settings["batch_size_cap"], settings["max_batch_size"], settings["switch_threshold"]
    capped = re.search(r"requests of (\d+)-(\d+) run as (\d+) samples in one pass", prose)
    whole = re.search(r"requests of (\d+)-(\d+) run whole as ⌈b / (\d+)⌉ accumulated micro-batches", prose)
    assert capped and whole, prose
    low, high, runs_as = map(int, capped.groups())
    first, last, chunk = map(int, whole.groups())
    # The two ranges cover every request above max_batch_size up to the cap, as the comments claim.
    assert (low, high + 1, last) == (limit + 1, first, cap)
    assert runs_as == chunk == limit
    for b in range(low, high + 1):
        assert plan_batch(b, limit, gamma) == BatchPlan(limit, limit, 1), b
    for b in range(first, last + 1):
        plan = plan_batch(b, limit, gamma)
        assert plan.batch_size == b and plan.accumulation_steps == math.ceil(b / chunk) > 1, (b, plan)
        assert max(split_sizes(b, plan.accumulation_steps)) <= limit
    assert f"switch_threshold {gamma:g} × {limit}" in prose  # the boundary the comment names is the setting's


def test_the_algorithm_page_s_worked_example_is_plan_batch_s():
    text = " ".join(read("docs/algorithm.md").split())
    match = re.search(
        r"With the README example's m = (\d+), γ = (\d+) and cap (\d+), requests of (\d+) to (\d+) run as (\d+) samples, "
        r"and requests of (\d+) to (\d+) run whole, (\d+) as micro-batches of ([\d, and]+), (\d+) as (\d+) of (\d+)",
        text,
    )
    assert match, "docs/algorithm.md lost its worked example of switch mode"
    limit, gamma, cap, low, high, runs_as, first, last, odd, odd_sizes, even, parts, size = match.groups()
    limit, gamma, cap = int(limit), int(gamma), int(cap)
    settings = example_settings(readme_example())
    assert (limit, gamma, cap) == (
        settings["max_batch_size"],
        settings["switch_threshold"],
        settings["batch_size_cap"],
    )
    assert (
        plan_batch(int(low), limit, gamma) == plan_batch(int(high), limit, gamma) == BatchPlan(int(runs_as), limit, 1)
    )
    assert int(low) == limit + 1 and int(high) + 1 == int(first) and int(last) == cap
    odd_plan = plan_batch(int(odd), limit, gamma)
    assert split_sizes(odd_plan.batch_size, odd_plan.accumulation_steps) == [
        int(n) for n in re.findall(r"\d+", odd_sizes)
    ]
    even_plan = plan_batch(int(even), limit, gamma)
    assert split_sizes(even_plan.batch_size, even_plan.accumulation_steps) == [int(size)] * int(parts)
