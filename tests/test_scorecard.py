"""benchmarks/scorecard.py's arithmetic and bookkeeping (not its training): the per-seed t
intervals against hand-computed values, paired comparisons, the sanity rules, a failed cell
marked with its reason while the rest of the table stands, and the grid's order."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "scorecard.py"


@pytest.fixture(scope="module")
def scorecard():
    spec = importlib.util.spec_from_file_location("scorecard", PATH)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["scorecard"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("scorecard", None)


def result(method: str, diagnostic: str, value: int, seed: int, valid: int, ood: int, episodes: int = 10) -> dict:
    return {
        "cell": {"method": method, "diagnostic": diagnostic, "value": value, "seed": seed},
        "status": "ok",
        "seconds": 1.0,
        "rates": {
            "valid": {"successes": valid, "episodes": episodes},
            "test_ood": {"successes": ood, "episodes": episodes},
        },
    }


def test_seed_intervals_are_students_t_over_the_per_seed_rates(scorecard):
    # mean 0.6, sd 0.1, half-width t(2) * 0.1 / sqrt(3) = 4.303 * 0.057735 = 0.248434
    mean, low, high = scorecard.seed_interval([0.5, 0.6, 0.7])
    assert (
        mean == pytest.approx(0.6)
        and low == pytest.approx(0.351566, abs=1e-5)
        and high == pytest.approx(0.848434, abs=1e-5)
    )
    assert scorecard.seed_interval([0.9, 1.0, 1.0])[2] == 1.0  # clipped to [0, 1]
    assert scorecard.seed_interval([0.4]) == (0.4, 0.4, 0.4)
    # paired: differences 0.4, 0.2, 0.3 -> the same half-width around 0.3, which excludes 0
    diff, low, high = scorecard.paired_interval([0.9, 0.8, 1.0], [0.5, 0.6, 0.7])
    assert (
        diff == pytest.approx(0.3)
        and low == pytest.approx(0.051566, abs=1e-5)
        and high == pytest.approx(0.548434, abs=1e-5)
    )


def test_a_failed_cell_is_named_and_the_rest_of_the_table_stands(scorecard):
    results = [result("grpo", "diag-chain", 1, s, 10, 9) for s in (0, 1, 2)]
    results += [result("gigpo", "diag-chain", 1, s, v, 5) for s, v in ((0, 6), (1, 7), (2, 8))]
    results += [result("sft", "diag-chain", 1, s, 9, 4) for s in (0, 1)]
    results.append({**result("sft", "diag-chain", 1, 2, 0, 0), "status": "failed", "reason": "ConfigError: no data"})
    table = scorecard.summarise(results, [0, 1, 2])
    sft = table["sft/diag-chain/1"]
    assert sft["failed"] == {"2": "ConfigError: no data"} and sft["ID"]["per_seed"] == [0.9, 0.9]
    assert table["gigpo/diag-chain/1"]["ID"]["mean"] == pytest.approx(0.7)
    (compare,) = scorecard.comparisons(table, [0, 1, 2])
    assert (compare["a"], compare["b"], compare["seeds"]) == ("gigpo", "grpo", 3)
    assert compare["ID"]["diff"] == pytest.approx(-0.3) and compare["ID"]["resolved"]
    checks = {c["rule"].split(" ")[0]: c for c in scorecard.sanity(table)}
    assert checks["grpo"]["status"] == "pass" and checks["gigpo"]["status"] == "FAIL"
    assert checks["sft"]["status"] == "pass"  # 2 finished seeds at 90%
    text = scorecard.markdown(
        table,
        [compare],
        list(checks.values()),
        {
            "command": "x",
            "seeds": 3,
            "wall_minutes": 1.0,
            "training_minutes": 2.0,
            "workers": 2,
            "budget": {"eval_episodes": 10},
        },
    )
    assert "| sft | 90 [90, 90] (1 failed) (2 seeds) |" in text
    assert "| gigpo - grpo | diag-chain 1 | -30.0 [" in text and "**resolved**" in text
    assert "- FAIL: gigpo learns diag-chain length 1 to >= 90% (ID) in 40 updates (got 70)" in text


def test_the_sanity_runs_are_the_rl_cells_of_chain_1_at_the_longer_budget(scorecard, tmp_path):
    """``grpo-sanity`` is the grid's GRPO cell on chain 1 with ``sanity_rl_updates`` updates and
    nothing else changed; its rule is reported beside the grid-budget one, each on its own."""
    args = argparse.Namespace(
        select=False, values={}, diagnostics=list(scorecard.DIFFICULTIES), seeds=[0], methods=["envrl-sanity"]
    )
    assert [(c.diagnostic, c.value) for c in scorecard.grid(args)] == [("diag-chain", 1)]
    paths = scorecard.Paths(tmp_path)
    for method, base in scorecard.SANITY_RUNS.items():
        algo, sets, updates = scorecard.cell_sets(scorecard.Cell(method, "diag-chain", 1, 0), paths)
        base_algo, base_sets, base_updates = scorecard.cell_sets(scorecard.Cell(base, "diag-chain", 1, 0), paths)
        differ = {s for s in sets if not s.startswith(("out=", "name="))} ^ {
            s for s in base_sets if not s.startswith(("out=", "name="))
        }
        assert (algo, updates, base_updates, differ) == (base_algo, 80, 40, set())
    table = scorecard.summarise(
        [result(m, "diag-chain", 1, s, v, 5) for m, v in (("grpo", 8), ("grpo-sanity", 10)) for s in (0, 1, 2)],
        [0, 1, 2],
    )
    rules = {c["rule"]: c["status"] for c in scorecard.sanity(table)}
    assert rules == {
        "grpo learns diag-chain length 1 to >= 90% (ID) in 40 updates": "FAIL",
        "grpo learns diag-chain length 1 to >= 90% (ID) in 80 updates": "pass",
    }


def test_a_cell_that_cannot_start_is_recorded_as_failed(scorecard, tmp_path):
    cell = scorecard.Cell("sft", "diag-chain", 1, 0)
    got = scorecard.run_cell(cell, scorecard.Paths(tmp_path))
    assert got["status"] == "failed" and got["reason"]
    assert scorecard.Paths(tmp_path).cell_file(cell).is_file()


def test_the_grid_runs_the_easiest_level_of_every_diagnostic_first(scorecard):
    args = argparse.Namespace(
        select=False,
        diagnostics=["diag-chain", "diag-dynamics"],
        values={},
        seeds=[0],
        methods=["sft", "grpo-from-sft"],
    )
    cells = scorecard.grid(args)
    assert [(c.diagnostic, c.value) for c in cells[:2]] == [("diag-chain", 1), ("diag-dynamics", 2)]
    assert all(c.method == "sft" for c in cells)  # grpo-from-sft runs on the alternatives task only
    assert cells[0].name == "sft-diag-chain-l1-s0" and cells[0].env_kwargs == {"length": 1}


def test_a_rerun_resumes_from_the_committed_record_and_retrains_a_lost_checkpoint(scorecard, tmp_path):
    """The committed scorecard.json stands in for the per-cell files a fresh clone lacks; a
    grpo-from-sft cell still to run brings back the SFT cell whose checkpoint it starts from;
    a record made under another budget keeps only the cells that do not read the changed field."""
    import json

    paths = scorecard.Paths(tmp_path)
    Cell = scorecard.Cell
    sft, grpo = (Cell(m, "diag-alternatives", 2, 0) for m in ("sft", "grpo"))
    from_sft = Cell("grpo-from-sft", "diag-alternatives", 2, 0)
    cells = [sft, grpo, from_sft]
    record = [result("sft", "diag-alternatives", 2, 0, 10, 0), result("grpo", "diag-alternatives", 2, 0, 9, 1)]
    for r in record:
        r["cell"]["splits"] = ["valid", "test_ood"]
    table = {"meta": {"budget": paths.budget.__dict__}, "cells": record}
    (tmp_path / "scorecard.json").write_text(json.dumps(table))

    finished = scorecard.finished_cells(cells, paths)
    assert sorted(finished) == sorted(scorecard.cell_key(c) for c in (sft, grpo))
    assert scorecard.pending(cells, finished, paths) == [from_sft, sft]  # sft's checkpoint is gone

    checkpoint = paths.checkpoint(sft, scorecard.cell_sets(sft, paths)[2])
    checkpoint.mkdir(parents=True)
    (checkpoint / "config.json").write_text("{}")
    assert scorecard.pending(cells, finished, paths) == [from_sft]

    table["meta"]["budget"] = paths.budget.__dict__ | {"rl_updates": 1}  # the RL cell's budget is not this run's
    (tmp_path / "scorecard.json").write_text(json.dumps(table))
    assert sorted(scorecard.finished_cells(cells, paths)) == [scorecard.cell_key(sft)]
    longer = scorecard.Paths(tmp_path, scorecard.Budget(sft_updates=2 * paths.budget.sft_updates))  # nor SFT's
    assert scorecard.finished_cells(cells, longer) == {}

    # a result written by run_cell carries its own budget, which wins over the record's meta
    record[1]["budget"] = scorecard.cell_budget("grpo", paths.budget)
    (tmp_path / "scorecard.json").write_text(json.dumps(table))
    assert sorted(scorecard.finished_cells(cells, paths)) == sorted(scorecard.cell_key(c) for c in (sft, grpo))


def test_a_cells_budget_names_every_field_its_training_reads(scorecard, tmp_path):
    """A Budget field outside a method's :func:`cell_budget` leaves that method's ``--set`` items
    and update count unchanged, so resuming on the recorded fields never keeps a stale cell. The
    fields read by the data builders (expert episodes, alternatives per state) are checked by name."""
    import dataclasses

    base = scorecard.Budget()
    built_elsewhere = {"expert_episodes", "alternatives"}
    for method in scorecard.ALL_METHODS:
        cells = [scorecard.Cell(method, "diag-alternatives", 2, 0)]
        if method in scorecard.FROM_CHECKPOINT:  # and the cell it starts from
            cells.append(scorecard.Cell(scorecard.FROM_CHECKPOINT[method], "diag-alternatives", 2, 0))
        reads = set(scorecard.cell_budget(method, base))
        before = [scorecard.cell_sets(c, scorecard.Paths(tmp_path, base)) for c in cells]
        for f in dataclasses.fields(base):
            value = getattr(base, f.name)
            other = "mean" if f.name == "choose_score" else value * 2 if value else 1
            changed_paths = scorecard.Paths(tmp_path, dataclasses.replace(base, **{f.name: other}))
            changed = [scorecard.cell_sets(c, changed_paths) for c in cells] != before
            if f.name not in built_elsewhere:  # those are read by the data builders (below)
                assert changed == (f.name in reads), (method, f.name)
            elif f.name not in reads:
                assert not changed, (method, f.name)
        uses_data = method in ("sft", "iwm", "sr") or method in scorecard.FROM_CHECKPOINT
        assert ("expert_episodes" in reads) == uses_data, method
        assert ("alternatives" in reads) == (method in ("iwm", "sr", "grpo-from-iwm")), method
    # the data builders' fields name their folders, so a changed field never reuses stale data
    cell, paths = scorecard.Cell("iwm", "diag-alternatives", 2, 0), scorecard.Paths(tmp_path, base)
    for name, value in (("expert_episodes", 400), ("alternatives", 2)):
        changed = scorecard.Paths(tmp_path, dataclasses.replace(base, **{name: value}))
        assert changed.early_experience(cell) != paths.early_experience(cell)
        assert (changed.expert(cell) != paths.expert(cell)) == (name == "expert_episodes")


def test_envrl_ablations_run_on_the_dynamics_task_with_one_setting_changed(scorecard, tmp_path):
    """Each ablation is the scorecard's ENVRL cell with one ``--set`` item more, and that item
    reaches the algorithm's config; the ablations sit on dynamics r2 and r4 only and are compared
    with ENVRL there."""
    from envrl.training.algorithms import algorithm_class
    from envrl.training.config import build_config

    args = argparse.Namespace(
        select=False, values={}, diagnostics=list(scorecard.DIFFICULTIES), seeds=[0], methods=["envrl-no-id"]
    )
    cells = scorecard.grid(args)
    assert [(c.diagnostic, c.value) for c in cells] == [("diag-dynamics", 2), ("diag-dynamics", 4)]
    paths = scorecard.Paths(tmp_path)
    base_algo, base_sets, _ = scorecard.cell_sets(scorecard.Cell("envrl", "diag-dynamics", 2, 0), paths)
    expected = {"envrl-no-sp": ("sp", False), "envrl-no-id": ("id", False), "envrl-constant": ("decay", "constant")}
    expected["envrl-aux0.5"] = ("aux_fraction", 0.5)
    assert set(expected) == set(scorecard.ENVRL_ABLATIONS)
    for method, (field, value) in expected.items():
        algo, sets, _ = scorecard.cell_sets(scorecard.Cell(method, "diag-dynamics", 2, 0), paths)
        extra = [s for s in sets if s not in base_sets and not s.startswith(("out=", "name="))]
        assert algo == base_algo == "envrl" and extra == scorecard.ENVRL_ABLATIONS[method]
        config = build_config(algo, "diag-dynamics", algorithm_config=algorithm_class(algo).Config, sets=sets)
        assert getattr(config.algorithm, field) == value
        assert config.algorithm.sp_coef == 0.01 and config.algorithm.id_coef == 0.001
    table = scorecard.summarise(
        [result(m, "diag-dynamics", 2, s, 5, 2) for m in ("envrl", "envrl-no-sp") for s in (0, 1, 2)], [0, 1, 2]
    )
    rows = [(r["a"], r["b"]) for r in scorecard.comparisons(table, [0, 1, 2])]
    assert rows == [("envrl-no-sp", "envrl")]
