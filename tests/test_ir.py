import networkx as nx
import pytest

import moegen
from moegen.ir import Dim, DimError, ParseError, VerifyError, parse, parse_type
from moegen.resources import pipeline_file
from conftest import EXAMPLES, ROOT

MOE_TEXT = pipeline_file("moe_w4a16").read_text()
MSD_TEXT = pipeline_file("msd_matmul").read_text()
ENV_MOE = {"H": 256, "I": 128, "E": 8, "K": 2, "G": 128, "B": 16, "A": "f16"}
ENV_MSD = {"M": 2, "N": 64, "K": 512, "G": 128, "S": 3}


# --- dimensions and types ----------------------------------------------------------------------

@pytest.mark.parametrize("text", ["?", "2048", "H", "2*I", "H/G", "?*K", "?*K+B*E", "3*?-1",
                                  "K/G*N", "E*B+?*K"])
def test_dim_round_trip(text):
    d = Dim.parse(text)
    assert Dim.parse(str(d)) == d
    assert str(Dim.parse(str(d))) == str(d)


def test_dim_algebra_and_binding():
    assert Dim.parse("?*K+E*B") == Dim.parse("B*E+K*?")
    assert Dim.parse("H/G").eval({"H": 2048, "G": 128}) == 16
    assert str(Dim.parse("?*K+E*B").subs({"K": 8, "E": 128, "B": 32})) == "8*?+4096"
    assert Dim.parse("2*I") * 3 == Dim.parse("6*I")
    with pytest.raises(DimError, match="not an integer"):
        Dim.parse("H/G").subs({"H": 100, "G": 128})
    with pytest.raises(DimError):
        Dim.parse("2**H")


def test_types():
    t = parse_type("tensor<?xHx2*Ixf16>")
    assert str(t) == "tensor<?xHx2*Ixf16>" and t.rank == 3
    assert t.num_bytes({"?": 3, "H": 4, "I": 5}) == 3 * 4 * 10 * 2
    assert parse_type("tensor<8x64xi4>").num_bytes({}) == 256
    with pytest.raises(DimError, match="element type"):
        parse_type("tensor<4xf64>")


# --- printer and parser ------------------------------------------------------------------------

def modules():
    yield "moe raw", parse(MOE_TEXT)
    yield "msd raw", parse(MSD_TEXT)
    for path in EXAMPLES:
        yield path.stem, moegen.build(path)


@pytest.mark.parametrize("name,module", list(modules()), ids=lambda x: x if isinstance(x, str) else "")
def test_round_trip(name, module):
    module.verify()
    text = str(module)
    again = parse(text)
    again.verify()
    assert str(again) == text


def test_attributes_round_trip():
    text = ('module @m attributes {a = 1, b = -2, c = 2.5, d = 1e-05, e = "s p", f = [1, [2, 3]], '
            'g = {h = true, i = false}, j = 7.0} {\n'
            '  func @f(%x: tensor<4xf32>) -> (tensor<4xf32>) {\n'
            '    return(%x) : (tensor<4xf32>) -> ()\n  }\n}\n')
    m = parse(text)
    assert m.attrs == {"a": 1, "b": -2, "c": 2.5, "d": 1e-05, "e": "s p", "f": [1, [2, 3]],
                       "g": {"h": True, "i": False}, "j": 7.0}
    assert str(parse(str(m))) == str(m)


def test_symbols_are_bound_while_parsing():
    m = parse(MSD_TEXT, env=ENV_MSD)
    m.verify()
    loop = [op for op in m.function().ops if op.NAME == "msd.group_loop"][0]
    assert loop.attrs["groups"] == 4 and loop.attrs["group_size"] == 128
    assert str(m.function().args[2].type) == "tensor<4x64xf16>"


def test_dataflow_graph_is_derived():
    fn = moegen.build(EXAMPLES[0]).function()
    g = fn.graph()
    assert nx.is_directed_acyclic_graph(g)
    ops = [g.nodes[n]["op"].NAME for n in nx.topological_sort(g) if isinstance(n, int)]
    assert ops.index("moe.topk_softmax") < ops.index("moe.count") < ops.index("moe.aggregate")
    assert g.number_of_edges() >= 15


