"""Each shape of the coverage matrix, on small hand-written model trees and on real files.

The transforms' own EXAMPLES (one per forward shape) are tested by
tests/transforms/test_<name>.py. Here:

- the class graph: which files and classes a model's three edits land in
  (init and forward in other files, subclasses with their own forward,
  delegation, constructors chosen by parameter defaults or class
  attributes), and the precise reason when a model cannot be supported;
- the patched setter, executed: -1 is dropped before every id rule of the
  releases (+1, first-id and max heuristics, inner helpers), a pipeline
  of several stages refuses it, and without -1 nothing changes;
- the patched forward, executed with torch on CPU, for the collector
  kinds the releases use, including the real ``AuxHiddenStatePacker``;
- class slicing (libcst parses only the edited classes) keeps every byte.
"""

from __future__ import annotations

import ast
import importlib.util
import textwrap
import typing
from pathlib import Path
from types import SimpleNamespace

import libcst as cst
import pytest

from patchcraft.engine.tree_run import run
from patchcraft.planning.records import EditSite, ForwardParams, SetterParams
from patchcraft.engine.file_patch import patch_text, revert_text
from patchcraft.engine.records import Mode
from patchcraft.planning.selection import plan_tree
from patchcraft.base.status import ModelStatus
from patchcraft.transforms import accept_embedding_layer_id, capture_embedding_output
from patchcraft.transforms._base import FLAG, RemoveMarked
from patchcraft.transforms._slices import ClassSlices
from patchcraft.base.target import resolve_target

from conftest import release_package

try:
    import torch
except ImportError:  # only the forwards below need it: the graph, setter and slice tests run without
    torch = None
#: The tests that run a patched forward (torch on CPU).
needs_torch = pytest.mark.skipif(
    torch is None, reason="runs a patched forward: needs torch (pip install 'patchcraft[smoke]')"
)


# -- tiny model trees -------------------------------------------------------------


def make_tree(tmp_path: Path, files: dict[str, str]) -> Path:
    models = tmp_path / "sglang" / "srt" / "models"
    models.mkdir(parents=True)
    for name, code in files.items():
        (models / f"{name}.py").write_text(textwrap.dedent(code))
    return tmp_path / "sglang"


def plans_of(package: Path) -> dict:
    return {p.label: p for p in plan_tree(resolve_target(str(package)))}


def sites_of(plan) -> list[tuple[str, str, str]]:
    return sorted((s.kind, s.module, s.cls) for s in plan.sites)


INNER = """
class {name}(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.pp_group = get_pp_group()
        self.layers_to_capture = []

    def forward(self, input_ids, positions, forward_batch):
        hidden_states = self.embed_tokens(input_ids)
        residual = None
        aux_hidden_states = []
        for i in range(len(self.layers)):
            if i in self.layers_to_capture:
                aux_hidden_states.append(hidden_states + residual)
            hidden_states, residual = self.layers[i](hidden_states, residual)
        return hidden_states, aux_hidden_states
"""

SETTER = """
    def set_eagle3_layers_to_capture(self, layer_ids=None):
        if not self.pp_group.is_last_rank:
            return
        if layer_ids is None:
            self.model.layers_to_capture = [2, 4, 6]
        else:
            self.model.layers_to_capture = [val + 1 for val in layer_ids]
"""


def outer(name: str, inner: str, extra: str = "") -> str:
    return f"""
class {name}(nn.Module):
    def __init__(self, config):
        self.pp_group = get_pp_group()
        self.model = {inner}(config)
{extra}{SETTER}"""


def test_init_and_forward_in_another_file(tmp_path: Path) -> None:
    """qwen3 -> qwen2: the inner model's file has no setter of its own and is patched for it."""
    package = make_tree(
        tmp_path,
        {
            "base": INNER.format(name="BaseModel"),
            "child": "from sglang.srt.models.base import BaseModel\n" + outer("ChildForCausalLM", "BaseModel"),
        },
    )
    [plan] = plans_of(package).values()
    assert plan.label == "child.ChildForCausalLM"
    assert sites_of(plan) == [
        ("forward", "base", "BaseModel"),
        ("init", "base", "BaseModel"),
        ("setter", "child", "ChildForCausalLM"),
    ]
    result = run(resolve_target(str(package)), Mode.APPLY, runner=False)
    [model] = result.models
    assert model.status == ModelStatus.PATCHED and sorted(Path(f).name for f in model.files) == ["base.py", "child.py"]


def test_subclass_with_its_own_forward_is_its_own_model(tmp_path: Path) -> None:
    """Llama4: inherits the setter, builds an inner model whose forward is its own."""
    package = make_tree(
        tmp_path,
        {
            "llama": INNER.format(name="LlamaModel") + outer("LlamaForCausalLM", "LlamaModel"),
            "llama4": "from sglang.srt.models.llama import LlamaForCausalLM, LlamaModel\n"
            + INNER.format(name="Llama4Model").replace("(nn.Module)", "(LlamaModel)")
            + "\nclass Llama4ForCausalLM(LlamaForCausalLM):\n    def __init__(self, config):\n        self.model = Llama4Model(config)\n",
        },
    )
    plans = plans_of(package)
    assert set(plans) == {"llama.LlamaForCausalLM", "llama4.Llama4ForCausalLM"}
    assert sites_of(plans["llama4.Llama4ForCausalLM"]) == [
        ("forward", "llama4", "Llama4Model"),
        ("init", "llama4", "Llama4Model"),
        ("setter", "llama", "LlamaForCausalLM"),
    ]


def test_subclass_that_changes_nothing_is_no_model_of_its_own(tmp_path: Path) -> None:
    package = make_tree(
        tmp_path,
        {
            "llama": INNER.format(name="LlamaModel")
            + outer("LlamaForCausalLM", "LlamaModel")
            + "\nclass Phi(LlamaForCausalLM):\n    pass\n",
        },
    )
    assert set(plans_of(package)) == {"llama.LlamaForCausalLM"}


def test_delegation_patches_the_delegate(tmp_path: Path) -> None:
    """mllama4/kimi_k25: the setter hands the ids to language_model, imported inside __init__."""
    package = make_tree(
        tmp_path,
        {
            "text": INNER.format(name="TextModel") + outer("TextForCausalLM", "TextModel"),
            "vision": """
        class VisionForConditionalGeneration(nn.Module):
            def __init__(self, config):
                from sglang.srt.models.text import TextForCausalLM

                self.language_model = TextForCausalLM(config)

            def set_eagle3_layers_to_capture(self, layer_ids=None):
                if hasattr(self.language_model, "set_eagle3_layers_to_capture"):
                    self.language_model.set_eagle3_layers_to_capture(layer_ids)
        """,
        },
    )
    plan = plans_of(package)["vision.VisionForConditionalGeneration"]
    assert plan.delegate == "text.TextForCausalLM" and "setter: delegation" in plan.notes
    assert sites_of(plan) == sites_of(plans_of(package)["text.TextForCausalLM"])


def test_constructor_parameter_default_of_the_most_derived_class(tmp_path: Path) -> None:
    """qwen3_vl_moe passes its own ``language_model_cls`` default to Qwen3VL's __init__."""
    package = make_tree(
        tmp_path,
        {
            "vl": INNER.format(name="TextModel")
            + INNER.format(name="MoeTextModel")
            + """
class VLForConditionalGeneration(nn.Module):
    def __init__(self, config, language_model_cls=TextModel):
        self.pp_group = get_pp_group()
        self.model = language_model_cls(config)
"""
            + SETTER
            + """

class VLMoeForConditionalGeneration(VLForConditionalGeneration):
    def __init__(self, config, language_model_cls=MoeTextModel):
        super().__init__(config, language_model_cls)
""",
        },
    )
    plans = plans_of(package)
    assert ("forward", "vl", "TextModel") in sites_of(plans["vl.VLForConditionalGeneration"])
    assert ("forward", "vl", "MoeTextModel") in sites_of(plans["vl.VLMoeForConditionalGeneration"])


def test_class_attribute_constructor_through_a_module_import(tmp_path: Path) -> None:
    """qwen3_5_text: ``self.model = self.body_cls(...)`` with ``body_cls = qwen3_5.Body``."""
    text = (
        "from sglang.srt.models import body\n\n\n"
        "class TextForCausalLM(nn.Module):\n"
        "    body_cls = body.Body\n\n"
        "    def __init__(self, config):\n"
        "        self.pp_group = get_pp_group()\n"
        "        self.model = self.body_cls(config)\n"
    ) + SETTER
    package = make_tree(tmp_path, {"body": INNER.format(name="Body"), "text": text})
    plan = plans_of(package)["text.TextForCausalLM"]
    assert sites_of(plan) == [
        ("forward", "body", "Body"),
        ("init", "body", "Body"),
        ("setter", "text", "TextForCausalLM"),
    ]


