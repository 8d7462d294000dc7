"""scope.py: the byte-level pre-filter parses only the files that may hold a model, and loses none.

``prefilter.Reach`` leaves out the importers of a staged file whose classes
cannot have the setter (their bases name no class with it), which is most
of what a single-file run used to parse. These tests build small model
trees around a real ``llama.py``, with subclasses reached through every
form of base the graph resolves, and traps the text filters must not fall
into: each single-file plan must equal the whole tree's, filtered. Then
the text facts themselves: ``importers`` finds every import form (over-
approximating is allowed, missing one is not), and class lines the filter
cannot read mean any name.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import release_package
from patchcraft.reading import prefilter
from patchcraft.reading.class_graph import ModelGraph
from patchcraft.planning.model_plans import plan_models, scan
from patchcraft.reading.prefilter import ModelTexts, import_map, importers
from patchcraft.planning.selection import plan_tree, select
from patchcraft.base.target import SglangTree

LLAMA_IMPORT = "from sglang.srt.models.llama import LlamaForCausalLM as Base, LlamaModel\n"
#: An inner model of its own, so that the subclass needs other sites than Llama (and is a plan of its own).
SUB_MODEL = """
class SubModel(LlamaModel):
    def forward(self, input_ids, positions, forward_batch):
        aux_hidden_states = []
        hidden_states, residual = self.embed_tokens(input_ids), None
        for i in range(len(self.layers)):
            if i in self.layers_to_capture:
                aux_hidden_states.append(hidden_states + residual)
            hidden_states, residual = self.layers[i](positions, hidden_states, forward_batch, residual)
        return hidden_states, aux_hidden_states

"""
INIT = """
    def __init__(self, config, quant_config=None, prefix=""):
        super().__init__(config, quant_config, prefix)
        self.model = SubModel(config, quant_config, prefix)
"""


def _tree(tmp_path: Path, files: dict[str, str]) -> SglangTree:
    """A tree of the 0.5.23 ``llama.py`` and ``files`` (model file stem -> source)."""
    models = tmp_path / "sglang" / "srt" / "models"
    models.mkdir(parents=True)
    shutil.copy(release_package("0.5.23") / "srt" / "models" / "llama.py", models / "llama.py")
    for stem, source in files.items():
        (models / f"{stem}.py").write_text(source)
    return SglangTree(package=tmp_path / "sglang", root=tmp_path)


def _single(tree: SglangTree, stem: str) -> SglangTree:
    return replace(tree, only_files=((tree.models_dir / f"{stem}.py").resolve(),))


def _labels(tree: SglangTree, stem: str) -> list[str]:
    """The single-file plans of ``stem``, checked equal to the whole tree's filtered."""
    single = _single(tree, stem)
    plans = plan_tree(single)
    assert plans == select(plan_models(scan(tree.models_dir)), single, ())
    return [p.label for p in plans]


SUBCLASSES = {
    "alias": LLAMA_IMPORT + SUB_MODEL + "class AliasForCausalLM(Base):" + INIT,
    "module_attr": "from sglang.srt.models import llama as L\nfrom sglang.srt.models.llama import LlamaModel\n"
    + SUB_MODEL
    + "class AttrForCausalLM(L.LlamaForCausalLM):"
    + INIT,
    "relative": "from .llama import LlamaForCausalLM, LlamaModel\n"
    + SUB_MODEL
    + "class RelForCausalLM(LlamaForCausalLM):"
    + INIT,
    # Through a class of the same file, which derives from Llama.
    "same_file": LLAMA_IMPORT + SUB_MODEL + "class Mid(Base):\n    pass\n\n\nclass SameForCausalLM(Mid):" + INIT,
    # Through another importer: chain.py's class derives from alias.py's.
    "chain": "from sglang.srt.models.alias import AliasForCausalLM, SubModel\n\n\nclass ChainForCausalLM(AliasForCausalLM):\n    pass\n",
    # A base list with a comment that hides a parenthesis: unreadable, so the file is loaded.
    "comment": "from .llama import LlamaForCausalLM, LlamaModel\n"
    + SUB_MODEL
    + "class CommentForCausalLM(LlamaModel  # not it ) :\n    , LlamaForCausalLM):"
    + INIT,
}


