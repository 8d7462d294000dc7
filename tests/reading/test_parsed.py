"""reading.parsed: one parse per text per process, bounded; the statements-only walk finds what ast.walk finds."""

from __future__ import annotations

import ast

import pytest

from patchcraft.reading import parsed
from patchcraft.reading.parsed import parse_cst, parse_python, statements

SOURCE = """
import os
from a import b

class C(Base):
    from vllm.model_executor.models.llama import LlamaModel as Inner

    def forward(self, x):
        if x:
            from .x import y
        try:
            import z
        except ImportError:
            from w import v
        else:
            pass
        finally:
            from q import r
        for i in range(3):
            def inner():
                from deep import er
        with open(x) as f:
            import g
        match x:
            case 1:
                from m import n
        return lambda: x


def top():
    while True:
        import last
"""


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch):
    parsed.forget()
    yield
    parsed.forget()


def test_the_same_text_is_parsed_once() -> None:
    first = parse_python(SOURCE)
    again = parse_python("".join(list(SOURCE)))  # an equal text, another string object (a second read of a file)
    assert again is first
    assert parsed.kept() == (1, len(SOURCE))
    assert parse_python(SOURCE + "\n") is not first  # a changed byte is a new tree


def test_the_kept_source_is_bounded_oldest_first(monkeypatch: pytest.MonkeyPatch) -> None:
    texts = [SOURCE + f"\nx = {i}\n" for i in range(3)]
    monkeypatch.setattr(parsed, "LIMIT", 2 * len(texts[0]))  # two texts fit, not three
    trees = [parse_python(t) for t in texts[:2]]
    assert parse_python(texts[0]) is trees[0]  # texts[0] is now the most recently used
    parse_python(texts[2])
    count, size = parsed.kept()
    assert count == 2 and size <= parsed.LIMIT
    assert parse_python(texts[0]) is trees[0]  # kept
    assert parse_python(texts[1]) is not trees[1]  # the least recently used went first


def test_a_syntax_error_is_raised_and_nothing_kept() -> None:
    with pytest.raises(SyntaxError):
        parse_python("def broken(:\n")
    assert parsed.kept() == (0, 0)


def test_statements_are_ast_walks_statements_in_its_order() -> None:
    tree = ast.parse(SOURCE)
    holders = (ast.stmt, ast.excepthandler, ast.match_case)
    walked = [n for n in ast.walk(tree) if isinstance(n, holders)]
    found = list(statements(tree.body))
    assert found == walked
    imports = [n for n in found if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert len(imports) == 11  # every import, the nested ones too
    assert not [n for n in found if isinstance(n, ast.expr)]


# -- libcst's trees --------------------------------------------------------------------------

METHOD = "class _:\n    def forward(self, x):\n        h = self.embed(x)\n        for layer in self.layers:\n            h = layer(h)\n        return h\n"


def test_the_same_text_is_one_libcst_tree() -> None:
    first = parse_cst(METHOD)
    assert parse_cst("".join(list(METHOD))) is first
    assert parsed.kept_cst() == (1, len(METHOD))
    assert parse_cst(METHOD + "\n") is not first
    assert first.code == METHOD


def test_the_kept_libcst_source_is_bounded_oldest_first(monkeypatch: pytest.MonkeyPatch) -> None:
    texts = [METHOD + f"x = {i}\n" for i in range(3)]
    monkeypatch.setattr(parsed, "CST_LIMIT", 2 * len(texts[0]))
    trees = [parse_cst(t) for t in texts[:2]]
    assert parse_cst(texts[0]) is trees[0]
    parse_cst(texts[2])
    count, size = parsed.kept_cst()
    assert count == 2 and size <= parsed.CST_LIMIT
    assert parse_cst(texts[0]) is trees[0]
    assert parse_cst(texts[1]) is not trees[1]


def test_a_libcst_syntax_error_is_raised_and_nothing_kept() -> None:
    import libcst

    with pytest.raises(libcst.ParserSyntaxError):
        parse_cst("def broken(:\n")
    assert parsed.kept_cst() == (0, 0)


def test_a_transform_leaves_the_kept_tree_as_it_was() -> None:
    """The same text patched twice gives the same result, and every kept tree still prints the text it was parsed
    from: the transforms build new trees (libcst's are immutable), so a tree shared between commands is unchanged."""
    from patchcraft.engine.file_patch import patch_text
    from patchcraft.transforms.examples import capture_embedding_output as examples

    example = examples.EXAMPLES[0]
    site = example.site
    first = patch_text(example.before, site.path, [site])
    kept = dict(parsed._CST)
    assert kept, "patch_text parsed nothing through parse_cst"
    assert not first.errors and first.after == example.after
    assert patch_text(example.before, site.path, [site]).after == first.after
    assert parsed.kept_cst()[0] == len(kept)  # the second patch parsed nothing new
    assert all(module.code == source for source, module in kept.items())