def test_wrapper_forward_calling_super_is_followed(tmp_path: Path) -> None:
    """An EAGLE draft's model feeds fused inputs to ``super().forward``: the parent's forward captures."""
    package = make_tree(
        tmp_path,
        {
            "base": INNER.format(name="BaseModel") + outer("BaseForCausalLM", "BaseModel"),
            "draft": """
        from sglang.srt.models.base import BaseForCausalLM, BaseModel


        class DraftModel(BaseModel):
            def __init__(self, config):
                super().__init__(config)
                self.layers_to_capture = []

            def forward(self, input_ids, positions, forward_batch):
                return super().forward(input_ids, positions, forward_batch)


        class DraftForCausalLM(BaseForCausalLM):
            def __init__(self, config):
                super().__init__(config)
                self.model = DraftModel(config)
        """,
        },
    )
    plan = plans_of(package)["draft.DraftForCausalLM"]
    # BaseModel's own __init__ comes along: every class running the patched forward sets the flag.
    assert sites_of(plan) == [
        ("forward", "base", "BaseModel"),
        ("init", "base", "BaseModel"),
        ("init", "draft", "DraftModel"),
        ("setter", "base", "BaseForCausalLM"),
    ]


#: 0.5.13-0.5.20 Qwen3.5 under the Qwen3-VL setter: the forward captures flagged layers only.
FLAG_GATED_VL = """
class Body(nn.Module):
    def __init__(self, config):
        self.layers_to_capture = []

    def set_eagle3_layers_to_capture(self, layers_to_capture):
        self.layers_to_capture = layers_to_capture
        for layer_id in layers_to_capture:
            setattr(self.layers[layer_id], "_is_layer_to_capture", True)

    def forward(self, input_ids, positions, forward_batch):
        hidden_states = self.embed_tokens(input_ids)
        residual = None
        aux_hidden_states = []
        for layer in self.layers:
            hidden_states, residual = layer(
                hidden_states,
                residual,
                captured_last_layer_outputs=aux_hidden_states if getattr(layer, "_is_layer_to_capture", False) else None,
            )
        return hidden_states, aux_hidden_states
""" + outer("VLForConditionalGeneration", "Body")


@pytest.mark.parametrize(
    "files,reason",
    [
        pytest.param(
            {
                "ext": """
            class ExtForCausalLM(nn.Module):
                def __init__(self, config):
                    arch = self.get_arch(config)
                    self.model = arch(config=config)

                def set_eagle3_layers_to_capture(self, layer_ids=None):
                    self.model.set_eagle3_layers_to_capture(layer_ids)
            """
            },
            "built by `self.model = arch(...)` in ext.ExtForCausalLM.__init__: a class chosen at run time",
            id="inner-model-chosen-at-run-time",
        ),
        pytest.param(
            {
                "nextn": INNER.format(name="BaseModel")
                + outer("BaseForCausalLM", "BaseModel")
                + """
class NextNModel(nn.Module):
    def forward(self, input_ids, positions, forward_batch):
        return self.layer(self.embed_tokens(input_ids))


class NextNForCausalLM(BaseForCausalLM):
    def __init__(self, config):
        self.model = NextNModel(config)
"""
            },
            "nextn.NextNModel has no aux hidden-state capture at all",
            id="inner-model-without-capture",
        ),
        pytest.param(
            {"vl": FLAG_GATED_VL},
            "captures only layers flagged `_is_layer_to_capture`, which nothing sets in this tree",  # no version file: a tree
            id="flag-gated-forward-never-flagged",
        ),
        pytest.param(
            {
                "old": """
            class OldForCausalLM(nn.Module):
                def set_eagle3_layers_to_capture(self):
                    self.model.layers_to_capture = [2, 4, 6]
            """
            },
            "takes no layer_ids parameter (legacy setter)",
            id="legacy-setter",
        ),
        pytest.param(
            {
                "helper": """
            class HelperModel(nn.Module):
                def set_eagle3_layers_to_capture(self, layers_to_capture):
                    self.layers_to_capture = layers_to_capture
                    for layer_id in self.layers_to_capture:
                        setattr(self.layers[layer_id], "_is_layer_to_capture", True)
            """
            },
            "inner-model helper only:",
            id="helper-nothing-calls",
        ),
    ],
)
def test_unsupported_with_a_precise_reason(tmp_path: Path, files: dict, reason: str) -> None:
    results = run(resolve_target(str(make_tree(tmp_path, files))), Mode.VERIFY, runner=False).models
    # A class that captures nothing (a draft or NextN head, a helper nothing calls) is no EAGLE-3 target.
    expected = ModelStatus.NOT_APPLICABLE if reason in NO_TARGET else ModelStatus.UNSUPPORTED
    unsupported = [m for m in results if m.status == expected]
    assert len(unsupported) == 1 and reason in unsupported[0].message, [(m.model, m.status, m.message) for m in results]


