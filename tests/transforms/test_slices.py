"""Method slices: libcst parses only the methods it edits, and the file comes back byte for byte.

``patch_text`` parses each edited method with its class header, padded to
its own lines, and splices the method's new text back into the file. Every
case here is checked against the same transforms run on the whole module
(libcst's own round trip is the reference), for idempotence and for a
byte-identical revert; each also checks which slices were taken, so that a
silent fallback to whole classes cannot pass for method slicing.
"""

from __future__ import annotations

import re
from pathlib import Path

import libcst as cst
import pytest

from patchcraft.engine.file_patch import patch_text, revert_text
from patchcraft.planning.records import EditSite, ForwardParams, SetterParams
from patchcraft.transforms import BY_KIND
from patchcraft.transforms.examples import capture_embedding_output as forward_examples
from patchcraft.transforms._base import AnchorError
from patchcraft.transforms._slices import ClassSlices

PATH = Path("m.py")
INIT = EditSite(kind="init", path=PATH, module="m", cls="LlamaModel", method="__init__")
FORWARD = EditSite(
    kind="forward",
    path=PATH,
    module="m",
    cls="LlamaModel",
    method="forward",
    params=ForwardParams(gate="self.pp_group.is_first_rank"),
)
SETTER = EditSite(
    kind="setter",
    path=PATH,
    module="m",
    cls="LlamaForCausalLM",
    method="set_eagle3_layers_to_capture",
    params=SetterParams(target="self.model", param="layer_ids", pp=""),
)
SITES = (INIT, FORWARD, SETTER)

#: The forward transform's own first example, as a method of a class of ours.
FORWARD_METHOD = forward_examples.EXAMPLES[0].before.split("\n", 1)[1]

#: Decorators, a header over several lines, a docstring and attributes before
#: the first method, comments between methods, a form feed, a backslash
#: continuation, and the edited setter as the last thing in the file with no
#: trailing newline.
SHAPE = (
    '''\
import torch


@register(
    "llama",
)
class LlamaModel(
    nn.Module,
    Mixin,
):  # a header over several lines
    # a comment before the body
    """Docstring."""

    attr = 1

    @torch.no_grad()
    # a comment between a decorator and its def
    def __init__(self, config):
        super().__init__()
        self.layers_to_capture = []
        self.width = \\
            1
        # a comment closing the method

    # a comment between methods

    def helper(self):
        return self.width
\x0c
'''
    + FORWARD_METHOD
    + """\
    # the class's trailing comment


def unrelated():
    pass


class LlamaForCausalLM(nn.Module):
    def forward(self):
        pass

    def set_eagle3_layers_to_capture(self, layer_ids=None):
        if layer_ids is None:
            self.model.layers_to_capture = [2, 30, 58]
        else:
            self.model.layers_to_capture = [val + 1 for val in layer_ids]"""
)


def _tabs(text: str) -> str:
    return re.sub(r"(?m)^((?:    )+)", lambda m: "\t" * (len(m.group(1)) // 4), text)


VARIANTS = {
    "lf": SHAPE,
    "lf-trailing-newline": SHAPE + "\n",
    "crlf": SHAPE.replace("\n", "\r\n"),
    "cr": SHAPE.replace("\n", "\r"),
    "tabs": _tabs(SHAPE),
    "two-space": SHAPE.replace("    ", "  "),
    "class-on-line-1": SHAPE.removeprefix("import torch\n\n\n"),
    "method-first-in-class": SHAPE.replace("    def forward(self):\n        pass\n\n", ""),
}


def _whole_module(text: str, sites) -> str:
    """The reference: the same transforms on the whole file, parsed in one piece."""
    module = cst.parse_module(text)
    for site in sites:
        module = BY_KIND[site.kind].apply(module, site)[0]
    return module.code


def _keys(text: str, sites) -> set:
    slices = ClassSlices.of_methods(
        text, [(s.cls, s.method) for s in sites], lambda code, first: cst.parse_module(code)
    )
    assert slices is not None
    return set(slices.modules)


def _apply_checked(text: str, sites) -> str:
    patch = patch_text(text, PATH, sites)
    assert not patch.errors, patch.errors
    assert patch.after == _whole_module(text, sites) != text
    again = patch_text(patch.after, PATH, sites)
    assert again.after == patch.after
    assert {o.status for o in again.outcomes.values()} == {"present"}
    assert revert_text(patch.after, PATH) == text
    return patch.after


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_method_slices_match_a_whole_module_edit(variant: str) -> None:
    text = VARIANTS[variant]
    assert _keys(text, SITES) == {(s.cls, s.method) for s in SITES}  # methods, not whole classes
    after = _apply_checked(text, SITES)
    others = {"crlf": after.replace("\r\n", ""), "cr": after.replace("\r", ""), "lf": after.replace("\n", "")}
    assert not re.search("[\r\n]", others.get(variant, others["lf"]))  # only the file's own line ending


def test_each_slice_holds_its_class_header_and_one_method_at_the_files_lines() -> None:
    slices = ClassSlices.of_methods(
        SHAPE, [(s.cls, s.method) for s in SITES], lambda code, first: cst.parse_module(code)
    )
    assert slices is not None
    code = slices.modules[("LlamaModel", "forward")].code
    file_lines, slice_lines = SHAPE.split("\n"), code.split("\n")
    start = file_lines.index("    def forward(self, input_ids, positions, forward_batch):")
    assert slice_lines[start] == file_lines[start]  # the method sits at its own line number
    assert "class LlamaModel(" in code and "Mixin," in code  # the whole header
    assert "def __init__" not in code and "def helper" not in code and "attr = 1" not in code


def test_a_method_defined_twice_is_still_named_as_two_definitions() -> None:
    text = SHAPE.replace("    # the class's trailing comment", "    def forward(self):\n        pass")
    assert _keys(text, SITES) == {"LlamaModel", (SETTER.cls, SETTER.method)}  # the class falls back whole
    patch = patch_text(text, PATH, SITES)
    expected = "LlamaModel.forward: expected one method forward() in class LlamaModel, found 2 definitions"
    assert expected in patch.errors[FORWARD.key]
    with pytest.raises(AnchorError, match="found 2 definitions"):
        BY_KIND["forward"].apply(cst.parse_module(text), FORWARD)
    assert INIT.key in patch.outcomes  # the other method of the class is still judged


NESTED = """\
class LlamaModel(nn.Module):
    def __init__(self):
        self.layers_to_capture = []

    if TYPE_CHECKING:
        def helper(self):
            pass
    else:
        def forward(self, input_ids):
            hidden_states = self.embed_tokens(input_ids)
            aux_hidden_states = []
            for i in range(3):
                if i in self.layers_to_capture:
                    aux_hidden_states.append(hidden_states)
                hidden_states = self.layers[i](hidden_states)
            return hidden_states, aux_hidden_states
"""


def test_a_method_nested_in_a_statement_falls_back_to_its_class() -> None:
    assert _keys(NESTED, [INIT, FORWARD]) == {"LlamaModel"}
    _apply_checked(NESTED, [INIT, FORWARD])


def test_missing_method_and_missing_class_keep_their_messages() -> None:
    gone = SHAPE.replace("def forward(self, input_ids,", "def other(self, input_ids,")
    [error] = patch_text(gone, PATH, [FORWARD]).errors.values()
    assert "expected one method forward() in class LlamaModel, found none" in error
    [error] = patch_text(
        SHAPE, PATH, [EditSite(kind="init", path=PATH, module="m", cls="Nope", method="__init__")]
    ).errors.values()
    assert "expected exactly one top-level class Nope, found no" in error


def test_a_nested_class_before_the_method_does_not_hide_it() -> None:
    text = SHAPE.replace("    attr = 1\n", "    class Config:\n        def forward(self):\n            pass\n")
    _apply_checked(text, SITES)
    assert "LlamaModel" not in _keys(text, SITES)


@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"])
def test_messages_name_the_files_own_line(newline: str) -> None:
    """A hand-changed block is named by its line in the file, whatever was cut away around it."""
    after = _apply_checked(SHAPE, SITES)
    lines = after.split("\n")
    flag = next(
        i
        for i, line in enumerate(lines)
        if line.endswith("self.capture_embedding_for_eagle3 = False") and "model" not in line
    )
    block = next(i for i, line in enumerate(lines) if "-1 in layer_ids" in line)
    lines[flag] = lines[flag].replace("= False", "= True")
    lines[block] = lines[block].replace("-1 in layer_ids", "-1 in list(layer_ids)")
    edited = newline.join(lines)
    patch = patch_text(edited, PATH, SITES)
    assert patch.outcomes[INIT.key].detail.startswith(f"line {flag + 1}:")
    assert patch.outcomes[SETTER.key].detail.startswith(f"line {block + 1}:")
    assert patch.after == edited  # a modified block is reported, not rewritten


def test_a_form_feed_does_not_shift_the_line_named() -> None:
    """str.splitlines() breaks at form feeds, ast does not: 'line N' counts as ast does."""
    text = SHAPE.replace(
        "        super().__init__()\n",
        "        super().__init__()\n\x0c\n        self.capture_embedding_for_eagle3 = 1\n",
    )
    line = text.split("\n").index("        self.capture_embedding_for_eagle3 = 1") + 1
    assert patch_text(text, PATH, [INIT]).outcomes[INIT.key].detail.startswith(f"line {line}:")


def test_revert_parses_only_the_marked_methods() -> None:
    """The runner's class has thousands of lines: revert cuts out the methods that hold patchcraft text."""
    from patchcraft.transforms._base import marked_parts

    after = _apply_checked(SHAPE, SITES)
    assert sorted(marked_parts(after)) == sorted((s.cls, s.method) for s in SITES)
    assert marked_parts(SHAPE) == []


def test_a_mark_outside_the_methods_reverts_its_whole_class() -> None:
    """A marked line in the class body (not in a method) is still removed: that class is parsed whole."""
    from patchcraft.transforms._base import marked_parts

    after = _apply_checked(SHAPE, SITES)
    marked = after.replace("    attr = 1\n", "    attr = 1\n    # patchcraft: added\n    extra = 2\n", 1)
    assert ("LlamaModel", None) in marked_parts(marked)
    assert ("LlamaModel", "__init__") not in marked_parts(marked)
    assert revert_text(marked, PATH) == SHAPE


def test_a_mark_outside_every_class_reverts_the_whole_module() -> None:
    from patchcraft.transforms._base import marked_parts

    after = _apply_checked(SHAPE, SITES)
    marked = after.replace(
        "def unrelated():\n    pass\n", "def unrelated():\n    # patchcraft: added\n    x = 1\n    pass\n"
    )
    assert marked_parts(marked) is None
    assert revert_text(marked, PATH) == SHAPE