def test_region_reads_outer_values_in_graph():
    fn = parse(MSD_TEXT, env=ENV_MSD).function()
    g = fn.graph()
    loop = next(n for n in g if isinstance(n, int) and g.nodes[n]["op"].NAME == "msd.group_loop")
    preds = set(g.predecessors(loop))
    assert {"arg:x", "arg:w_q", "arg:scale"} <= preds


PARSE_ERRORS = [
    ("moe.count(%topk_ids)", "moe.counts(%topk_ids)", "unknown op 'moe.counts'"),
    ("moe.count(%topk_ids)", "moe.count(%nothing)", "%nothing is used before it is defined"),
    ("{num_experts = E}", "{num_experts = E", "expected"),
    ("tensor<Exi32>)\n", "tensor<Exf64>)\n", "element type"),
    ("%counts = moe.count", "%counts, %extra = moe.count", "2 result names but 1 result types"),
    ("(%router_logits) {k = K", "(%x) {k = K", "operand types"),
]


@pytest.mark.parametrize("old,new,message", PARSE_ERRORS, ids=[p[2][:30] for p in PARSE_ERRORS])
def test_parse_error_names_line(old, new, message):
    text = MOE_TEXT.replace(old, new, 1)
    assert text != MOE_TEXT
    with pytest.raises(ParseError) as err:
        parse(text, source="moe.mir")
    assert message in str(err.value)
    line = next(i for i, l in enumerate(text.splitlines(), 1) if new.split("\n")[0] in l)
    assert f"moe.mir:{line}:" in str(err.value)


def test_parse_error_on_missing_module():
    with pytest.raises(ParseError, match=r"<input>:1: expected 'module"):
        parse("func @f() -> () {\n}\n")


# one mutation per verifier rule: (pipeline, old, new, rule text)
VERIFY_RULES = [
    ("moe", "{k = K, renormalize = true}", "{k = 9, renormalize = true}", "must be <= the number of experts"),
    ("moe", "{k = K, renormalize = true}", "{k = 0, renormalize = true}", "must be >= 1"),
    ("moe", "{k = K, renormalize = true}", "{k = K, renormalize = 1}", "must be of kind bool"),
    ("moe", "{k = K, renormalize = true}", "{k = K, renorm = true}", "unknown attribute 'renorm'"),
    ("moe", "{k = K, renormalize = true}", "{renormalize = true}", "attribute 'k' is required"),
    ("moe", "{k = K, renormalize = true}", "{k = K, renormalize = true, one_launch = true}",
     "one_launch needs gemm_route"),
    ("moe", "{block = B} :", "{block = 0} :", "attribute block = 0 must be >= 1"),
    ("moe", "{block = B} :", "{block = B, block_buckets = [[64, 8], [8, 16]]} :", "ascend in max_tokens"),
    ("moe", "{block = B} :", "{block = B, block_buckets = [[64, 32]]} :", "every bucket's block"),
    ("moe", "topk = K, mul_topk_weights = false, group_size = G}",
     "topk = K, mul_topk_weights = false, group_size = G, epilogue = \"gelu\"}", "epilogue"),
    ("moe", "topk = 1, mul_topk_weights = true, group_size = G}",
     "topk = 1, mul_topk_weights = true, group_size = G, epilogue = \"swiglu\"}", "must not be applied before the SwiGLU"),
    ("moe", "{topk = K} :", "{topk = 1} :", "rows of down must equal tokens x topk"),
    ("moe", "    return(%out) : (tensor<?xHxA>) -> ()\n", "", "must end with return"),
    ("moe", "group_size = G}", "group_size = G, zero_points = true}", "takes 1 extra operand"),
    ("msd", "{steps = S}", "{steps = 4, factors = [1.0, 2.0, 3.0, 4.0]}", "must be in 1..3"),
    ("msd", "{steps = S}", "{steps = S, factors = [7.49, 14.98]}", "factors has 2 entries"),
    ("msd", "{steps = S}", "{steps = S, factors = [7.49, -1.0, 14.98]}", "must be positive"),
    ("msd", "{axis = 1, size = G}", "{axis = 2, size = G}", "axis = 2 must be in [0, 2)"),
    ("msd", "msd.yield(%acc_out) : (tensor<MxNxf32>) -> ()", "msd.yield(%acc_in, %acc_in) : (tensor<MxNxf32>, tensor<MxNxf32>) -> ()", "but the enclosing op declares"),
]


