"""What-if: each checkpoint plan's traced peak against the same plan applied for real and measured, the extra
FLOPs against an independent count, plan resolution and its errors, and the command line."""

from __future__ import annotations

import json
import pickle
import textwrap
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import nnmem
from nnmem.cli import cli
from nnmem.frontends.pytorch.checkpointing import checkpointed

WIDTH, BLOCKS, BATCH = 128, 4, 256

BLOCKS_SOURCE = f"""
    import torch
    from torch import nn
    import nnmem

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(nn.Sequential(nn.Linear({WIDTH}, 2 * {WIDTH}), nn.GELU(),
                                                      nn.Linear(2 * {WIDTH}, {WIDTH}), nn.Tanh())
                                        for _ in range({BLOCKS}))
            self.head = nn.Linear({WIDTH}, 10)

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return self.head(x)

    def chain():
        torch.manual_seed(0)
        return nn.Sequential(*[nn.Sequential(nn.Linear({WIDTH}, 2 * {WIDTH}), nn.GELU(),
                                             nn.Linear(2 * {WIDTH}, {WIDTH}), nn.Tanh()) for _ in range(9)])

    def make(batch):
        torch.manual_seed(0)
        return Net(), torch.randn(batch, {WIDTH})

    def make_chain(batch):
        return chain(), torch.randn(batch, {WIDTH})

    def make_acts(batch):
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear({WIDTH}, 2 * {WIDTH}), nn.ReLU(), nn.Dropout(0.1),
                             nn.Linear(2 * {WIDTH}, {WIDTH}), nn.LeakyReLU(), nn.Linear({WIDTH}, 10)), \
            torch.randn(batch, {WIDTH})
"""


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("whatif") / "blocks.py"
    path.write_text(textwrap.dedent(BLOCKS_SOURCE))
    return path


def _applied(source: Path, factory: str, technique: str) -> str:
    """A factory that builds the model and applies ``technique`` for real (it runs in the measuring child)."""
    path = source.parent / f"{factory}_{technique.replace(':', '_').replace(',', '_').replace('.', '_')}.py"
    path.write_text(textwrap.dedent(f"""
        import sys
        import nnmem
        sys.path.insert(0, {str(source.parent)!r})
        from blocks import {factory} as base

        def make(batch):
            model, x = base(batch)
            return nnmem.apply_technique(model, {technique!r}), x
    """))
    return f"{path}:make"


@pytest.mark.parametrize("factory", ["make", "make_chain"])
def test_each_plan_matches_the_plan_applied_and_measured(source: Path, factory: str) -> None:
    result = nnmem.what_if(f"{source}:{factory}", batch=BATCH, optimizer="adam")
    assert {r.technique for r in result.rows} >= {"checkpoint:blocks", "checkpoint:every:2"}
    assert any(result.saved(r) > 0 for r in result.rows)
    for row in (r for r in result.rows if r.technique.startswith("checkpoint:")):
        measured = nnmem.measure(_applied(source, factory, row.technique), batch=BATCH, optimizer="adam")
        estimated = row.report.peaks["allocator"]
        err = (estimated - measured.peaks["allocator"]) / measured.peaks["allocator"]
        assert abs(err) < 0.01, (row.technique, estimated, measured.peaks["allocator"])


@pytest.mark.parametrize("mode", ["train", "infer"])
def test_in_place_activations_match_the_model_switched_and_measured(source: Path, mode: str) -> None:
    optimizer = "sgd" if mode == "train" else None
    result = nnmem.what_if(f"{source}:make_acts", batch=BATCH, mode=mode, optimizer=optimizer,
                           techniques=["inplace"])
    (row,) = result.rows
    measured = nnmem.measure(_applied(source, "make_acts", "inplace"), batch=BATCH, mode=mode, optimizer=optimizer)
    assert abs(row.report.peaks["allocator"] - measured.peaks["allocator"]) <= 0.01 * measured.peaks["allocator"]
    if mode == "infer":  # the ReLU's and LeakyReLU's outputs are not allocated
        assert result.saved(row) > 0


