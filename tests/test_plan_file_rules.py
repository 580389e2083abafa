"""A plan file's rules across its stages, checked when it is read (before any stage
trains): the stages are one whole-scan stage, then at most one refiner, and their
budget shares add up to at most the budget. And what docs/plan.md says of the budget
is what training does."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from heatmap3d.config_io import load_config
from heatmap3d.errors import InputError
from heatmap3d.planning.plan_file import read_plan

ROOT = Path(__file__).resolve().parents[1]

COARSE = """\
  - name: {name}
    budget_share: {share}
    config:
      data: {{spacing: [3.0, 3.0, 3.0], landmark_crops: 0.0}}
      model: {{channels: 8, role: "whole_scan"}}
"""
FINE = """\
  - name: {name}
    budget_share: {share}
    config:
      data: {{spacing: [2.0, 2.0, 2.0], landmark_crops: 1.0}}
      model: {{channels: 8, role: "refiner"}}
"""
DEFAULT_ROLE = """\
  - name: {name}
    budget_share: {share}
    config:
      train: {{lr: 0.002}}
"""


def plan_file(tmp_path: Path, *stages: tuple[str, str, float]) -> Path:
    """A plan file of ``stages`` (template, name, budget share), in order."""
    path = tmp_path / "plan.yaml"
    text = "".join(t.format(name=name, share=share) for t, name, share in stages)
    path.write_text("# an edited plan\nstages:\n" + text)
    return path


def refused(path: Path, *fragments: str) -> str:
    """read_plan's one-line InputError on ``path``, checked to start with the file and to
    hold every fragment."""
    with pytest.raises(InputError) as caught:
        read_plan(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: ") and "\n" not in message, message
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    return message


# --------------------------------------------------------------------------------------
# The stages' roles
# --------------------------------------------------------------------------------------


def test_a_second_whole_scan_stage_is_refused_when_the_plan_is_read(tmp_path):
    """The tester's plan: the coarse stage copied as coarse2. Every stage trained, then
    the run failed on a flag (--refine) the user never gave."""
    path = plan_file(tmp_path, (COARSE, "coarse", 0.5), (COARSE, "coarse2", 0.5))
    message = refused(path, "stage 2 (coarse2)", "model.role whole_scan", "set model.role: refiner")
    assert "a plan is one whole-scan stage" in message and "at most one refiner" in message
    assert "--refine" not in message
    # As the message says: coarse2 a refiner, or removed.
    path = plan_file(tmp_path, (COARSE, "coarse", 0.5), (FINE, "coarse2", 0.5))
    assert [s.name for s in read_plan(path)] == ["coarse", "coarse2"]
    path = plan_file(tmp_path, (DEFAULT_ROLE, "coarse", 1.0))  # whole_scan by default
    assert [s.name for s in read_plan(path)] == ["coarse"]


@pytest.mark.parametrize(
    "stages, fragments",
    [
        ([(FINE, "fine", 1.0)], ["stage 1 (fine)", "model.role refiner", "whole_scan"]),
        (
            [(FINE, "fine", 0.5), (COARSE, "coarse", 0.5)],
            ["stage 1 (fine)", "model.role refiner"],
        ),
        (
            [(DEFAULT_ROLE, "coarse", 0.5), (DEFAULT_ROLE, "again", 0.5)],
            ["stage 2 (again)", "model.role whole_scan"],  # the default role, unwritten
        ),
        (
            [(COARSE, "coarse", 0.4), (FINE, "fine", 0.3), (FINE, "finer", 0.3)],
            ["3 stages (coarse, fine, finer)", "remove the stages after the second"],
        ),
    ],
)
def test_stages_prediction_cannot_run_are_refused(tmp_path, stages, fragments):
    refused(plan_file(tmp_path, *stages), *fragments)


# --------------------------------------------------------------------------------------
# The stages' budget shares
# --------------------------------------------------------------------------------------


def test_budget_shares_adding_up_to_more_than_one_are_refused(tmp_path):
    """0.9 + 0.9 trained 1.8 times the budget without a word."""
    path = plan_file(tmp_path, (COARSE, "coarse", 0.9), (FINE, "fine", 0.9))
    refused(path, "budget_share", "1.8", "coarse 0.9, fine 0.9", "total training time")
    # A stage's share left out is 1: beside another stage that is over the budget too.
    path = plan_file(tmp_path, (COARSE, "coarse", 1), (FINE, "fine", 0.01))
    refused(path, "1.01", "coarse 1, fine 0.01")
    # Up to 1, whatever the rounding of the shares as written, is read.
    for shares in [(0.3, 0.7), (0.1, 0.2), (1 / 3, 2 / 3), (0.35, 0.65)]:
        path = plan_file(tmp_path, (COARSE, "coarse", shares[0]), (FINE, "fine", shares[1]))
        assert [s.budget_share for s in read_plan(path)] == pytest.approx(list(shares))


# --------------------------------------------------------------------------------------
# The budget, as docs/plan.md says it
# --------------------------------------------------------------------------------------


def test_the_budget_docs_say_what_train_epochs_does():
    """The page said "Without a budget a plan trains for 60 minutes", but train.epochs=N
    given alone trains N epochs a stage with no time budget."""
    from heatmap3d.training.stages import DEFAULT_BUDGET_MINUTES, plan_budget

    page = " ".join((ROOT / "docs" / "plan.md").read_text(encoding="utf-8").split())
    assert "Without a budget a plan trains for 60 minutes" not in page
    said = re.search(
        r"neither `train.budget_minutes` nor `train.epochs`, a plan trains for (\d+)", page
    )
    assert said and float(said[1]) == DEFAULT_BUDGET_MINUTES
    assert "`train.epochs=N` alone, each stage trains N epochs with no time budget" in page
    assert "given both, a budget above 0 decides" in page

    def budget(*overrides: str) -> float:
        return plan_budget(list(overrides), load_config(None, list(overrides), for_plan=True))

    assert budget() == DEFAULT_BUDGET_MINUTES
    assert budget("train.epochs=3") == 0.0  # 0: each stage's train.epochs decides
    assert budget("train.epochs=3", "train.budget_minutes=5") == 5.0
