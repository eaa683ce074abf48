"""The package's import graph has no cycles (imports inside functions count; annotations under
TYPE_CHECKING do not), and importing moegen needs none of the GPU or model libraries."""
import ast
import subprocess
import sys

from conftest import ROOT

PACKAGE = ROOT / "moegen"


def module_name(path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path) -> set[str]:
    """The moegen modules `path` imports, anywhere in it but under `if TYPE_CHECKING:`."""
    tree = ast.parse(path.read_text())
    skip = {id(n) for node in ast.walk(tree)
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.dump(node.test)
            for n in ast.walk(node)}
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("moegen")}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            if not base.startswith("moegen"):
                continue
            for alias in node.names:            # a name may be a module of the package
                sub = f"{base}.{alias.name}"
                path_of = ROOT / sub.replace(".", "/")
                found.add(sub if path_of.with_suffix(".py").exists() or path_of.is_dir()
                          else base)
    return found


def test_no_import_cycles():
    graph = {module_name(p): imports(p) for p in PACKAGE.rglob("*.py")}
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == "open":
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(n):] + [n]))
            if n not in state:
                visit(n)
        stack.pop()
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_importing_moegen_needs_no_gpu_or_model_library():
    code = ("import sys, moegen, moegen.checkpoint, moegen.expert_map, moegen.targets.compile; "
            "print(sorted(m for m in ('cupy', 'torch', 'transformers', 'networkx') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr
