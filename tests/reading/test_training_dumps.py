"""``reading.training_dumps``: each format's tensors located where the writer put them, and what is refused."""

from __future__ import annotations

import io
import pickle
import zipfile
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from patchcraft.base.errors import PatchcraftError  # noqa: E402
from patchcraft.harness.draft_probe import state_of, tensor_of  # noqa: E402
from patchcraft.reading.training_dumps import (  # noqa: E402
    PLAIN,
    SPECFORGE,
    SPECULATORS,
    open_dump,
    torch_zip_tensors,
)

from probe_drafts import HIDDEN, TinyTarget, dump_plain, dump_specforge, dump_speculators, sequences  # noqa: E402


def _expected(seq: torch.Tensor) -> list[torch.Tensor]:
    return [s.to(torch.bfloat16) for s in TinyTarget().states(seq)]


@pytest.mark.parametrize("fmt", [PLAIN, SPECULATORS, SPECFORGE])
def test_each_state_is_where_the_writer_put_it(tmp_path: Path, fmt: str) -> None:
    seqs, held = sequences(3, seed=2), (5, 0, 3)
    target = TinyTarget()
    if fmt == PLAIN:
        dump = open_dump(dump_plain(tmp_path, target, seqs))
    elif fmt == SPECULATORS:
        dump = open_dump(dump_speculators(tmp_path, target, seqs, held), held)
    else:
        dump = open_dump(dump_specforge(tmp_path, target, seqs, held), held)
    assert dump.format == fmt and dump.hidden_size == HIDDEN
    assert dump.states == (tuple(range(6)) if fmt == PLAIN else held)
    for seq, sample in zip(seqs, dump.samples()):
        assert torch.equal(tensor_of(sample.input_ids).long(), seq)
        for k in dump.states:
            assert torch.equal(state_of(sample.states[k]), _expected(seq)[k]), (fmt, k)


def test_files_in_natural_order(tmp_path: Path) -> None:
    dump = open_dump(dump_speculators(tmp_path, TinyTarget(), sequences(12), (0, 1, 2)), (0, 1, 2))
    assert [p.name for p in dump.files][:3] == ["hs_0.safetensors", "hs_1.safetensors", "hs_2.safetensors"]


def test_states_must_match_the_slots(tmp_path: Path) -> None:
    dump_speculators(tmp_path, TinyTarget(), sequences(1), (0, 1, 2))
    with pytest.raises(PatchcraftError, match="--states names 2 states but the dump holds 3"):
        open_dump(tmp_path, (0, 1))


def test_plain_states_subset(tmp_path: Path) -> None:
    dump_plain(tmp_path, TinyTarget(), sequences(1))
    assert open_dump(tmp_path, (3, 0)).states == (3, 0)
    with pytest.raises(PatchcraftError, match=r"--states names hs\[9\], which the dump does not hold"):
        open_dump(tmp_path, (0, 9))


def test_not_a_dump(tmp_path: Path) -> None:
    (tmp_path / "x.txt").write_text("hello")
    with pytest.raises(PatchcraftError, match="no .safetensors or .ckpt files"):
        open_dump(tmp_path)


def test_specforge_unpickler_builds_no_object(tmp_path: Path) -> None:
    """A .ckpt whose pickle asks for anything but tensors is refused before anything runs."""
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (Path.touch, (marker,))

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("archive/data.pkl", pickle.dumps({"input_ids": Evil()}, protocol=2))
    path = tmp_path / "data_0.ckpt"
    path.write_bytes(buffer.getvalue())
    with pytest.raises(PatchcraftError, match="is not a tensor"):
        torch_zip_tensors(path)
    assert not marker.exists()


def test_truncated_specforge_file(tmp_path: Path) -> None:
    dump_specforge(tmp_path, TinyTarget(), sequences(1), (0, 2, 3))
    path = tmp_path / "data_0.ckpt"
    path.write_bytes(path.read_bytes()[:-200])
    with pytest.raises(PatchcraftError, match="truncated"):
        list(open_dump(tmp_path, (0, 2, 3)).samples())