NO_TARGET = ("nextn.NextNModel has no aux hidden-state capture at all", "inner-model helper only:")


def test_inner_helper_called_by_an_outer_setter_is_no_model_row(tmp_path: Path) -> None:
    """qwen2_moe: the inner model's own setter marks layers; only the outer model is a row."""
    inner = (
        INNER.format(name="MoeModel").replace(
            "        self.layers_to_capture = []\n",
            "        self.layers_to_capture = []\n",
        )
        + """
    def set_eagle3_layers_to_capture(self, layers_to_capture):
        self.layers_to_capture = layers_to_capture
"""
    )
    setter = SETTER.replace(
        "self.model.layers_to_capture = [val + 1 for val in layer_ids]",
        "self.model.set_eagle3_layers_to_capture([val + 1 for val in layer_ids])",
    )
    package = make_tree(tmp_path, {"moe": inner + outer("MoeForCausalLM", "MoeModel").replace(SETTER, setter)})
    plans = plans_of(package)
    assert set(plans) == {"moe.MoeForCausalLM"} and "setter: inner-helper" in plans["moe.MoeForCausalLM"].notes


def test_a_flag_only_the_dflash_setter_sets_is_said_so(tmp_path: Path) -> None:
    """0.5.13-0.5.20 Qwen3.5: the body's DFLASH setter flags layers, the EAGLE-3 path never does: say which path."""
    code = FLAG_GATED_VL.replace(
        "def set_eagle3_layers_to_capture(self, layers_to_capture):",
        "def set_dflash_layers_to_capture(self, layers_to_capture):",
    )
    [row] = [m for m in run(resolve_target(str(make_tree(tmp_path, {"vl": code}))), Mode.VERIFY, runner=False).models]
    assert row.status == ModelStatus.UNSUPPORTED, row
    assert (
        "which only Body.set_dflash_layers_to_capture (the DFLASH path) sets, never the EAGLE-3 setter" in row.message
    )
    assert "nothing sets" not in row.message


def test_flag_gated_forward_is_patched_when_the_setter_flags_through_the_helper(tmp_path: Path) -> None:
    """0.5.22+: the Qwen3-VL setter calls the body's helper, which flags the layers: patched."""
    code = FLAG_GATED_VL.replace(
        "self.model.layers_to_capture = [val + 1 for val in layer_ids]",
        "self.model.set_eagle3_layers_to_capture([val + 1 for val in layer_ids])",
    )
    [plan] = plans_of(make_tree(tmp_path, {"vl": code})).values()
    assert not plan.unsupported and "setter: inner-helper" in plan.notes
    assert ("forward", "vl", "Body") in sites_of(plan)


def test_setter_guards_the_pipeline_group_it_uses(tmp_path: Path) -> None:
    package = make_tree(
        tmp_path,
        {
            "a": INNER.format(name="AModel")
            + outer("AForCausalLM", "AModel").replace("self.pp_group.is_last_rank", "get_pp_group().is_last_rank"),
        },
    )
    [plan] = plans_of(package).values()
    [setter] = [s for s in plan.sites if s.kind == "setter"]
    assert setter.params_as(SetterParams).pp == "get_pp_group()"


# -- the patched setter, executed ------------------------------------------------------


