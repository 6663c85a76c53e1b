"""Reading XLA's HLO text: computations in schedule order, aliases, shapes and convolution geometry."""

from __future__ import annotations

from nnmem.frontends.keras.jax import hlo

# Lines as ``compiled.as_text()`` writes them (keras_two_branch_cnn inference, jax 0.10.2), shortened.
TWO_BRANCHES = (
    "HloModule jit_predict_step, is_scheduled=true, input_output_alias={ {1}: (0, {}, may-alias), "
    "{2}: (1, {}, may-alias) }, entry_computation_layout={(f32[3,3,3,16]{3,2,1,0})->f32[8,32,32,16]{3,2,1,0}}\n"
    "\n"
    "ENTRY %main.7 (state_0__0_.1: f32[3,3,3,16], state_0__2_.1: f32[5,5,3,16], data_0_.1: f32[8,32,32,3]) -> "
    "(f32[8,32,32,16], f32[3,3,3,16], f32[5,5,3,16]) {\n"
    "  %state_0__0_.1 = f32[3,3,3,16]{3,2,1,0} parameter(0)\n"
    "  %state_0__2_.1 = f32[5,5,3,16]{3,2,1,0} parameter(1)\n"
    "  %data_0_.1 = f32[8,32,32,3]{3,2,1,0} parameter(2)\n"
    "  %conv_general_dilated.3 = f32[8,32,32,16]{3,2,1,0} convolution(%data_0_.1, %state_0__0_.1), "
    "window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f, "
    'metadata={op_name="jit(predict_step)/branch_a/conv_general_dilated" stack_frame_id=32}\n'
    "  %conv_general_dilated.4 = f32[8,32,32,16]{3,2,1,0} convolution(%data_0_.1, %state_0__2_.1), "
    "window={size=5x5 pad=2_2x2_2}, dim_labels=b01f_01io->b01f, "
    'metadata={op_name="jit(predict_step)/branch_b/conv_general_dilated" stack_frame_id=32}\n'
    "  ROOT %tuple = (f32[8,32,32,16]{3,2,1,0}, f32[3,3,3,16]{3,2,1,0}, f32[5,5,3,16]{3,2,1,0}) "
    "tuple(%conv_general_dilated.3, %state_0__0_.1, %state_0__2_.1)\n"
    "}\n"
)


def test_parse_reads_the_entry_in_schedule_order_and_the_aliases() -> None:
    module = hlo.parse(TWO_BRANCHES)
    assert module.entry == "main.7"
    assert [i.opcode for i in module.entry_body] == ["parameter"] * 3 + ["convolution"] * 2 + ["tuple"]
    assert module.aliases == 2
    assert module.entry_body[-1].root and not module.entry_body[0].root
    assert module.types["data_0_.1"].startswith("f32[8,32,32,3]")


def test_operands_ignore_the_metadata() -> None:
    conv = hlo.parse(TWO_BRANCHES).entry_body[3]
    assert conv.operands == ["data_0_.1", "state_0__0_.1"]
    assert conv.called is None


def test_shape_and_bytes() -> None:
    assert hlo.shape("bf16[2,3]{1,0}") == ([2, 3], 2)
    assert hlo.nbytes("(f32[8,32]{1,0}, s8[4])") == 8 * 32 * 4
    assert hlo.shape("f32[]") == ([], 4)
    assert hlo.nbytes("token[]") is None


def test_convolution_geometry() -> None:
    module = hlo.parse(TWO_BRANCHES)
    c = hlo.conv(module.entry_body[4], module.types)
    assert c is not None
    assert (c.lhs, c.lhs_labels, c.out, c.out_labels) == ([8, 32, 32, 3], "b01f", [8, 32, 32, 16], "b01f")
    assert (c.window, c.pads, c.groups, c.item) == ([5, 5], [4, 4], 1, 4)
    assert (c.dim("b"), c.dim("f")) == (8, 3)


def test_through_reinterpret_finds_the_producer() -> None:
    body = hlo.parse(
        "ENTRY %f (p: f32[4,8]) -> f32[32] {\n"
        "  %p = f32[4,8]{1,0} parameter(0)\n"
        "  %e = f32[4,8]{1,0} exponential(%p)\n"
        "  %t = f32[8,4]{0,1} transpose(%e), dimensions={1,0}\n"
        "  ROOT %b = f32[32]{0} bitcast(%t)\n"
        "}\n").entry_body
    named = {i.name: i for i in body}
    assert hlo.through_reinterpret("b", named) is named["e"]
    assert hlo.only_reinterpreted(named["e"], body)
    assert not hlo.only_reinterpreted(named["b"], body)  # no users