@pytest.mark.parametrize("pipe,old,new,rule", VERIFY_RULES, ids=[r[3][:40] for r in VERIFY_RULES])
def test_verifier_rule(pipe, old, new, rule):
    text, env = (MOE_TEXT, ENV_MOE) if pipe == "moe" else (MSD_TEXT, ENV_MSD)
    bad = text.replace(old, new, 1)
    assert bad != text
    module = parse(bad, source="x.mir", env=env)
    with pytest.raises(VerifyError) as err:
        module.verify()
    message = str(err.value)
    assert rule in message, message
    if "must end with" not in rule:
        assert message.startswith("line "), message


def test_verifier_reports_the_line_of_the_op():
    bad = MSD_TEXT.replace("{steps = S}", "{steps = 5, factors = [1.0, 1.0, 1.0, 1.0, 1.0]}")
    line = next(i for i, l in enumerate(bad.splitlines(), 1) if "msd.unfold" in l)
    with pytest.raises(VerifyError, match=rf"^line {line}: msd.unfold: attribute steps = 5"):
        parse(bad, env=ENV_MSD).verify()


def _op(module, name):
    return next(op for op in module.function().walk() if op.NAME == name)


def test_function_finds_an_op_by_name():
    fn = parse(MSD_TEXT, env=ENV_MSD).function()
    assert fn.op("msd.group_loop").NAME == "msd.group_loop"
    with pytest.raises(KeyError, match="has no moe.align op"):
        fn.op("moe.align")


@pytest.mark.parametrize("opname,index,type_text,rule", [
    ("moe.count", 0, "tensor<2xi32>", "result %counts must be tensor<8xi32>"),
    ("moe.swiglu", 0, "tensor<?*2x256xf16>", "result %activation must be tensor<2*?x128xf16>"),
    ("moe.topk_softmax", 1, "tensor<?x2xf16>", "result %topk_weights must be tensor<?x2xf32>"),
    ("msd.int_matmul", 0, "tensor<3x2x64xf32>", "result %y_int must be tensor<3x2x64xi32>"),
    ("msd.unfold", 1, "tensor<3x2x128xi8>", "result %a_unfold must be tensor<3x2x128xi4>"),
])
def test_verifier_result_types(opname, index, type_text, rule):
    module = parse(MOE_TEXT if opname.startswith("moe") else MSD_TEXT,
                   env=ENV_MOE if opname.startswith("moe") else ENV_MSD)
    op = _op(module, opname)
    op.results[index].type = parse_type(type_text)
    with pytest.raises(VerifyError, match=rf"^line \d+: {opname}: .*{rule.replace('*', '[*]').replace('?', '[?]')}"):
        module.verify()


def test_verifier_ssa_defined_once():
    module = parse(MSD_TEXT, env=ENV_MSD)
    _op(module, "msd.int_matmul").results[0].name = "x_g"
    with pytest.raises(VerifyError, match="%x_g is defined twice"):
        module.verify()


def test_verifier_operand_before_definition():
    module = parse(MOE_TEXT, env=ENV_MOE)
    ops = module.function().ops
    ops[0], ops[1] = ops[1], ops[0]
    with pytest.raises(VerifyError, match="operand %topk_ids is used before it is defined"):
        module.verify()