def setter_of(code: str, cls: str):
    """The ``set_eagle3_layers_to_capture`` of ``cls`` in ``code``, as a plain function."""
    tree = ast.parse(code)
    [klass] = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls]
    [func] = [n for n in klass.body if isinstance(n, ast.FunctionDef) and n.name == "set_eagle3_layers_to_capture"]
    namespace: dict = {"Optional": typing.Optional, "List": typing.List}
    exec(compile(ast.Module(body=[func], type_ignores=[]), "setter", "exec"), namespace)
    return namespace["set_eagle3_layers_to_capture"]


def fake_model(num_layers: int = 8, stages: int = 1, patched_inner: bool = True):
    inner = SimpleNamespace(layers_to_capture=[], layers=[SimpleNamespace() for _ in range(num_layers)])
    if patched_inner:
        setattr(inner, FLAG, False)
    inner.set_eagle3_layers_to_capture = lambda ids: setattr(inner, "layers_to_capture", ids)
    group = SimpleNamespace(is_last_rank=True, is_first_rank=True, world_size=stages)
    config = SimpleNamespace(num_hidden_layers=num_layers)
    return SimpleNamespace(model=inner, pp_group=group, config=config, capture_aux_hidden_states=False)


SETTER_VARIANTS = {
    "plain +1": """
        if not self.pp_group.is_last_rank:
            return
        if layer_ids is None:
            self.model.layers_to_capture = [2, 4, 5]
        else:
            self.model.layers_to_capture = [val + 1 for val in layer_ids]
    """,
    "first-id heuristic": """
        if not self.pp_group.is_last_rank:
            return
        if layer_ids is None:
            self.model.layers_to_capture = [2, 4, 5]
        else:
            if layer_ids and layer_ids[0] == 1:
                self.model.layers_to_capture = [val + 1 for val in layer_ids]
            else:
                self.model.layers_to_capture = list(layer_ids)
    """,
    "max heuristic": """
        num_layers = self.config.num_hidden_layers
        if layer_ids is None:
            self.model.layers_to_capture = [2, 4, 5]
        else:
            if layer_ids and max(layer_ids) == num_layers:
                self.model.layers_to_capture = list(layer_ids)
            else:
                self.model.layers_to_capture = [val + 1 for val in layer_ids]
    """,
    "inner helper": """
        if layer_ids is None:
            self.model.set_eagle3_layers_to_capture([2, 4, 5])
        else:
            self.model.set_eagle3_layers_to_capture([val + 1 for val in layer_ids])
    """,
}

#: ids asked for -> (flag, layers_to_capture) after the patched setter, per variant.
EXPECTED = {
    "plain +1": {(-1, 2, 5): (True, [3, 6]), (2, 5): (False, [3, 6]), (-1,): (True, [])},
    # -1 means the +1 convention for the rest, whatever the release's test would choose (one meaning per config).
    "first-id heuristic": {
        (-1, 1, 5): (True, [2, 6]),
        (1, 5): (False, [2, 6]),
        (-1, 2, 5): (True, [3, 6]),
        (2, 5): (False, [2, 5]),
    },
    "max heuristic": {
        (-1, 2, 8): (True, [3, 9]),
        (-1, 2, 5): (True, [3, 6]),
        (2, 5): (False, [3, 6]),
        (2, 8): (False, [2, 8]),
    },
    "inner helper": {(-1, 2, 5): (True, [3, 6]), (2, 5): (False, [3, 6])},
}


def patched_setter(body: str):
    code = (
        "class M:\n    def set_eagle3_layers_to_capture(self, layer_ids=None):\n"
        + textwrap.indent(textwrap.dedent(body).strip("\n"), "        ")
        + "\n"
    )
    site = EditSite(
        kind="setter",
        path=Path("m.py"),
        module="m",
        cls="M",
        method="set_eagle3_layers_to_capture",
        params=SetterParams(target="self.model", param="layer_ids", pp="self.pp_group"),
    )
    after = accept_embedding_layer_id.apply(cst.parse_module(code), site)[0].code
    return setter_of(after, "M"), setter_of(code, "M")


@pytest.mark.parametrize("variant", SETTER_VARIANTS)
def test_patched_setter_drops_minus_one_before_the_release_rule(variant: str) -> None:
    patched, original = patched_setter(SETTER_VARIANTS[variant])
    for ids, (flag, layers) in EXPECTED[variant].items():
        model = fake_model()
        patched(model, list(ids))
        assert (getattr(model.model, FLAG), model.model.layers_to_capture) == (flag, layers), ids
        if -1 not in ids:  # without -1, exactly the release's behaviour
            reference = fake_model()
            original(reference, list(ids))
            assert reference.model.layers_to_capture == model.model.layers_to_capture
    model = fake_model()
    patched(model, None)  # the default call (graph capture in 0.4.10-0.5.10) keeps the flag off
    assert getattr(model.model, FLAG) is False and model.model.layers_to_capture == [2, 4, 5]