def test_in_place_only_where_it_is_safe() -> None:
    """After a Linear (saves its input) yes; after a ReLU or a sigmoid (backward needs their output) no."""
    from nnmem.frontends.pytorch.inplace import inplace_candidates

    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Dropout(), nn.Linear(8, 8), nn.Sigmoid(), nn.ReLU(),
                          nn.Sequential(nn.Conv1d(8, 8, 1), nn.ELU()))
    assert inplace_candidates(model) == ["1", "6.1"]
    with pytest.raises(nnmem.UnsupportedError, match="known to be safe"):
        inplace_candidates(nn.Sequential(nn.Linear(4, 8), nn.Sigmoid(), nn.ReLU()))
    flat = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.ELU(), nn.Linear(8, 2))
    inputs = torch.randn(5, 4)
    expected = flat(inputs)
    nnmem.apply_technique(flat, "inplace")
    assert flat[1].inplace and flat[3].inplace
    out = flat(inputs)
    out.sum().backward()  # autograd accepts it
    assert torch.allclose(out, expected)


def test_extra_flops_are_the_recomputed_forwards(source: Path) -> None:
    """Checkpointing every block recomputes each block's forward once: the FLOPs of a forward of the blocks,
    counted here on real tensors."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("blocks_for_flops", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    model, x = module.make(BATCH)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        for block in model.blocks:
            x = block(x)
    result = nnmem.what_if(model, (torch.randn(BATCH, WIDTH),), optimizer="sgd", techniques=["checkpoint:blocks"])
    (row,) = result.rows
    assert row.flops - result.baseline.flops == counter.get_total_flops()


def test_plans_name_the_chain_and_refuse_what_does_not_apply(source: Path) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("blocks_for_plans", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    model, _ = module.make(2)
    assert nnmem.checkpoint_plan(model, "blocks").modules == tuple(f"blocks.{i}" for i in range(BLOCKS))
    assert nnmem.checkpoint_plan(model, "every:3").modules == ("blocks.0", "blocks.3")
    assert nnmem.checkpoint_plan(model, "blocks.1,head").modules == ("blocks.1", "head")
    assert nnmem.checkpoint_plan(module.chain(), "sqrt").segments == (("", 3),)
    with pytest.raises(nnmem.UnsupportedError, match="ModuleList"):
        nnmem.checkpoint_plan(model, "sqrt")
    with pytest.raises(nnmem.ConfigError, match="did you mean blocks.1"):
        nnmem.checkpoint_plan(model, "block.1")
    with pytest.raises(nnmem.ConfigError, match="every:K"):
        nnmem.checkpoint_plan(model, "every:0")
    with pytest.raises(nnmem.UnsupportedError, match="to checkpoint"):
        nnmem.checkpoint_plan(nn.Linear(2, 2), "blocks")


def test_a_plan_applied_keeps_names_pickles_and_is_undone(source: Path) -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    keys = list(model.state_dict())
    with checkpointed(model, "blocks"):
        assert "forward" in model[0].__dict__
        assert list(model.state_dict()) == keys
    assert "forward" not in model[0].__dict__
    nnmem.apply_checkpointing(model, "sqrt")
    copy = pickle.loads(pickle.dumps(model))
    x = torch.randn(3, 4, requires_grad=True)
    assert torch.allclose(copy(x), model(x))


def test_inference_and_in_place_plans_are_said_not_applied() -> None:
    from nnmem.cpu import describe
    from nnmem.frontends.pytorch.quantized import fbgemm_blocking

    result = nnmem.what_if("gpt", batch=2, mode="infer")
    # the MLP blocks' Dropout after a Linear; pruning, lower precision and quantization change inference too
    fbgemm = fbgemm_blocking(describe()) is not None  # quantize:int8 runs on FBGEMM (AVX2 and up)
    assert [r.technique for r in result.rows] == ["inplace", "prune:0.5", "prune-channels:0.5", "autocast:bf16",
                                                  "half:bf16", *(["quantize:int8"] if fbgemm else []),
                                                  "weight-only:int8", "weight-only:int4"]
    assert all("training only" in why or "ModuleList" in why or "AVX2" in why for _, why in result.skipped)
    vgg = nnmem.what_if("vgg", batch=2, optimizer="sgd")  # ReLU(inplace=True) after a checkpointed segment
    assert any("PyTorch refuses" in why for _, why in vgg.skipped)


def test_cli_prints_the_table_and_json() -> None:
    result = CliRunner().invoke(cli, ["whatif", "gpt", "--batch", "4", "--checkpoint", "blocks"])
    assert result.exit_code == 0, result.output
    assert "checkpoint:blocks" in result.stdout and "FLOPs" in result.stdout and "saved" in result.stdout
    result = CliRunner().invoke(cli, ["whatif", "gpt", "--batch", "4", "--checkpoint", "every:2", "--json"])
    data = json.loads(result.stdout)
    assert data["techniques"][0]["saved_bytes"] == data["baseline"]["peak_bytes"] - data["techniques"][0]["peak_bytes"]


@pytest.mark.parametrize("args, needle", [
    (["whatif", "gpt", "--checkpoint", "blocks.9"], "no module named 'blocks.9'"),
    (["whatif", "gpt", "--checkpoint", "sqrt"], "ModuleList"),
    (["whatif", "gpt", "--checkpoint", "every:x"], "every:K"),
    (["whatif", "keras_mlp", "--technique", "inplace"], "PyTorch models so far"),
])
def test_cli_bad_plans_are_one_line(args: list[str], needle: str) -> None:
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, (result.output, result.exception)
    assert result.stdout == "" and needle in result.stderr and len(result.stderr.splitlines()) == 1


@pytest.mark.parametrize("spec, optimizer", [("gpt", "adam"), ("resnet", "sgd")])
def test_accumulated_step_matches_the_measured_one(spec: str, optimizer: str) -> None:
    """Two micro-steps then the optimizer: the first micro-batch's gradients live through the second."""
    estimated = nnmem.estimate(spec, batch=2, optimizer=optimizer, accumulate=4)
    measured = nnmem.measure(spec, batch=2, optimizer=optimizer, accumulate=4)
    assert abs(estimated.peaks["allocator"] - measured.peaks["allocator"]) <= 0.01 * measured.peaks["allocator"]
    single = nnmem.measure(spec, batch=2, optimizer=optimizer)
    assert measured.peaks["allocator"] >= single.peaks["allocator"]


