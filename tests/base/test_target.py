"""base.target: what the user pointed at, resolved into one SGLang package tree (or one clear line why not).

Trees are laid out here (a models directory with one file importing
``sglang.srt``); one check reads a real release's version.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path

import pytest

from conftest import release_package
from patchcraft.base.errors import PatchcraftError
from patchcraft.base.target import SglangTree, resolve_target

MODEL = b"from sglang.srt.layers.linear import RowParallelLinear\n\nclass LlamaForCausalLM:\n    pass\n"


def package_at(package: Path, version: str | None = "0.5.10", model: bytes = MODEL) -> Path:
    """``package/srt/models/llama.py`` (and ``version.py``); the package directory."""
    models = package / "srt" / "models"
    models.mkdir(parents=True)
    (models / "llama.py").write_bytes(model)
    (package / "__init__.py").write_text("", encoding="utf-8")
    if version is not None:
        (package / "version.py").write_text(f'__version__ = "{version}"\n', encoding="utf-8")
    return package


def refused(target: str | Path) -> str:
    with pytest.raises(PatchcraftError) as caught:
        resolve_target(str(target))
    message = str(caught.value)
    assert "\n" not in message and message.startswith(str(target)), message
    return message


# -- directories ------------------------------------------------------------------------


def test_a_package_directory(tmp_path: Path) -> None:
    package = package_at(tmp_path / "site" / "sglang")
    tree = resolve_target(str(package))
    assert tree == SglangTree(package=package, root=package.parent)  # diff paths start at sglang/
    assert tree.models_dir == package / "srt" / "models" and tree.executor_dir == package / "srt" / "model_executor"
    assert tree.only_files == ()


def test_a_checkout_root_with_python_sglang(tmp_path: Path) -> None:
    checkout = tmp_path / "fork"
    package = package_at(checkout / "python" / "sglang")
    tree = resolve_target(str(checkout))
    assert (tree.package, tree.root, tree.only_files) == (package, checkout, ())
    assert tree.relative(package / "srt" / "models" / "llama.py") == "python/sglang/srt/models/llama.py"


def test_the_package_of_a_checkout_keeps_the_checkout_as_root(tmp_path: Path) -> None:
    checkout = tmp_path / "fork"
    package = package_at(checkout / "python" / "sglang")
    tree = resolve_target(str(package))
    assert (tree.package, tree.root) == (package, checkout)


def test_a_directory_holding_the_package(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    package = package_at(site / "sglang")
    tree = resolve_target(str(site))
    assert (tree.package, tree.root) == (package, site)
    assert tree.relative(package / "srt" / "models" / "llama.py") == "sglang/srt/models/llama.py"


def test_the_models_directory(tmp_path: Path) -> None:
    package = package_at(tmp_path / "site" / "sglang")
    tree = resolve_target(str(package / "srt" / "models"))
    assert (tree.package, tree.root) == (package, tmp_path / "site")


def test_a_package_under_another_name_must_import_sglang(tmp_path: Path) -> None:
    renamed = package_at(tmp_path / "vendored_sglang")
    assert resolve_target(str(renamed)).package == renamed
    other = package_at(tmp_path / "other", model=b"import torch\n\nclass Model:\n    pass\n")
    message = refused(other)
    assert "not an SGLang tree" in message and "holds no model file importing sglang.srt" in message


def test_a_directory_that_is_no_tree(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    assert (
        refused(tmp_path / "empty")
        == f"{tmp_path / 'empty'}: not an SGLang tree (no srt/models, python/sglang or sglang/ inside)"
    )


# -- model files ------------------------------------------------------------------------


def test_a_model_file_in_a_package(tmp_path: Path) -> None:
    package = package_at(tmp_path / "site" / "sglang")
    model = package / "srt" / "models" / "llama.py"
    tree = resolve_target(str(model))
    assert (tree.package, tree.root, tree.only_files) == (package, tmp_path / "site", (model,))


def test_a_model_file_in_a_checkout(tmp_path: Path) -> None:
    checkout = tmp_path / "fork"
    package = package_at(checkout / "python" / "sglang")
    model = package / "srt" / "models" / "llama.py"
    tree = resolve_target(str(model))
    assert (tree.package, tree.root, tree.only_files) == (package, checkout, (model,))


def test_a_relative_model_path_is_resolved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = package_at(tmp_path / "site" / "sglang")
    monkeypatch.chdir(package / "srt")
    assert resolve_target("models/llama.py").only_files == (package / "srt" / "models" / "llama.py",)


def test_a_model_file_in_a_loose_models_directory(tmp_path: Path) -> None:
    models = tmp_path / "copy" / "models"
    models.mkdir(parents=True)
    (models / "llama.py").write_bytes(MODEL)
    tree = resolve_target(str(models / "llama.py"))
    assert tree.root == models and tree.only_files == (models / "llama.py",)


def test_a_python_file_outside_any_tree(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    loose = tmp_path / "models" / "x.py"
    loose.write_bytes(b"import torch\n")
    assert refused(loose) == f"{loose}: not inside an SGLang tree (expected .../sglang/srt/models/<file>.py)"


def test_a_file_that_is_not_python(tmp_path: Path) -> None:
    package = package_at(tmp_path / "sglang")
    notes = package / "srt" / "models" / "README.md"
    notes.write_text("hi\n")
    assert refused(notes) == f"{notes}: not a Python file; expected an SGLang model file"


def test_an_empty_or_binary_model_file_is_refused_with_its_reason(tmp_path: Path) -> None:
    package = package_at(tmp_path / "sglang")
    empty = package / "srt" / "models" / "empty.py"
    empty.write_bytes(b"")
    assert "file is empty" in refused(empty)
    binary = package / "srt" / "models" / "binary.py"
    binary.write_bytes(b"x = 1\x00\n")
    assert "binary file" in refused(binary)


# -- what is not there ------------------------------------------------------------------


def test_a_missing_path(tmp_path: Path) -> None:
    assert refused(tmp_path / "absent") == f"{tmp_path / 'absent'}: no such file or directory"


def test_a_broken_symlink(tmp_path: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "absent")
    assert refused(link) == f"{link}: broken symlink"


def test_no_target_finds_the_installed_package_without_importing_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = package_at(tmp_path / "site" / "sglang")
    not_a_tree = tmp_path / "elsewhere" / "sglang"
    not_a_tree.mkdir(parents=True)
    spec = importlib.machinery.ModuleSpec("sglang", None, is_package=True)
    spec.submodule_search_locations = [str(not_a_tree), str(package)]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: spec if name == "sglang" else None)
    tree = resolve_target(None)
    assert (tree.package, tree.root) == (package, tmp_path / "site")


@pytest.mark.parametrize("found", [None, "raises"])
def test_no_target_and_no_installed_sglang(monkeypatch: pytest.MonkeyPatch, found: str | None) -> None:
    def find_spec(name: str) -> None:
        if found == "raises":
            raise ValueError("sglang.__spec__ is None")
        return None

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(PatchcraftError) as caught:
        resolve_target(None)
    assert str(caught.value) == "no installed sglang found; pass a TARGET, or run `patchcraft fetch VERSION` first"


# -- the tree's version, its boundary, its relative paths ------------------------------


def test_the_version_is_read_from_the_first_file_that_has_one(tmp_path: Path) -> None:
    package = package_at(tmp_path / "sglang", version=None)
    tree = SglangTree(package=package, root=tmp_path)
    assert tree.version == "unknown"
    (package / "__init__.py").write_text('__version__ = "0.1.0"\n')
    assert tree.version == "0.1.0"
    (package / "version.py").write_text("__version__ = '0.2.0'\n")
    assert tree.version == "0.2.0"
    (package / "_version.py").write_text('__version__ = version = "0.3.0.post1"\n')  # setuptools-scm's form
    assert tree.version == "0.3.0.post1"


def test_a_real_release_version() -> None:
    assert resolve_target(str(release_package("0.5.10"))).version == "0.5.10"


def test_check_inside_refuses_a_link_leading_out(tmp_path: Path) -> None:
    package = package_at(tmp_path / "site" / "sglang")
    tree = resolve_target(str(package))
    models = package / "srt" / "models"
    tree.check_inside(models / "llama.py")
    (models / "alias.py").symlink_to(models / "llama.py")
    tree.check_inside(models / "alias.py")
    outside = tmp_path / "outside.py"
    outside.write_bytes(MODEL)
    (models / "escape.py").symlink_to(outside)
    with pytest.raises(PatchcraftError) as caught:
        tree.check_inside(models / "escape.py")
    assert str(caught.value).startswith(f"{models / 'escape.py'}: symlink to {outside}, outside the target {tree.root}")
    assert "nothing was changed" in str(caught.value)


def test_relative_outside_the_root_is_the_path_itself(tmp_path: Path) -> None:
    tree = SglangTree(package=tmp_path / "site" / "sglang", root=tmp_path / "site")
    assert tree.relative(tmp_path / "site" / "sglang" / "x.py") == "sglang/x.py"
    assert tree.relative(Path("/elsewhere/y.py")) == "/elsewhere/y.py"
