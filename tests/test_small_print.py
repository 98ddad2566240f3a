"""Issue 36's second half: an image with no pixels, a world size far above the samples, writes into a sample,
and the small print a newcomer met (CLI messages, -q, help texts, progress in logs, DataLoader habits in the
Python API, dsc bench's impossible figures and moved source files). Numbers refer to the issue."""
import shutil

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from PIL import Image

import dsc
from dsc.cli import main


def cli(*args):
    r = CliRunner().invoke(main, [str(a) for a in args])
    assert "Traceback" not in r.output, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    return r


@pytest.fixture(scope="module")
def fixed(scenes_compiled):
    return scenes_compiled(size=(12, 10), shard_size=5).path


# ----------------------------------------------------------------------------- 9. no pixels
class _Empty:
    """A Python dataset with images of no pixels at 2 (5 wide, 0 high) and 3 (an empty array)."""

    def __len__(self):
        return 5

    def __getitem__(self, i):
        if i == 2:
            return Image.new("RGB", (5, 0)), 0
        if i == 3:
            return np.zeros((0, 0, 3), np.uint8), 1
        return Image.new("RGB", (9, 7), (40 * i, 0, 0)), i % 2


@pytest.mark.parametrize("shape", [dict(size=4), dict(max_side=6), {}])
def test_9_an_image_with_no_pixels_is_a_recorded_skip(tmp_path, shape):
    r = dsc.compile(_Empty(), tmp_path / "out", classes=["a", "b"], on_error="skip", progress=False, **shape)
    assert [s["key"] for s in r.skipped] == ["2", "3"]
    assert "5x0 pixels" in r.skipped[0]["reason"] and "0x0 pixels" in r.skipped[1]["reason"]
    assert len(dsc.open(tmp_path / "out")) == 3
    with pytest.raises(dsc.SampleError, match=r"dataset\[2\]: the image is 5x0 pixels"):
        dsc.compile(_Empty(), tmp_path / "o2", classes=["a", "b"], progress=False, **shape)


