"""Each package's `__init__` is its face: the names in its `__all__` import from it and are the objects their own
modules define; importing the faces pulls none of the heavy optional dependencies; and every memvir import the
README and docs show in their Python examples works."""

import ast
import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FACES = sorted(init.parent for init in (ROOT / "memvir").rglob("__init__.py"))


def _dotted(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def _definitions(package: Path) -> dict[str, list[str]]:
    """Each name the modules under `package` define at their top level (def, class or assignment; imports do not
    count), with the modules that define it."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef | ast.ClassDef):
                names = [node.name]
            elif isinstance(node, ast.Assign):
                names = [target.id for target in node.targets if isinstance(target, ast.Name)]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names = [node.target.id]
            else:
                continue
            for name in names:
                found.setdefault(name, []).append(_dotted(path))
    return found


@pytest.mark.parametrize("package", FACES, ids=_dotted)
def test_a_face_exports_the_objects_its_modules_define(package):
    face = importlib.import_module(_dotted(package))
    assert face.__all__, f"{face.__name__} exports nothing: give its __init__ an __all__"
    assert set(face.__all__) <= set(dir(face))
    definitions = _definitions(package)
    for name in face.__all__:
        definers = sorted(set(definitions.get(name, [])))
        assert len(definers) == 1, f"{face.__name__}.{name} is defined in {definers or 'none of its modules'}"
        assert getattr(face, name) is getattr(importlib.import_module(definers[0]), name), f"{face.__name__}.{name}"


HEAVY = ("faiss", "umap", "gradio", "plotly", "huggingface_hub")
IMPORT_FACES = f"""
import json, sys
import memvir, memvir.train, memvir.retrieval, memvir.models, memvir.memory, memvir.analysis, memvir.data
import memvir.integrations
faces = [name for name in {HEAVY!r} if name in sys.modules]
from memvir.train import Trainer
training = [name for name in {HEAVY[:4]!r} if name in sys.modules]
print(json.dumps({{"faces": faces, "training": training}}))
"""


@pytest.mark.slow
def test_the_faces_and_the_training_path_leave_the_heavy_dependencies_out():
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-c", IMPORT_FACES], capture_output=True, text=True, env=env,
                            cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr
    imported = json.loads(result.stdout.splitlines()[-1])
    assert imported == {"faces": [], "training": []}, f"imported: {imported}"


DOCUMENTS = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
PYTHON_BLOCK = re.compile(r"^```(?:python|py)\n(.*?)^```", re.MULTILINE | re.DOTALL)
MEMVIR_IMPORT = re.compile(r"^\s*(?:from memvir[\w.]* import [^#\n]+|import memvir[\w. ,]*)", re.MULTILINE)
MEMVIR_NAME = re.compile(r"\bmemvir(?:\.\w+)+")


def _shown(pattern: re.Pattern) -> list[tuple[str, str]]:
    return sorted({(path.relative_to(ROOT).as_posix(), match.group(0).strip())
                   for path in DOCUMENTS for block in PYTHON_BLOCK.findall(path.read_text())
                   for match in pattern.finditer(block)})


@pytest.mark.parametrize(("document", "statement"), _shown(MEMVIR_IMPORT))
def test_an_import_the_docs_show_works(document, statement):
    exec(statement, {})


@pytest.mark.parametrize(("document", "dotted"), _shown(MEMVIR_NAME))
def test_a_memvir_name_the_docs_show_exists(document, dotted):
    found = importlib.import_module("memvir")
    for part in dotted.split(".")[1:]:
        child = f"{found.__name__}.{part}"
        found = getattr(found, part) if hasattr(found, part) else importlib.import_module(child)
