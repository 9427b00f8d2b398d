"""A round is one value (`rounds/plan.py`: `RoundPlan`): made by two pure functions in `rounds/`, applied by the worker
in one place (`RoundEnd.apply`), and its lines built once and finished once (`rounds/lines.py`)."""

import ast
import dataclasses
import pathlib

import pytest
from helpers import PAPER_ROUNDS, round_rules
from test_rounds import report, stats

from adloco_hf.instances.merges import MergeResult
from adloco_hf.instances.table import Instance
from adloco_hf.rounds.decision import decide_round
from adloco_hf.rounds.lines import finish_lines
from adloco_hf.rounds.plan import RoundPlan, first_plan, plan_round


PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "adloco_hf"
# Who may make a round's plan, and the one function that applies it.
MAKERS = {"rounds/plan.py:first_plan", "rounds/decision.py:decide_round"}
APPLIER = "worker/round_end.py:RoundEnd.apply"
# Where the applier is called: once the first round's plan is made (at the start, or after a resume), and at every
# round's end.
APPLIER_CALLERS = {"worker/core.py:Worker.start", "worker/round_end.py:RoundEnd.run"}
# What a plan sets on the worker's round state (`worker/round_state.py`), and the follower's `apply`.
PLANNED = {"instances", "plan", "inner_steps"}


def rules(**overrides):
    base = dict(PAPER_ROUNDS, eta=0.5, max_skipped_rounds=None, per_device_train_batch_size=1, max_batch_size=8)
    return round_rules(**{**base, **overrides})


def functions(tree: ast.Module):
    """(qualified name, node) of every function of a module, methods as Class.method."""
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            yield node.name, node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    yield f"{node.name}.{item.name}", item


def plan_sites(package: pathlib.Path) -> dict[str, list[str]]:
    """Where the package makes a `RoundPlan`, sets a planned attribute of another object (`rounds.instances = ...`),
    calls a `follower.apply`, and calls a `.apply(` on the round's end (`round_end.apply` / `self.apply`)."""
    found = {"makes": [], "sets": [], "follows": [], "applies": []}
    for path in sorted(package.rglob("*.py")):
        module = str(path.relative_to(package))
        for name, function in functions(ast.parse(path.read_text())):
            where = f"{module}:{name}"
            for node in ast.walk(function):
                if isinstance(node, ast.Call):
                    func = node.func
                    if getattr(func, "id", None) == "RoundPlan":
                        found["makes"].append(where)
                    if isinstance(func, ast.Attribute) and func.attr == "apply":
                        owner = func.value
                        owner_name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
                        on_round_end = owner_name == "round_end" or (
                            owner_name == "self" and module == "worker/round_end.py"
                        )
                        if owner_name == "follower":
                            found["follows"].append(where)
                        elif on_round_end:
                            found["applies"].append(where)
                targets = node.targets if isinstance(node, ast.Assign) else []
                for target in [t for t in targets if isinstance(t, ast.Attribute) and t.attr in PLANNED]:
                    if not (isinstance(target.value, ast.Name) and target.value.id == "self"):
                        found["sets"].append(where)
    return found


def test_one_maker_pair_and_one_applier_of_a_round_s_plan():
    sites = plan_sites(PACKAGE)
    assert set(sites["makes"]) == MAKERS, sites["makes"]
    assert set(sites["sets"]) == {APPLIER}, sites["sets"]
    assert set(sites["follows"]) == {APPLIER}, sites["follows"]
    assert set(sites["applies"]) == APPLIER_CALLERS, sites["applies"]


def test_the_check_finds_a_plan_made_or_applied_elsewhere(tmp_path):
    (tmp_path / "worker").mkdir()
    (tmp_path / "worker" / "elsewhere.py").write_text(
        "def sneak(rounds, follower, plan):\n"
        "    rounds.instances = list(plan.instances)\n"
        "    follower.apply(plan.worker(0))\n"
        "    return RoundPlan(instances=(), workers={}, inner_steps=1)\n"
    )
    sites = plan_sites(tmp_path)
    assert sites["makes"] == sites["sets"] == sites["follows"] == ["worker/elsewhere.py:sneak"]


def test_the_first_plan_is_every_worker_s_plan_of_the_table_without_a_merge():
    table = [Instance(0, (0, 1), 4), Instance(1, (2,), 12)]
    plan = first_plan(table, rules(), inner_steps=25)
    assert plan.instances == tuple(table) and plan.inner_steps == 25 and plan.merge is None
    assert dict(plan.workers) == plan_round(table, rules())
    assert plan.worker(2).process.batch_size == 8 and plan.worker(2).process.accumulation_steps == 1  # capped at 8
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.inner_steps = 5
    with pytest.raises(TypeError):  # its workers' plans are read-only too
        plan.workers[0] = plan.worker(2)


def test_the_decision_s_plan_holds_the_table_after_the_merge_its_plans_and_h():
    table = [Instance(0, (0,), 4), Instance(1, (1,), 4), Instance(2, (2,), 4)]
    reports = [report(0, stats(8.0, 1.0)), report(1, stats(0.1, 1.0)), report(2, stats(0.1, 1.0))]
    decision = decide_round(table, reports, outer_step=1, global_step=10, rules=rules(merge_every=1), inner_steps=10)
    plan = decision.plan
    assert isinstance(plan, RoundPlan) and plan.merge is not None and plan.inner_steps == 10
    assert len(plan.instances) == 2 and sorted(w for i in plan.instances for w in i.workers) == [0, 1, 2]
    assert dict(plan.workers) == plan_round(list(plan.instances), rules(merge_every=1))
    # The old names read the plan.
    assert decision.instances == list(plan.instances) and decision.merge is plan.merge
    assert decision.plans == dict(plan.workers) and decision.next_inner_steps == 10


def test_a_line_is_finished_once_with_the_merge_on_the_survivor_and_is_never_changed_in_place():
    table = [Instance(0, (0,), 4), Instance(1, (1,), 4)]
    decision = decide_round(
        table, [report(0), report(1)], outer_step=1, global_step=10, rules=rules(merge_every=1), inner_steps=10
    )
    survivor, merged = decision.plan.merge.survivor, decision.plan.merge.merged
    merge = MergeResult(plan=decision.plan.merge, bytes=4096, seconds=1.5, phi=None)
    lines = finish_lines(decision.lines, decision.plan, merge, inner_steps=10, tokens=200, elapsed_seconds=3.0)
    assert [line.instance for line in lines] == [0, 1]
    by_id = {line.instance: line for line in lines}
    drafted = decision.lines[survivor]
    assert by_id[survivor].comm_bytes == drafted.comm_bytes + 4096 and by_id[survivor].merge_bytes == 4096
    assert by_id[survivor].merge_seconds == 1.5 and by_id[survivor].merged_from == [merged]
    assert by_id[merged].merge_bytes is None and by_id[merged].merged_into == survivor
    assert all(line.num_instances == 1 and line.total_tokens == 200 and line.elapsed_seconds == 3.0 for line in lines)
    assert drafted.merge_bytes is None and drafted.total_tokens == 0  # the decision's own lines are left as they were
    with pytest.raises(dataclasses.FrozenInstanceError):
        lines[0].comm_bytes = 0
