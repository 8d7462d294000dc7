"""reading.server_args: a server command line read as the release's ServerArgs reads it, never imported.

The flag tables come from real release source (0.4.6: no ``--config``;
0.5.10: ``add_argument`` only; 0.5.23: fields in ``srt/arg_groups/``); the
edge cases of the reading itself use a tiny ``server_args.py`` written here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import release_package
from patchcraft.base.errors import PatchcraftError
from patchcraft.reading.server_args import (
    KNOWN,
    NO_FUSION_FLAG,
    flag_for,
    config_flags,
    flag_files,
    merge_config,
    parse_server_args,
    release_flags,
)


def fake_release(root: Path, source: str) -> Path:
    """A package whose ``srt/server_args.py`` is ``source`` (nothing else)."""
    (root / "srt").mkdir(parents=True)
    (root / "srt" / "server_args.py").write_text(source, encoding="utf-8")
    return root


SMALL = """
def add_cli_args(parser):
    parser.add_argument("--model-path", "--model", type=str)
    parser.add_argument("--tp-size", "--tensor-parallel-size", dest="tp_size", type=int)
    parser.add_argument("--pp-size", "--pp-degree", dest="pp_size", type=int)
    parser.add_argument("--foo-alpha", dest="foo")
    parser.add_argument("--foo-beta", dest="foo")
    parser.add_argument("--speculative-algorithm", type=str)
    parser.add_argument("--speculative-aux", type=str)
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("positional")
"""


# -- the flag table, read from the release's source ---------------------------------


def test_flag_files_are_server_args_then_the_arg_groups_from_0_5_12(tmp_path: Path) -> None:
    old, new = release_package("0.5.10"), release_package("0.5.23")
    assert flag_files(old) == [old / "srt/server_args.py"]
    files = flag_files(new)
    assert files[0] == new / "srt/server_args.py" and len(files) > 1
    assert all(new / "srt/arg_groups" in f.parents for f in files[1:]) and files[1:] == sorted(files[1:])
    assert flag_files(tmp_path) == []


def test_no_server_args_means_no_release_flags(tmp_path: Path) -> None:
    assert release_flags(None) is None
    assert release_flags(tmp_path) is None


def test_add_argument_long_options_and_their_dest(tmp_path: Path) -> None:
    flags = release_flags(fake_release(tmp_path, SMALL))
    assert flags is not None
    assert flags.options == {
        "--model-path": "model_path",
        "--model": "model_path",  # no dest=: the first long option names it
        "--tp-size": "tp_size",
        "--tensor-parallel-size": "tp_size",
        "--pp-size": "pp_size",
        "--pp-degree": "pp_size",
        "--foo-alpha": "foo",
        "--foo-beta": "foo",
        "--speculative-algorithm": "speculative_algorithm",
        "--speculative-aux": "speculative_aux",
        "--verbose": "verbose",  # "-v" is not a long option, "positional" is no option
    }
    assert flags.config is False and flags.files == (tmp_path / "srt/server_args.py",)


def test_a_server_args_that_does_not_parse_is_one_clear_error(tmp_path: Path) -> None:
    fake_release(tmp_path, "def broken(:\n")
    with pytest.raises(PatchcraftError) as caught:
        release_flags(tmp_path)
    message = str(caught.value)
    assert "srt/server_args.py" in message and "cannot read the release's server flags" in message
    assert "\n" not in message


def test_0_5_10_flags_and_their_dests() -> None:
    flags = release_flags(release_package("0.5.10"))
    assert flags is not None and flags.config is True
    assert flags.options["--tp-size"] == "tensor_parallel_size"  # the dest before 0.5.14
    assert flags.options["--pp-size"] == "pipeline_parallel_size"
    assert flags.options["--speculative-draft-model"] == "speculative_draft_model_path"


def test_0_5_23_fields_honour_cli_name_aliases_and_no_cli() -> None:
    flags = release_flags(release_package("0.5.23"))
    assert flags is not None
    assert (
        flags.options["--model"] == "model_path"
        and flags.options["--speculative-draft-model"] == "speculative_draft_model_path"
    )
    # Arg(cli_name="--fp8-gemm-backend") on field fp8_gemm_runner_backend: the cli_name replaces the field's own spelling
    assert flags.options["--fp8-gemm-backend"] == "fp8_gemm_runner_backend"
    assert "--fp8-gemm-runner-backend" not in flags.options
    # Arg(no_cli=True): no flag at all
    assert "--speculative-boundary-reduction" not in flags.options
    assert flags.options["--tp-size"] == flags.options["--tensor-parallel-size"] == "tp_size"


def test_0_4_6_has_no_config_flag() -> None:
    flags = release_flags(release_package("0.4.6"))
    assert flags is not None and flags.config is False and "--config" not in flags.options


# -- parsing a command line ---------------------------------------------------------


@pytest.mark.parametrize("version", ["0.5.10", "0.5.23"])
def test_a_full_command_line_is_read(version: str) -> None:
    argv = [
        "--model-path", "org/target", "--revision", "abc",
        "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "org/draft",
        "--speculative-draft-model-revision", "def", "--tp-size", "8", "--pp-size", "2",
        "--mem-fraction-static", "0.8", "positional",
    ]  # fmt: skip
    parsed = parse_server_args(argv, release_package(version))
    assert (parsed.model_path, parsed.revision, parsed.algorithm) == ("org/target", "abc", "EAGLE3")
    assert (parsed.draft_path, parsed.draft_revision, parsed.tp, parsed.pp) == ("org/draft", "def", 8, 2)
    assert parsed.notes == () and parsed.unchecked == {}


def test_defaults_when_nothing_is_given() -> None:
    parsed = parse_server_args([], release_package("0.5.10"))
    assert (parsed.algorithm, parsed.draft_path, parsed.model_path, parsed.tp, parsed.pp) == (None, None, None, 1, 1)


def test_equals_form_aliases_and_the_last_one_wins() -> None:
    package = release_package("0.5.23")
    parsed = parse_server_args(
        ["--tp-size=2", "--tensor-parallel-size", "4", "--model", "a", "--model-path=b"], package
    )
    assert parsed.tp == 4 and parsed.model_path == "b"


def test_a_flag_without_its_value_at_the_end_is_not_read() -> None:
    assert parse_server_args(["--model-path"], release_package("0.5.10")).model_path is None


def test_a_tp_that_is_not_a_number_is_a_user_error() -> None:
    with pytest.raises(PatchcraftError, match=r"--tp-size is 'eight', not a number"):
        parse_server_args(["--tp-size", "eight"], release_package("0.5.10"))


@pytest.mark.parametrize("version", ["0.4.6", "0.5.10", "0.5.23"])
def test_a_unique_prefix_is_read_as_its_flag_and_said(version: str) -> None:
    parsed = parse_server_args(["--speculative-algo", "EAGLE3", "--tp", "4"], release_package(version))
    assert (parsed.algorithm, parsed.tp) == ("EAGLE3", 4)
    assert "--speculative-algo read as --speculative-algorithm (argparse accepts a unique prefix)" in parsed.notes
    assert "--tp read as --tp-size (argparse accepts a unique prefix)" in parsed.notes
    assert parsed.unchecked == {}


def test_an_ambiguous_prefix_is_unchecked_never_guessed() -> None:
    parsed = parse_server_args(["--pp", "2"], release_package("0.5.10"))
    assert parsed.pp == 1
    assert set(parsed.unchecked) == {"pp"}
    assert "--pp is ambiguous on this release" in parsed.unchecked["pp"] and "--pp-size" in parsed.unchecked["pp"]


def test_an_ambiguous_prefix_marks_every_field_it_may_stand_for() -> None:
    parsed = parse_server_args(["--spec", "x"], release_package("0.5.10"))
    assert set(parsed.unchecked) == {"algorithm", "draft_path", "draft_revision"}
    assert parsed.algorithm is None and parsed.draft_path is None


def test_a_prefix_of_two_spellings_of_one_dest_is_not_ambiguous(tmp_path: Path) -> None:
    package = fake_release(tmp_path, SMALL)
    parsed = parse_server_args(["--speculative-al", "EAGLE3", "--ten", "2", "--pp", "3"], package)
    assert (parsed.algorithm, parsed.tp, parsed.pp) == ("EAGLE3", 2, 3)
    assert "--ten read as --tensor-parallel-size (argparse accepts a unique prefix)" in parsed.notes
    # --pp: a prefix of --pp-size and --pp-degree, one dest; the note names the shorter spelling
    assert "--pp read as --pp-size (argparse accepts a unique prefix)" in parsed.notes and parsed.unchecked == {}


def test_an_ambiguous_prefix_of_flags_the_preflight_never_reads_is_left_alone(tmp_path: Path) -> None:
    parsed = parse_server_args(["--foo", "1", "--spe", "x"], fake_release(tmp_path, SMALL))
    assert "foo" not in str(parsed.unchecked) and "--foo" not in " ".join(parsed.notes)
    assert set(parsed.unchecked) == {"algorithm"}  # --spe: --speculative-algorithm or --speculative-aux


def test_unknown_flags_and_the_double_dash_are_ignored() -> None:
    parsed = parse_server_args(["--not-a-flag", "1", "--", "--model-path", "m"], release_package("0.5.10"))
    assert parsed.unchecked == {} and parsed.notes == ()
    assert parsed.model_path == "m"


def test_without_the_release_flags_the_known_spellings_are_read() -> None:
    parsed = parse_server_args(
        ["--speculative-draft-model", "d", "--tensor-parallel-size", "2", "--speculative-algo", "E"], None
    )
    assert (parsed.draft_path, parsed.tp) == ("d", 2)
    assert parsed.algorithm is None
    assert list(parsed.unchecked) == ["algorithm"]
    assert "--speculative-algo may abbreviate --speculative-algorithm" in parsed.unchecked["algorithm"]
    assert "srt/server_args.py was not found" in parsed.unchecked["algorithm"]
    assert set(KNOWN.values()) <= set(release_flags(release_package("0.5.23")).options.values())


# -- --config FILE ------------------------------------------------------------------


def write_yaml(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_config_file_flags_go_first_and_the_command_line_wins(tmp_path: Path) -> None:
    config = write_yaml(tmp_path / "serve.yaml", "speculative-algorithm: EAGLE3\ntp-size: 4\nmodel-path: from-file\n")
    parsed = parse_server_args(["--model-path", "from-cli", "--config", str(config)], release_package("0.5.10"))
    assert (parsed.algorithm, parsed.tp, parsed.model_path) == ("EAGLE3", 4, "from-cli")
    assert f"--config {config} read (its flags first, the command line's after)" in parsed.notes


def test_config_abbreviations_resolve_as_well(tmp_path: Path) -> None:
    config = write_yaml(tmp_path / "serve.yml", "speculative-algo: EAGLE3\n")
    assert parse_server_args(["--config", str(config)], release_package("0.5.23")).algorithm == "EAGLE3"


def test_a_release_without_config_does_not_read_the_file(tmp_path: Path) -> None:
    config = write_yaml(tmp_path / "serve.yaml", "tp-size: 4\n")
    parsed = parse_server_args(["--config", str(config)], release_package("0.4.6"))
    assert parsed.tp == 1
    assert "this release has no --config flag: the config file is not read" in parsed.notes


def test_config_equals_file_is_not_merged(tmp_path: Path) -> None:
    config = write_yaml(tmp_path / "serve.yaml", "tp-size: 4\n")
    parsed = parse_server_args([f"--config={config}"], release_package("0.5.10"))
    assert parsed.tp == 1
    assert any("--config=FILE is not merged by SGLang" in note for note in parsed.notes)


def test_merge_config_places_the_file_flags_before_the_rest(tmp_path: Path) -> None:
    config = write_yaml(tmp_path / "c.yaml", "a: 1\n")
    merged, note = merge_config(["--x", "y", "--config", str(config), "--z"])
    assert merged == ["--a", "1", "--x", "y", "--z"] and note is not None
    assert merge_config(["--x"]) == (["--x"], None)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--config", "a.yaml", "--config", "b.yaml"], "more than once"),
        (["--tp-size", "2", "--config"], "ends with --config and no file"),
    ],
)
def test_config_given_wrong_is_refused(argv: list[str], message: str) -> None:
    with pytest.raises(PatchcraftError, match=message):
        merge_config(argv)


def test_config_values_become_tokens_as_sglang_writes_them(tmp_path: Path) -> None:
    config = write_yaml(
        tmp_path / "c.yaml",
        "enable-x: true\ndisable-y: false\nlist: [1, two]\nempty: []\nmapping: {k: 1}\nnumber: 3\ntext: hi\n",
    )
    # a true bool is the bare flag, a false one and an empty list are dropped, a mapping is JSON
    assert config_flags(config) == [
        "--enable-x",
        "--list",
        "1",
        "two",
        "--mapping",
        '{"k": 1}',
        "--number",
        "3",
        "--text",
        "hi",
    ]


def test_an_empty_config_file_has_no_flags(tmp_path: Path) -> None:
    assert config_flags(write_yaml(tmp_path / "c.yaml", "")) == []


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("c.json", "{}", "must be a YAML file"),
        ("c.yaml", "a: [1\n", "not valid YAML"),
        ("c.yaml", "- a\n- b\n", "must hold a mapping"),
    ],
)
def test_a_bad_config_file_is_one_line(tmp_path: Path, name: str, text: str, message: str) -> None:
    with pytest.raises(PatchcraftError, match=message) as caught:
        config_flags(write_yaml(tmp_path / name, text))
    assert "\n" not in str(caught.value) and name in str(caught.value)


def test_a_missing_config_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(PatchcraftError, match="cannot read the --config file") as caught:
        config_flags(tmp_path / "absent.yaml")
    assert "\n" not in str(caught.value)


# -- the switches the preflight reads: --enforce-disable-flashinfer-allreduce-fusion ----------


@pytest.mark.parametrize(("version", "off"), [("0.5.10", True), ("0.5.23", True), ("0.5.6", False)])
def test_the_server_s_fusion_switch_is_read_where_the_release_has_it(version, off):
    argv = ["--model-path", "m", "--tp-size", "8", "--enforce-disable-flashinfer-allreduce-fusion"]
    server = parse_server_args(argv, release_package(version))
    assert server.tp == 8 and server.allreduce_fusion is (not off)  # 0.5.6 has no such flag: the server refuses it
    assert parse_server_args(argv[:4], release_package(version)).allreduce_fusion is True


def test_the_fusion_switch_reaches_run_s_preflight(tmp_path):
    from drafts import kimi_target, sglang_draft
    from patchcraft.commands._preflight import prepare

    draft, target = sglang_draft(tmp_path / "draft", [2, 30, 58]), kimi_target(tmp_path / "target")
    argv = ["--model-path", str(target), "--speculative-algorithm", "EAGLE3"]
    argv += ["--speculative-draft-model-path", str(draft), "--tp-size", "8"]
    package = release_package("0.5.10")
    on = prepare(parse_server_args(argv, package), package, "hf:3,31,59")
    off = prepare(
        parse_server_args(argv + ["--enforce-disable-flashinfer-allreduce-fusion"], package), package, "hf:3,31,59"
    )
    assert not isinstance(on, int) and not isinstance(off, int)
    assert on.options.allreduce_fusion is True and off.options.allreduce_fusion is False


def test_flag_for_names_the_release_s_option_or_the_dashed_dest():
    assert flag_for(release_package("0.5.10"), "enforce_disable_flashinfer_allreduce_fusion") == NO_FUSION_FLAG
    assert flag_for(None, "speculative_eagle_aux_layer_ids") == "--speculative-eagle-aux-layer-ids"
