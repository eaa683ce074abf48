import pytest

from conftest import EXAMPLES, ROOT, run_moegen


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_inspect_examples(path):
    proc = run_moegen("inspect", path, check=True)
    assert proc.stdout.startswith("module @")
    assert "func @" in proc.stdout


def test_opt_round_trips_a_file(tmp_path):
    first = run_moegen("opt", ROOT / "ir" / "moe_w4a16.mir", check=True).stdout
    f = tmp_path / "x.mir"
    f.write_text(first)
    assert run_moegen("opt", f, check=True).stdout == first


@pytest.mark.parametrize("args", [["--help"], ["inspect", "--help"], ["opt", "--help"]])
def test_help(args):
    proc = run_moegen(*args)
    assert proc.returncode == 0 and "usage: moegen" in proc.stdout


def test_bad_input_is_one_line_exit_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\npipeline: moe_w4a16\nmoe: {hidden_size: 100, intermediate_size: 128,"
                   " num_experts: 4, top_k: 2}\n")
    for args in (["inspect", bad], ["inspect", tmp_path / "none.yaml"],
                 ["opt", tmp_path / "none.mir"]):
        proc = run_moegen(*args)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "moe.hidden_size: 100" in run_moegen("inspect", bad).stderr
    mir = tmp_path / "bad.mir"
    mir.write_text((ROOT / "ir" / "msd_matmul.mir").read_text().replace("msd.unfold", "msd.unfld"))
    proc = run_moegen("opt", mir)
    assert proc.returncode == 2 and "unknown op 'msd.unfld'" in proc.stderr
    assert proc.stderr.count("\n") == 1
