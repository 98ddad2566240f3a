"""The CLI as a user meets it: one-line errors, non-zero exit codes, never a traceback."""
import pytest
from click.testing import CliRunner

import dsc
from dsc.cli import main


def run(*args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def test_compile_info_roundtrip(scenes_src, tmp_path):
    out = tmp_path / "out"
    r = run("compile", "imagefolder", scenes_src, out, "--size", "20,30", "--resize", "stretch", "-q")
    assert r.exit_code == 0, r.output
    assert "compiled 36 images" in r.output
    assert dsc.open(out)[0]["image"].shape == (20, 30, 3)
    r = run("info", out)
    assert r.exit_code == 0
    assert "fixed 20x30x3" in r.output and "class_00, class_01, class_02" in r.output
    assert "Pillow" in r.output or "pillow-simd" in r.output


def test_info_env_names_the_pil_build():
    r = run("info", "--env")
    assert r.exit_code == 0 and "pil_distribution" in r.output and "libjpeg_turbo" in r.output
    assert "torch_cpu_capability" in r.output  # the kernels --resizer torch runs on


@pytest.mark.parametrize("case,msg", [
    ("missing", "no such directory"),
    ("noclass", "no class folders"),
    ("exists", "is an empty folder; pass --overwrite"),
    ("bad", "cannot decode image"),
    ("both", "not both"),
    ("size", "not SIZE"),
])
def test_errors_are_one_line(scenes_src, tmp_path, case, msg):
    src, out = scenes_src, tmp_path / "out"
    extra = ["--size", "8"]
    if case == "missing":
        src = tmp_path / "nope"
    elif case == "noclass":
        src = tmp_path / "empty"
        src.mkdir()
    elif case == "exists":
        out.mkdir()
    elif case == "bad":
        import shutil

        src = tmp_path / "src"
        shutil.copytree(scenes_src, src)
        (src / "class_01" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n garbage")
    elif case == "both":
        extra += ["--max-side", "9"]
    elif case == "size":
        extra = ["--size", "big"]
    r = run("compile", "imagefolder", src, out, "-q", *extra)
    assert r.exit_code != 0
    assert msg in r.output
    if case == "bad":
        assert "broken.png" in r.output


def test_skip_prints_a_summary(scenes_src, tmp_path):
    import shutil

    src = tmp_path / "src"
    shutil.copytree(scenes_src, src)
    (src / "class_01" / "broken.jpg").write_bytes(b"")
    r = run("compile", "imagefolder", src, tmp_path / "out", "--size", "8", "--on-error", "skip", "-q")
    assert r.exit_code == 0
    assert "skipped 1 bad input " in r.output and "class_01/broken.jpg" in r.output
    r = run("info", tmp_path / "out", "--skipped")
    assert "class_01/broken.jpg" in r.output


def test_bench_prints_ratios(scenes_src, tmp_path):
    out = tmp_path / "out"
    dsc.compile_imagefolder(scenes_src, out, size=16, progress=False)
    r = run("bench", out, "--batch-size", "2", "--epochs", "1")
    assert r.exit_code == 0, r.output
    assert "of the copy limit" in r.output and "dsc is" in r.output
    r = run("bench", out, "--batch-size", "8", "--epochs", "1")  # too few batches to time the baseline
    assert "baseline b skipped: 36 samples are too few to time 4 batches of 8" in r.output
    r = run("bench", out, "--batch-size", "8", "--epochs", "1", "--recipe", "imagenet")
    assert "baseline c skipped: 36 samples are too few" in r.output and "fused into the gather" in r.output


def test_user_mistakes_give_clean_messages(scenes_src, tmp_path):
    import subprocess
    import sys

    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "readme.parquet").write_text("not a table")
    r = run("compile", "table", tmp_path / "readme.parquet", tmp_path / "o1", "-q")
    assert r.exit_code == 1 and "not a readable Parquet or Arrow file" in r.output
    pq.write_table(pa.table({"image": [b"garbage"], "label": [0]}), tmp_path / "bad.parquet")
    r = run("compile", "table", tmp_path / "bad.parquet", tmp_path / "o2", "-q")
    assert r.exit_code == 1 and "bad.parquet row 0" in r.output and "BytesIO" not in r.output
    r = run("compile", "imagefolder", scenes_src, tmp_path / "o3", "--size", "8", "-q", "--executor", "bogus")
    assert r.exit_code == 1 and "cannot reach the Dask scheduler at 'bogus'" in r.output
    out = tmp_path / "ds"
    dsc.compile_imagefolder(scenes_src, out, size=8, progress=False)
    r = run("preview", out, "-o", tmp_path / "missing" / "p.png")
    assert r.exit_code == 1 and "no such directory" in r.output and not (tmp_path / "missing").exists()
    p = subprocess.Popen([sys.executable, "-m", "dsc.cli", "info", str(out)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.stdout.close()  # like `dsc info OUT | head -0`
    err = p.stderr.read().decode()
    p.wait()
    assert "Traceback" not in err and "Broken pipe" not in err
    ds = dsc.open(out)
    import torch

    assert isinstance(ds.to_original(0, torch.tensor([[0.0, 0.0, 4.0, 4.0]])), torch.Tensor)


def test_a_source_name_typo_says_which_source_was_meant(tmp_path):
    r = run("compile", "imagefoldr", tmp_path, tmp_path / "out")
    assert r.exit_code == 2 and "no source named 'imagefoldr'; did you mean 'imagefolder'?" in r.output
    assert "(the sources are: imagefolder, coco," in r.output
    r = run("compile", "zzz", tmp_path, tmp_path / "out")
    assert r.exit_code == 2 and "no source named 'zzz' (the sources are:" in r.output
    with pytest.raises(dsc.ConfigError, match="did you mean 'coco'"):
        dsc.compiler.get_source("cocoo")


def test_out_inside_src_is_said_to_be_left_out_of_the_classes(scenes_src, tmp_path):
    import shutil

    src = tmp_path / "src"
    shutil.copytree(scenes_src, src)
    for out, what in ((src / "out", "out is left out of the classes"),
                      (src / "class_01" / "ds", "class_01/ds is left out of the class 'class_01''s images")):
        for extra in ((), ("--update",)):
            r = run("compile", "imagefolder", src, out, "--size", "8", "-q", *extra)
            assert r.exit_code == 0, r.output
            assert f"warning: OUT {out} is inside the source folder {src}" in r.output and what in r.output
            assert "compile into a folder outside" in r.output
        assert dsc.open(out).classes == ["class_00", "class_01", "class_02"] and len(dsc.open(out)) == 36
    r = run("compile", "imagefolder", src, tmp_path / "beside", "--size", "8", "-q")
    assert r.exit_code == 0 and "warning" not in r.output


def test_error_report_lists_bad_inputs(scenes_src, tmp_path):
    import json
    import shutil

    src = tmp_path / "src"
    shutil.copytree(scenes_src, src)
    (src / "class_01" / "broken.jpg").write_bytes(b"")
    (src / "class_02" / "text.png").write_text("no")
    report = tmp_path / "errors.jsonl"
    r = run("compile", "imagefolder", src, tmp_path / "out", "--size", "8", "--on-error", "skip",
            "--error-report", report, "-q")
    assert r.exit_code == 0
    lines = [json.loads(ln) for ln in report.read_text().splitlines()]
    assert [d["key"] for d in lines] == ["class_01/broken.jpg", "class_02/text.png"]
    assert all(d["path"] == str(src / d["key"]) for d in lines)
    assert "the file is empty (0 bytes)" in lines[0]["reason"] and "cannot identify" in lines[1]["reason"]
    r = run("compile", "imagefolder", src, tmp_path / "out2", "--size", "8", "--workers", "1",
            "--error-report", report, "-q")
    assert r.exit_code == 1
    (only,) = [json.loads(ln) for ln in report.read_text().splitlines()]
    assert only["key"] == "class_01/broken.jpg" and "--on-error" not in only["reason"]


def test_cli_choices_match_the_library():
    """Compile commands take their choices from the library; `dsc bench` spells its orders out (importing
    the runtime would load torch for `dsc --help`): they must not drift."""
    import click

    from dsc.cli import bench_cmd, main
    compile_imagefolder_cmd = main.commands["compile"].get_command(None, "imagefolder")
    from dsc.compiler.resample import FILTERS, RESIZERS
    from dsc.compiler.options import ON_ERROR
    from dsc.formats.manifest import RESIZE_POLICIES
    from dsc.runtime.orders import ORDERS

    choices = {p.name: tuple(p.type.choices) for p in compile_imagefolder_cmd.params + bench_cmd.params
               if isinstance(p.type, click.Choice)}
    assert choices["resize"] == RESIZE_POLICIES and choices["on_error"] == ON_ERROR
    assert set(choices["filter_"]) == set(FILTERS) and choices["mode"] == ("RGB", "L")
    assert choices["resizer"] == RESIZERS
    assert choices["order"] == tuple(ORDERS)


def test_a_url_with_a_missing_slash_is_named_not_read_as_a_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = run("info", "s3:/bucket/ds")
    assert r.exit_code == 2 and "'s3:/bucket/ds' is not a URL: did you mean s3://bucket/ds?" in r.output
    r = run("verify", "gs:bucket/ds")
    assert r.exit_code == 2 and "did you mean gs://bucket/ds?" in r.output


def test_cache_warm_of_a_local_folder_says_it_is_read_in_place(scenes_compiled, tmp_path):
    r = run("cache", "warm", scenes_compiled(size=8).path, "--cache-dir", tmp_path / "cache")
    assert r.exit_code != 0 and "a local dataset is read in place" in r.output
    assert not (tmp_path / "cache").exists()


def test_a_url_with_a_missing_slash_is_refused_in_python_too(scenes_src, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(dsc.ConfigError, match=r"did you mean s3://demo/x\?"):
        dsc.compile_imagefolder(scenes_src, "s3:/demo/x", size=8, progress=False)
    r = run("compile", "imagefolder", scenes_src, "S3:/demo/x", "--size", "8")
    assert r.exit_code == 2 and "did you mean s3://demo/x?" in r.output
    assert not (tmp_path / "s3:").exists() and not (tmp_path / "S3:").exists()
    (tmp_path / "gs:kept").mkdir()  # a folder that exists under such a name is still a folder
    assert dsc.store.open_store("gs:kept").local


def test_an_out_that_is_not_a_dataset_is_refused_with_what_would_work(scenes_src, tmp_path):
    (tmp_path / "notds").mkdir()
    (tmp_path / "notds" / "a").write_text("x")
    (tmp_path / "afile").write_text("y")
    (tmp_path / "empty").mkdir()
    for out in ("notds", "afile"):
        for update in ([], ["--update"]):
            r = run("compile", "imagefolder", scenes_src, tmp_path / out, "--size", "8", *update)
            assert r.exit_code != 0 and "is not a dsc dataset; dsc writes only to a new path" in r.output
            assert "--update" not in r.output
    r = run("compile", "imagefolder", scenes_src, tmp_path / "empty", "--size", "8", "--update")
    assert r.exit_code != 0 and "is an empty folder; pass --overwrite to compile into it" in r.output
    assert run("compile", "imagefolder", scenes_src, tmp_path / "empty", "--size", "8", "--overwrite").exit_code == 0
    r = run("compile", "imagefolder", scenes_src, tmp_path / "empty", "--size", "8")
    assert r.exit_code != 0 and "already exists; pass --update" in r.output
    assert (tmp_path / "notds" / "a").read_text() == "x" and (tmp_path / "afile").read_text() == "y"
    (tmp_path / "lnk").symlink_to(tmp_path / "empty")
    r = run("compile", "imagefolder", scenes_src, tmp_path / "lnk", "--size", "8", "--overwrite")
    assert r.exit_code != 0 and "is a link; dsc does not compile over a link: give the real path" in r.output


def test_a_compile_stopped_by_a_bad_input_says_to_fix_it_before_resuming(scenes_src, tmp_path):
    import shutil

    src = tmp_path / "src"
    shutil.copytree(scenes_src, src)
    (src / "zz").mkdir()
    (src / "zz" / "bad.jpg").write_bytes(b"garbage")
    argv = ["compile", "imagefolder", src, tmp_path / "out", "--size", "8", "--shard-size", "2", "--workers", "1"]
    r = run(*argv)
    assert r.exit_code == 1 and "bad.jpg: cannot decode image" in r.output
    assert "fix that input in place (or pass --on-error skip) and rerun the same command with --resume" in r.output
    assert "after removing it, rerun without --resume" in r.output
    shutil.copy(next((src / "class_00").iterdir()), src / "zz" / "bad.jpg")  # fixed in place: the resume keeps
    r = run(*argv, "--resume")  # what was finished
    assert r.exit_code == 0 and "finished shards verified and kept" in r.output, r.output


def test_an_out_in_a_folder_dsc_cannot_write_names_out_and_the_fix(scenes_src, tmp_path):
    (tmp_path / "afile").write_text("y")
    r = run("compile", "imagefolder", scenes_src, tmp_path / "afile" / "x", "--size", "8")
    assert r.exit_code == 1 and "afile/x: cannot make the lock file dsc keeps beside it" in r.output
    assert "a part of that path is a file, not a folder" in r.output and "Errno" not in r.output


def test_compile_help_says_which_sources_may_be_in_object_storage():
    """imagefolder and table read s3:// gs:// az:// as webdataset does: their --help says so."""
    for source in ("imagefolder", "table", "webdataset"):
        r = CliRunner().invoke(main, ["compile", source, "--help"])
        assert r.exit_code == 0 and "(s3://, gs://, az://" in r.output, (source, r.output)


def test_box_counts_after_an_update_are_the_live_samples(tmp_path):
    """The manifest counts box rows, which an update that removes a sample keeps; the compile report and
    `dsc info` count the boxes of the version's samples (they said 10 boxes after 2 of them were removed)."""
    import json

    from dsc.synthetic import detection_scenes, write_coco

    ann, images = write_coco(tmp_path / "src", detection_scenes(6, seed=1))
    out = tmp_path / "out.dsc"
    first = run("compile", "coco", out, "--images", images, "--annotations", ann)
    a = json.loads(ann.read_text())
    total = len(a["annotations"])
    assert f"objects: {total} boxes" in first.output
    gone = a["images"][0]["id"]
    removed = sum(x["image_id"] == gone for x in a["annotations"])
    assert removed > 0
    a["images"] = a["images"][1:]
    a["annotations"] = [x for x in a["annotations"] if x["image_id"] != gone]
    ann.write_text(json.dumps(a))
    upd = run("compile", "coco", out, "--images", images, "--annotations", ann, "--update")
    assert f"objects: {total - removed} boxes" in upd.output
    assert f"{total - removed} boxes" in run("info", out).output
    assert f"{total} boxes" in run("info", out, "--version", "0").output
    import dsc

    with dsc.open(out) as ds:  # (the public count the report uses: one per live sample, in order)
        assert ds.box_counts().tolist() == [len(ds[i]["boxes"]) for i in range(len(ds))]