def test_9_an_image_file_with_no_pixels_is_a_recorded_skip(scenes_src, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(scenes_src, src)
    (src / "class_00" / "empty.ppm").write_bytes(b"P6 5 0 255\n")  # a header of 5x0 pixels
    r = cli("compile", "imagefolder", src, tmp_path / "out", "--size", "8", "--on-error", "skip", "-q")
    assert r.exit_code == 0 and "class_00/empty.ppm" in r.output


# ----------------------------------------------------------------------------- 12. a huge world size
def test_12_a_world_size_far_above_the_samples_costs_nothing(fixed):
    ds = dsc.open(fixed)
    huge = 10 ** 12  # (before: the padded order of every rank was made, 8 TB here, 7.45 GiB for 10**9)
    for order in ("sequential", "random", "quasi_random"):
        loader = dsc.Loader(ds, batch_size=4, order=order, world_size=huge, rank=huge - 1)
        assert len(loader) == 1 and len(loader.sampler) == 1
        batches = list(loader)
        assert len(batches) == 1 and len(batches[0]["index"]) == 1
    # each rank's share is the one a padded order gives it, as before, for world sizes near the sample count
    from dsc.runtime.orders import partition

    rng = np.random.default_rng(0)
    for n in (1, 5, 7):
        order = rng.permutation(n)
        for world in range(1, 12):
            per = -(-n // world)
            padded = np.concatenate([order, np.resize(order, per * world - n)])
            for rank in range(world):
                assert np.array_equal(partition(order, rank, world), padded[rank * per:(rank + 1) * per])


# ----------------------------------------------------------------------------- 13. writes into a sample
def test_13_writing_into_a_sample_changes_only_that_copy(fixed, tmp_path):
    ds = dsc.open(fixed)
    first = ds[3]["image"].clone()
    ds[3]["image"].fill_(7)
    assert torch.equal(ds[3]["image"], first)  # the same handle reads the sample as compiled
    assert torch.equal(ds.get_batch([3])["image"][0], first)
    from dsc.synthetic import detection_scenes, write_coco

    ann, images = write_coco(tmp_path / "coco", detection_scenes(3, seed=1))
    dsc.compile_coco(ann, images, tmp_path / "det", max_side=40, progress=False)
    det = dsc.open(tmp_path / "det")
    boxes = det[0]["boxes"].clone()
    det[0]["boxes"].add_(100)
    assert torch.equal(det[0]["boxes"], boxes)


# ----------------------------------------------------------------------------- dsc bench
def _bench_dataset(scenes_src, tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    shutil.copytree(scenes_src, src)
    dsc.compile_imagefolder(src, out, size=16, progress=False)
    return src, out


def test_bench_never_prints_an_impossible_ratio(scenes_src, tmp_path, monkeypatch):
    import dsc.bench as B

    _, out = _bench_dataset(scenes_src, tmp_path)
    calls = []

    def slow_then_true(fast):  # the first round of a baseline ran during a load spike
        def measure(ds, loader):
            calls.append(1)
            return 1.0 if len(calls) <= 2 else fast
        return measure

    monkeypatch.setattr(B, "copy_limit", slow_then_true(1e12))
    monkeypatch.setattr(B, "threaded_take_limit", slow_then_true(1e12))
    r = cli("bench", out, "--batch-size", "2", "--epochs", "1")
    assert r.exit_code == 0, r.output
    assert "measured 2 times" in r.output and "% of the copy limit" in r.output
    monkeypatch.setattr(B, "copy_limit", lambda ds, loader: 1.0)  # disturbed in every round
    monkeypatch.setattr(B, "threaded_take_limit", lambda ds, loader: 1.0)
    r = cli("bench", out, "--batch-size", "2", "--epochs", "1")
    assert r.exit_code == 0, r.output
    assert "% of the copy limit" not in r.output and "not compared" in r.output and "rerun dsc bench" in r.output


def test_bench_baseline_b_runs_over_the_source_files_still_there(scenes_src, tmp_path):
    src, out = _bench_dataset(scenes_src, tmp_path)
    ds = dsc.open(out)
    for k in (ds.keys[0], ds.keys[7], ds.keys[20]):  # the first among them
        (src / k).unlink()
    r = cli("bench", out, "--batch-size", "2", "--epochs", "1")
    assert r.exit_code == 0, r.output
    assert "(baseline b) dsc is" in r.output
    assert "baseline b over the 33 source files still there; 3 are no longer where the manifest says" in r.output
    shutil.rmtree(src)
    r = cli("bench", out, "--batch-size", "2", "--epochs", "1")
    assert "baseline b skipped: the source JPEGs are not where the manifest says (e.g." in r.output


# ----------------------------------------------------------------------------- CLI messages and flags
def test_a_missing_required_option_is_named_by_its_flag(tmp_path):
    from dsc.compiler.sources import sources

    (tmp_path / "a.json").write_text('{"images": [], "annotations": [], "categories": []}')
    r = cli("compile", "coco", "--annotations", tmp_path / "a.json", tmp_path / "out")
    assert r.exit_code == 2 and "Missing option '--images'" in r.output and "images is required" not in r.output
    for name, cls in sources().items():  # every source's required options
        flags = [p.option for p in cls.params if cls.cli and p.cli and p.required and not p.argument]
        if flags:
            r = cli("compile", name, tmp_path / "out")
            assert r.exit_code == 2 and "is required" not in r.output, r.output
            assert any(f"Missing option '{flag}'" in r.output for flag in flags), (name, r.output)


def test_quiet_for_info_verify_log_tag_bench(fixed):
    r = cli("verify", fixed, "-q")
    assert r.exit_code == 0 and r.output == ""
    r = cli("tag", fixed, "q36", "-q")
    assert r.exit_code == 0 and r.output == ""
    r = cli("tag", fixed, "q36", "--delete", "-q")
    assert r.exit_code == 0 and r.output == ""
    r = cli("log", fixed, "-q")
    assert r.exit_code == 0 and r.output.startswith("version 0") and "options:" not in r.output
    r = cli("info", fixed, "-q")
    assert r.exit_code == 0 and "samples" in r.output and "reads" not in r.output and "reader" not in r.output
    r = cli("bench", fixed, "--batch-size", "4", "--epochs", "1", "-q")
    assert r.exit_code == 0 and "dsc bench" not in r.output and "dsc.Loader" in r.output


def test_help_texts(tmp_path):
    for name, has in (("imagefolder", False), ("yolo", False), ("table", False), ("coco", True), ("voc", True),
                      ("segfolder", True)):
        assert ("--mask-ignore" in cli("compile", name, "--help").output) == has, name
    assert "--cache-dir" not in cli("restore", "--help").output
    assert "earlier versions" not in cli("restore", "--help").output
    usage = cli("info", "--help").output.splitlines()[0]
    assert usage.endswith("info [OPTIONS] DATASET"), usage
    assert cli("info", "--env").exit_code == 0


def test_progress_is_plain_lines_where_stderr_is_not_a_terminal(scenes_src, tmp_path):
    r = cli("compile", "imagefolder", scenes_src, tmp_path / "out", "--size", "8")
    assert r.exit_code == 0 and "\r" not in r.output
    lines = [line for line in r.output.splitlines() if line.startswith("compile: ")]
    assert lines and lines[-1].startswith("compile: 36/36 img (100%)"), r.output


# ----------------------------------------------------------------------------- Python API habits
@pytest.mark.parametrize("kw,says", [
    (dict(shuffle=True), 'order="random"'),
    (dict(num_workers=2), "num_threads="),
    (dict(pin_memory=True), "pinned memory already"),
    (dict(sampler=None), "indices="),
    (dict(bogus=1), "it takes: batch_size"),
    (dict(device="gpu"), "'cpu' or 'cuda' (a GPU"),
])
def test_dataloader_habits_are_one_line_errors(fixed, kw, says):
    with pytest.raises(dsc.ConfigError) as e:
        dsc.Loader(dsc.open(fixed), batch_size=4, **kw)
    assert says in str(e.value) and "\n" not in str(e.value)
    assert "Expected one of" not in str(e.value)  # (torch's list of device types)


def test_a_transform_must_take_and_give_the_batch_dict(fixed):
    ds = dsc.open(fixed)
    for transforms in ([lambda b: b.float()], lambda b: b.float()):
        with pytest.raises(dsc.ConfigError, match="takes the batch dict and returns it"):
            next(iter(dsc.Loader(ds, batch_size=4, transforms=transforms)))
    with pytest.raises(dsc.ConfigError, match="returned a Tensor"):
        next(iter(dsc.Loader(ds, batch_size=4, transforms=[lambda b: b["image"]])))
    for transforms in ([lambda b: {**b, "image": b["image"].float()}], lambda b: {**b, "image": b["image"].float()}):
        assert next(iter(dsc.Loader(ds, batch_size=4, transforms=transforms)))["image"].dtype == torch.float32


def test_opening_a_folder_of_images_says_to_compile_it(scenes_src):
    with pytest.raises(dsc.DatasetNotFoundError, match=r"`dsc compile imagefolder .* OUT`"):
        dsc.open(scenes_src)