def test_patched_setter_refuses_minus_one_with_several_stages_or_an_unpatched_model() -> None:
    patched, _ = patched_setter(SETTER_VARIANTS["plain +1"])
    with pytest.raises(ValueError, match="single pipeline stage"):
        patched(fake_model(stages=2), [-1, 2])
    with pytest.raises(ValueError, match="run `patchcraft apply`"):
        patched(fake_model(patched_inner=False), [-1, 2])
    patched(fake_model(stages=2), [2, 5])  # no -1: no objection


def test_first_id_heuristic_needs_minus_one_dropped_first() -> None:
    """The reason the block goes on top: ``[-1, 1, 5][0] == 1`` is false, so the shift would be lost."""
    _, original = patched_setter(SETTER_VARIANTS["first-id heuristic"])
    model = fake_model()
    original(model, [-1, 1, 5])
    assert model.model.layers_to_capture == [-1, 1, 5]  # the release alone: no shift at all


REAL_SETTERS = [
    ("0.5.23", "deepseek_v2", "DeepseekV2ForCausalLM"),  # first-id heuristic
    ("0.5.23", "gpt_oss", "GptOssForCausalLM"),  # max heuristic
    ("0.5.10", "qwen2_moe", "Qwen2MoeForCausalLM"),  # inner helper
    ("0.5.10", "llama", "LlamaForCausalLM"),  # plain +1
    ("0.5.23", "exaone_moe", "ExaoneMoEForCausalLM"),  # get_parallel().pp_group guard
]


@pytest.mark.parametrize("version,stem,cls", REAL_SETTERS)
def test_real_patched_setters(version: str, stem: str, cls: str) -> None:
    """The setters of real releases, patched by the pipeline, then run on a fake model."""
    package = release_package(version)
    text = (package / "srt" / "models" / f"{stem}.py").read_text(encoding="utf-8")
    [plan] = [p for p in plan_tree(resolve_target(str(package)), [stem]) if p.cls == cls]
    sites = [s for s in plan.sites if s.path.name == f"{stem}.py"]
    patched = setter_of(patch_text(text, Path(f"{stem}.py"), sites).after, cls)
    model = fake_model(num_layers=8)
    namespace = patched.__globals__
    namespace["get_parallel"] = lambda: SimpleNamespace(pp_group=model.pp_group)
    patched(model, [-1, 1, 5])
    assert getattr(model.model, FLAG) is True
    assert model.model.layers_to_capture == [2, 6]
    model.pp_group.world_size = 2
    with pytest.raises(ValueError, match="single pipeline stage"):
        patched(model, [-1, 1, 5])


# -- the patched forward, executed ------------------------------------------------------