@pytest.mark.parametrize("stem", sorted(SUBCLASSES))
def test_a_subclass_in_an_importer_is_planned_from_the_base_file(tmp_path: Path, stem: str) -> None:
    tree = _tree(tmp_path, {"alias": SUBCLASSES["alias"], stem: SUBCLASSES[stem]})
    labels = _labels(tree, "llama")
    assert f"{stem}.{SUBCLASSES[stem].split('class ')[-1].split('(')[0]}" in labels
    assert "llama.LlamaForCausalLM" in labels


@pytest.mark.parametrize("renamed", [False, True], ids=["same-name", "renamed"])
def test_a_base_reached_through_a_module_that_imports_it(tmp_path: Path, renamed: bool) -> None:
    """``m.K`` with ``m`` a model file that only imports ``K``: the graph follows that import."""
    outer, inner = ("Outer", "Inner") if renamed else ("LlamaForCausalLM", "LlamaModel")
    names = "LlamaForCausalLM as Outer, LlamaModel as Inner" if renamed else "LlamaForCausalLM, LlamaModel"
    tree = _tree(
        tmp_path,
        {
            "reexport": f"from sglang.srt.models.llama import {names}\n",
            "user": "from sglang.srt.models import reexport as m\n"
            + SUB_MODEL.replace("(LlamaModel)", f"(m.{inner})")
            + f"class UserForCausalLM(m.{outer}):"
            + INIT,
        },
    )
    assert _labels(tree, "llama") == ["llama.LlamaForCausalLM", "user.UserForCausalLM"]


def test_an_import_cycle_leaves_no_subclass_out(tmp_path: Path) -> None:
    """b.py derives from a.py, which imports b.py back: a is undecided while b is judged."""
    tree = _tree(
        tmp_path,
        {
            "a": "from .llama import LlamaForCausalLM, LlamaModel\n"
            + SUB_MODEL
            + "class AForCausalLM(LlamaForCausalLM):"
            + INIT
            + "\n    def later(self):\n        from .b import helper\n",
            "b": "from .a import AForCausalLM, SubModel as Base\n\n\nclass SubModel(Base):\n    pass\n\n\n"
            "class BForCausalLM(AForCausalLM):" + INIT + "\n\ndef helper():\n    pass\n",
        },
    )
    assert _labels(tree, "llama") == ["a.AForCausalLM", "b.BForCausalLM", "llama.LlamaForCausalLM"]


def test_importers_that_only_use_layers_are_not_parsed(tmp_path: Path) -> None:
    tree = _tree(
        tmp_path,
        {
            "alias": SUBCLASSES["alias"],
            "layers": "from sglang.srt.models.llama import LlamaDecoderLayer as Layer, LlamaMLP\n\n\n"
            "class MyLayer(LlamaDecoderLayer):\n    pass\n\n\nclass MyMLP(LlamaMLP):\n    pass\n",
            "broken": "from sglang.srt.models.llama import LlamaMLP\n\n\nclass Fine(LlamaMLP):\n    pass\n\n\ndef broken(:\n",
        },
    )
    assert _labels(tree, "llama") == ["alias.AliasForCausalLM", "llama.LlamaForCausalLM"]
    texts = ModelTexts(prefilter.read_models(tree.models_dir))
    reach = prefilter.Reach(ModelGraph(models_dir=tree.models_dir), texts)
    reach.load({"llama", "alias", "layers", "broken"})
    assert set(reach.graph.loaded) == {"llama", "alias"}, (
        "files whose bases name no class with the setter need no parse"
    )