def test_accumulation_in_what_if_and_its_errors() -> None:
    result = nnmem.what_if("gpt", batch=8, optimizer="adam", techniques=["accumulate:4"])
    (row,) = result.rows
    assert row.report.batch == 2 and "4 micro-batches of 2" in row.description and result.saved(row) > 0
    assert row.flops == result.baseline.flops  # the same samples, so the same FLOPs
    with pytest.raises(nnmem.UnsupportedError, match="does not divide by 3"):
        nnmem.what_if("gpt", batch=8, techniques=["accumulate:3"])
    with pytest.raises(nnmem.ConfigError, match="accumulate:K"):
        nnmem.what_if("gpt", batch=8, techniques=["accumulate:1"])
    with pytest.raises(nnmem.ConfigError, match="positive integer"):
        nnmem.estimate("gpt", batch=2, accumulate=0)
    result = CliRunner().invoke(cli, ["estimate", "gpt", "--mode", "infer", "--accumulate", "2"])
    assert result.exit_code == 2 and "inference has no gradients" in result.stderr


def test_estimate_and_measure_take_a_checkpoint_plan() -> None:
    estimated = nnmem.estimate("gpt", batch=4, optimizer="adam", checkpoint="every:2")
    measured = nnmem.measure("gpt", batch=4, optimizer="adam", checkpoint="every:2")
    assert abs(estimated.peaks["allocator"] - measured.peaks["allocator"]) <= 0.01 * measured.peaks["allocator"]
    assert estimated.meta["checkpoint"] == "every:2"
    assert estimated.peaks["allocator"] < nnmem.estimate("gpt", batch=4, optimizer="adam").peaks["allocator"]
    result = CliRunner().invoke(cli, ["estimate", "gpt", "--batch", "4", "--checkpoint", "blocks"])
    assert result.exit_code == 0 and "checkpoint: blocks" in result.stdout
    with pytest.raises(nnmem.ConfigError, match="training step"):
        nnmem.estimate("gpt", batch=4, mode="infer", checkpoint="blocks")