def aux_module(version: str):
    """The release's own ``sglang/srt/layers/aux_hidden_states.py`` (plain torch)."""
    path = release_package(version) / "srt" / "layers" / "aux_hidden_states.py"
    spec = importlib.util.spec_from_file_location(f"aux_{version.replace('.', '_')}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


class Layer:
    """A decoder layer that adds its index and, like fused add-norm kernels, updates the residual in place."""

    def __init__(self, index: int) -> None:
        self.index = index

    def __call__(self, hidden_states, residual, captured_last_layer_outputs=None):
        if residual is None:
            residual = hidden_states
        else:
            residual.add_(hidden_states)  # in place, as the fused kernels do
        if captured_last_layer_outputs is not None:
            captured_last_layer_outputs.append(residual.clone())
        return torch.full_like(residual, float(self.index + 1)), residual


PACKER_FORWARD = """
class Model:
    def forward(self, embedding):
        hidden_states = embedding
        residual = None
        aux_hidden_states = AuxHiddenStatePacker(len(self.layers_to_capture))
        for i in range(len(self.layers)):
            hidden_states, residual = self.layers[i](
                hidden_states,
                residual,
                captured_last_layer_outputs=aux_hidden_states if i in self.layers_to_capture else None,
            )
        return aux_hidden_states.finalize()
"""


def patched_forward(code: str) -> str:
    site = EditSite(
        kind="forward", path=Path("m.py"), module="m", cls="Model", method="forward", params=ForwardParams(gate="")
    )
    return capture_embedding_output.apply(cst.parse_module(code), site)[0].code


def call_forward(code: str, ids: list, flag: bool, namespace: dict):
    exec(compile(code, "m.py", "exec"), namespace)
    model = namespace["Model"]()
    model.layers = [Layer(i) for i in range(4)]
    model.layers_to_capture = ids
    setattr(model, FLAG, flag)
    return model.forward(torch.zeros(2, 3))


def run_forward(code: str, ids: list, flag: bool, namespace: dict):
    after = patched_forward(code)
    return call_forward(after, ids, flag, namespace), after


@needs_torch
@pytest.mark.parametrize("version", ["0.5.20", "0.5.23"])
def test_packer_counts_the_embedding(version: str) -> None:
    """AuxHiddenStatePacker.finalize() raises unless the count includes the embedding."""
    aux = aux_module(version)
    packed, after = run_forward(
        PACKER_FORWARD, [1, 3], True, {"AuxHiddenStatePacker": aux.AuxHiddenStatePacker, "torch": torch}
    )
    # hs[0] (the embedding, zeros), then the inputs of layers 1 and 3, each [2, 3]
    assert packed.shape == (2, 9)
    assert torch.equal(packed[:, :3], torch.zeros(2, 3))
    assert torch.equal(packed[:, 3:6], torch.full((2, 3), 1.0))
    # Without -1 the count is the release's own.
    packed, _ = run_forward(
        PACKER_FORWARD, [1, 3], False, {"AuxHiddenStatePacker": aux.AuxHiddenStatePacker, "torch": torch}
    )
    assert packed.shape == (2, 6)
    # Revert gives back the release's call exactly.
    assert revert_text(after, Path("m.py")) == PACKER_FORWARD


@needs_torch
def test_without_the_widened_count_the_packer_fails() -> None:
    """The check above is real: an embedding capture the count leaves out breaks the packer."""
    aux = aux_module("0.5.20")
    broken = patched_forward(PACKER_FORWARD).replace(' + int(getattr(self, "capture_embedding_for_eagle3", False))', "")
    with pytest.raises(RuntimeError):
        call_forward(broken, [1, 3], True, {"AuxHiddenStatePacker": aux.AuxHiddenStatePacker, "torch": torch})


BOUNDARY_FORWARD = """
class Model:
    def forward(self, embedding):
        hidden_states = embedding
        residual_batch.start(None)
        aux_hidden_states = AuxHiddenStateList()
        for i in range(len(self.layers)):
            hidden_states = self.layers[i].boundary(
                hidden_states,
                capture_output=aux_hidden_states.capture if i in self.layers_to_capture else None,
            )
        return aux_hidden_states
"""


class Stream:
    """The layer-boundary era: the residual lives in a stream, not in a local of forward."""

    def __init__(self) -> None:
        self.residual = None

    def start(self, forward_batch) -> None:
        self.residual = None

    def layer(self, index: int):
        def boundary(hidden_states, capture_output=None):
            if self.residual is None:
                self.residual = hidden_states  # layer 0 adopts the embedding tensor itself
            else:
                self.residual.add_(hidden_states)  # in place
            if capture_output is not None:
                capture_output(self.residual)
            return torch.full_like(hidden_states, float(index + 1))

        return SimpleNamespace(boundary=boundary)


@needs_torch
def test_layer_boundary_capture_uses_the_release_primitive() -> None:
    """0.5.23: no local ``residual`` (the seed's expression would raise NameError); ``aux.capture`` copies."""
    aux = aux_module("0.5.23")
    stream = Stream()
    after = patched_forward(BOUNDARY_FORWARD)
    assert "aux_hidden_states.capture(hidden_states)" in after and "residual is None" not in after
    exec(
        compile(after, "m.py", "exec"),
        namespace := {"AuxHiddenStateList": aux.AuxHiddenStateList, "residual_batch": stream},
    )
    model = namespace["Model"]()
    model.layers = [stream.layer(i) for i in range(4)]
    model.layers_to_capture = [1, 2]
    setattr(model, FLAG, True)
    states = model.forward(torch.zeros(2, 3))
    assert [float(s[0, 0]) for s in states] == [0.0, 1.0, 3.0]
    setattr(model, FLAG, False)
    assert len(model.forward(torch.zeros(2, 3))) == 2


@needs_torch
def test_list_collector_keeps_a_copy_of_the_embedding() -> None:
    code = PACKER_FORWARD.replace("AuxHiddenStatePacker(len(self.layers_to_capture))", "[]").replace(
        "return aux_hidden_states.finalize()", "return aux_hidden_states"
    )
    states, _ = run_forward(code, [1, 2], True, {"torch": torch})
    # Layer 0 adds into its residual (the embedding tensor itself) in place; the capture is a copy.
    assert torch.equal(states[0], torch.zeros(2, 3))
    assert [float(s[0, 0]) for s in states] == [0.0, 1.0, 3.0]
    states, _ = run_forward(code, [1, 2], False, {"torch": torch})
    assert len(states) == 2


# -- class slicing keeps every byte ---------------------------------------------------

SLICED = (
    "\ufeff# comment\r\n"
    "import torch\r\n\r\n"
    "@decorator\r\n"
    "class LlamaModel(nn.Module):\r\n"
    "    def __init__(self):\r\n"
    "        self.layers_to_capture = []\r\n"
    "    # trailing comment, still inside\r\n"
    "\x0c\r\n"
    "x = 1\r"
    "class LlamaForCausalLM(nn.Module):\r\n"
    "    def set_eagle3_layers_to_capture(self, layer_ids=None):\r\n"
    "        self.model.layers_to_capture = [val + 1 for val in layer_ids]"
)


def test_class_slices_splice_back_byte_for_byte() -> None:
    text = SLICED.removeprefix("\ufeff")
    slices = ClassSlices.of(text, {"LlamaModel", "LlamaForCausalLM"}, lambda segment, first: cst.parse_module(segment))
    assert slices is not None and slices.text() == text
    assert (
        ClassSlices.of(text + "\nclass LlamaModel:\n    pass\n", {"LlamaModel"}, lambda s, f: cst.parse_module(s))
        is None
    )


def test_patch_and_revert_through_slices_match_a_whole_module_edit() -> None:
    text = SLICED.removeprefix("\ufeff")
    sites = [
        EditSite(kind="init", path=Path("m.py"), module="m", cls="LlamaModel", method="__init__"),
        EditSite(
            kind="setter",
            path=Path("m.py"),
            module="m",
            cls="LlamaForCausalLM",
            method="set_eagle3_layers_to_capture",
            params=SetterParams(target="self.model", param="layer_ids", pp=""),
        ),
    ]
    after = patch_text(text, Path("m.py"), sites).after
    whole = cst.parse_module(text)
    for site in sites:
        from patchcraft.transforms import BY_KIND

        whole = BY_KIND[site.kind].apply(whole, site)[0]
    assert after == whole.code != text
    assert revert_text(after, Path("m.py")) == text == cst.parse_module(after).visit(RemoveMarked()).code


def test_messages_name_the_line_in_the_file_not_in_the_class() -> None:
    """Only the edited classes are parsed, padded to their place: 'line N' is the file's line."""
    site = EditSite(
        kind="setter",
        path=Path("m.py"),
        module="m",
        cls="LlamaForCausalLM",
        method="set_eagle3_layers_to_capture",
        params=SetterParams(target="self.model", param="layer_ids", pp=""),
    )
    text = "import torch\r\n\r\n\r\nclass Other:\r\n    pass\r\n\r\n\r\n" + (
        "class LlamaForCausalLM(nn.Module):\r\n"
        "    def set_eagle3_layers_to_capture(self, layer_ids=None):\r\n"
        "        self.model.layers_to_capture = [val + 1 for val in layer_ids]\r\n"
    )
    patched = patch_text(text, Path("m.py"), [site]).after
    assert "\r\n" in patched and "\n" not in patched.replace("\r\n", "")  # the file's line endings
    lines = patched.split("\r\n")
    at = next(i for i, line in enumerate(lines) if "-1 in layer_ids" in line)
    lines[at] = lines[at].replace("-1 in layer_ids", "-1 in list(layer_ids)")  # a hand edit of our block
    [error] = patch_text("\r\n".join(lines), Path("m.py"), [site]).errors.values()
    assert f"line {at + 1}:" in error  # the block's own first line (1-based): here the edited one