def test_real_importers_that_reuse_only_layers_are_left_out() -> None:
    """0.5.23: deepseek_v2.py's scope parsed 26 files before prefilter.Reach, llama.py's 17."""
    models = release_package("0.5.23") / "srt" / "models"
    texts = ModelTexts(prefilter.read_models(models))
    imports = prefilter.import_map(texts)
    for stem, most in (("deepseek_v2", 19), ("llama", 13)):
        reach = prefilter.Reach(ModelGraph(models_dir=models), texts)
        reach.load(prefilter.importers(imports, {stem}))
        assert sum(reach.graph.loaded.values()) <= most, stem


def test_classes_in_strings_are_no_classes(tmp_path: Path) -> None:
    fake = (
        LLAMA_IMPORT
        + 'EXAMPLE = """\nclass FakeForCausalLM(Base):\n    def set_eagle3_layers_to_capture(self, layer_ids):\n        pass\n"""\n'
        + 'OTHER = """\nclass Fake2(Base):\n    x = 1\n"""\n'
    )
    tree = _tree(tmp_path, {"fake": fake})
    assert _labels(tree, "llama") == ["llama.LlamaForCausalLM"]
    assert _labels(tree, "fake") == []


def test_unreadable_class_lines_mean_any_name() -> None:
    assert prefilter._class_headers(b"class A(B, C):\n    pass\nclass D:\n    pass\n") == ({b"A", b"D"}, [b"B, C"])
    assert prefilter._class_headers(b"\xef\xbb\xbfclass A(B):\n    pass\n") == ({b"A"}, [b"B"])
    for text in (
        b"class A(B  # see ) :\n    , C):\n    pass\n",  # a comment stops the base list early
        b"class A(f(g(x))):\n    pass\n",  # two levels of calls
        b"class A \\\n    (B):\n    pass\n",  # a backslash before the bases
        b'x = """\nclass of models\n"""\n',  # prose at column 0 in a string
        b"import torch\rclass A(B):\r    pass\r",  # lone carriage returns end lines too
        b"import torch\n\x0cclass A(B):\n    pass\n",  # a form feed before a top-level class
    ):
        assert prefilter._class_headers(text) is None, text
    assert ModelTexts({"a": b"class A(B  # ) :\n , C):\n    pass\n"}).mentions("a") is None
    assert ModelTexts({"a": b"class \\\n    A(B):\n    pass\n"}).class_names("a") is None


# -- which files import which ------------------------------------------------------------


def test_importers_follow_every_import_form() -> None:
    data = {
        "base": b"class Base: pass\n",
        "a": b"from sglang.srt.models.base import Base\n",
        "b": b"from .a import X\n",
        "c": b"from sglang.srt.models import (\n    other,\n    b,\n)\n",
        "d": b"from . import \\\n    c\n",
        "e": b"    import sglang.srt.models.d as dd\n",
        "f": b"from sglang.srt.models.base_extra import Y\nx = 'base'\n",
        "g": b"from torch import base\nimport base\n",
    }
    # Over-approximating is allowed (a needless parse); missing an importer is not.
    assert importers(import_map(ModelTexts(data)), {"base"}) == {"base", "a", "b", "c", "d", "e"}
    assert importers(import_map(ModelTexts(data)), {"a"}) == {"a", "b", "c", "d", "e"}


def test_importers_see_imports_anywhere_on_a_line_and_skip_comments() -> None:
    data = {
        "base": b"class Base: pass\n",
        "inline": b"if TYPE_CHECKING: from sglang.srt.models.base import Base\n",
        "relative": b"try: from \\\n    .base import Base\nexcept ImportError: pass\n",
        "late_names": b"if f(x): from sglang.srt.models import (  # (see\n    base,\n)\n",
        "comment": b"# Adapted from vllm/model_executor/models/base.py\nimport torch\n",
        "trailing": b"import torch  # like sglang.srt.models.base\n",
        "old_mac": b"# header\rfrom sglang.srt.models.base import Base\r",
    }
    assert importers(import_map(ModelTexts(data)), {"base"}) == {"base", "inline", "relative", "late_names", "old_mac"}