def test_verifier_operand_count():
    module = parse(MOE_TEXT, env=ENV_MOE)
    op = _op(module, "moe.swiglu")
    op.operands.append(op.operands[0])
    with pytest.raises(VerifyError, match=r"moe.swiglu: takes 1 operands \(gate_up\), got 2"):
        module.verify()


def test_verifier_gemm_shapes():
    module = parse(MOE_TEXT, env=ENV_MOE)
    gemm = _op(module, "moe.grouped_gemm_w4a16")
    gemm.operands[2].type = parse_type("tensor<8x4x256xf16>")
    with pytest.raises(VerifyError, match="w_scale %w13_scale must have shape 8x2x256"):
        module.verify()


def test_verifier_activation_types():
    """x, the scales and the outputs of the MoE ops share one element type, f16 or bf16."""
    module = parse(MOE_TEXT, env={**ENV_MOE, "A": "bf16"})
    module.verify()
    gemm = _op(module, "moe.grouped_gemm_w4a16")
    assert gemm.operands[0].type.dtype == "bf16"
    gemm.operands[2].type = parse_type("tensor<8x2x256xf16>")
    with pytest.raises(VerifyError, match="w_scale %w13_scale must have element type bf16"):
        module.verify()
    module = parse(MOE_TEXT, env=ENV_MOE)
    _op(module, "moe.grouped_gemm_w4a16").operands[0].type = parse_type("tensor<?x256xf32>")
    with pytest.raises(VerifyError, match="x %x must have element type f16 or bf16, got f32"):
        module.verify()


def test_built_module_carries_its_spec():
    from moegen.build import spec_of
    for path in EXAMPLES:
        spec = moegen.load_spec(path)
        again = spec_of(parse(str(moegen.build(spec))))
        assert again == spec and again.hash == spec.hash
    assert spec_of(parse(MOE_TEXT)) is None


def test_a_grouped_gemm_tile_is_verified():
    """The tile pass's tile of a grouped GEMM (moegen.tile_model.GemmTile, a list a field)
    verifies when parsed back; a field left out, a bucket too few, a split_many above its
    split_k, or a K split its kernel cannot run (the K-split CTA's k16 steps uneven over its
    CTAs and warps, or a split of it per call; the wide CTA's K ranges not whole groups) is one
    error naming the attribute."""
    import re

    from moegen.passes.pipelines import lower
    spec = moegen.load_spec(ROOT / "examples" / "mixtral-8x7b.yaml")
    text = str(lower(spec, "cuda", "fuse-align,fuse-swiglu,tile", tuning=None)[0])
    parse(text).verify()
    split_many = re.search(r"split_many = \[(\d+)", text)
    for edit, says in (
            (lambda t: re.sub(r", tall = \[[^\]]*\]", "", t, count=1), "tile lacks tall"),
            (lambda t: re.sub(r"stages = \[(\d+), ", r"stages = [", t, count=1),
             "tile fields have"),
            (lambda t: t.replace(split_many.group(0), "split_many = [64", 1),
             "split_many <= split_k"),
            # Mixtral's gate/up: K = 4096 (256 k16 steps, 32 groups); buckets 2 and 3 the
            # K-split CTA of 4 warps and 16 k a stage, bucket 4 the wide CTA
            (lambda t: t.replace("split_k = [1, 1, 1,", "split_k = [1, 1, 3,", 1),
             "K-split CTA's K = 4096 must split evenly into split_k 3 x 4 warps"),
            (lambda t: t.replace("split_k = [1, 1, 1,", "split_k = [1, 2, 1,", 1),
             r"one split for every call \(split_many 1\)"),
            (lambda t: t.replace("split_k = [1, 1, 1, 1,", "split_k = [1, 1, 1, 3,", 1),
             "wide CTA's K = 4096 must split into split_k 3 .* whole groups of 128")):
        bad = edit(text)
        assert bad != text
        with pytest.raises(VerifyError, match=f"moe.grouped_gemm_w4a16: attribute .*{says}"):
            parse(bad).verify()