def test_fewest_micro_steps_is_the_smallest_dividing_count_that_fits() -> None:
    from nnmem.whatif.accumulation import fewest_micro_steps

    for effective in range(1, 80):
        for plain in range(0, 12):
            for micro in range(0, 12):
                k = fewest_micro_steps(effective, plain, micro)
                fits = [c for c in range(1, effective + 1) if effective % c == 0
                        and (effective // c <= plain if c == 1 else effective // c <= micro)]
                assert k == (fits[0] if fits else 0), (effective, plain, micro)


def test_micro_batches_fit_the_budget_when_measured() -> None:
    """The split's step, run for real, is within the budget; the next coarser split is not, by its estimate."""
    budget = 2 * 2**20
    split = nnmem.micro_batches("mlp", batch=4096, budget=budget, optimizer="adam")
    assert split.micro_steps > 1 and 4096 % split.micro_steps == 0 and split.largest_plain < 4096
    measured = nnmem.measure("mlp", batch=split.micro_batch, optimizer="adam", accumulate=split.micro_steps)
    assert measured.peaks["allocator"] <= budget
    coarser = max(k for k in range(1, split.micro_steps) if 4096 % k == 0)
    over = nnmem.estimate("mlp", batch=4096 // coarser, optimizer="adam", accumulate=coarser).peaks["allocator"]
    assert over > budget
    result = CliRunner().invoke(cli, ["fit", "mlp", "--budget", "2MiB", "--effective-batch", "4096",
                                      "--optimizer", "adam"])
    assert result.exit_code == 0 and f"{split.micro_steps} micro-batches of {split.micro_batch}" in result.stdout


def test_a_factory_without_inputs_gets_them_from_input_shape(tmp_path: Path) -> None:
    path = tmp_path / "only.py"
    path.write_text("import torch\n\ndef make(batch):\n    return torch.nn.Sequential(torch.nn.Linear(8, 64), "
                    "torch.nn.ReLU(), torch.nn.Linear(64, 4))\n")
    result = nnmem.what_if(f"{path}:make", batch=16, input_shape=(8,), techniques=["accumulate:4", "inplace"])
    assert [r.technique for r in result.rows] == ["accumulate:4", "inplace"]
    assert result.rows[0].report.batch == 4 and result.saved(result.rows[0]) > 0


@pytest.mark.parametrize("spec, optimizer", [("resnet", "sgd"), ("lstm_lm", "rmsprop")])
def test_optimizer_in_backward_matches_the_measured_step(spec: str, optimizer: str) -> None:
    """Each parameter is updated and its gradient freed inside backward: never all gradients at once."""
    estimated = nnmem.estimate(spec, batch=4, optimizer=optimizer, optimizer_in_backward=True)
    measured = nnmem.measure(spec, batch=4, optimizer=optimizer, optimizer_in_backward=True)
    assert abs(estimated.peaks["allocator"] - measured.peaks["allocator"]) <= 0.01 * measured.peaks["allocator"]
    plain = nnmem.measure(spec, batch=4, optimizer=optimizer)
    assert measured.peaks["allocator"] < plain.peaks["allocator"]
    result = nnmem.what_if(spec, batch=4, optimizer=optimizer, techniques=["optimizer-in-backward"])
    assert result.rows[0].report.peaks == estimated.peaks and result.saved(result.rows[0]) > 0
    with pytest.raises(nnmem.ConfigError, match="without gradient accumulation"):
        nnmem.estimate(spec, batch=4, optimizer_in_backward=True, accumulate=2)
