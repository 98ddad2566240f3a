"""The hashes a compile writes down and a later dsc compares: a resume's journal fingerprint (plan.json),
a unit's input fingerprint and each sample's annotation digest (the dataset's fingerprint column, what
``--update`` compares). A dsc that hashes the same inputs differently makes every in-flight resume start
over and every ``--update`` of a dataset compiled before it re-decode every annotated sample: these values
are pinned, so such a change is a decision (say it in the README), not an accident."""
import numpy as np

from dsc.compiler.journal import fingerprint, inputs_of
from dsc.compiler.sources.base import Record, Target, record_digest, record_digests


def _records():
    box = Target(boxes=np.array([[1.0, 2.0, 30.5, 40.25]]), labels=np.array([3]), image_id=7, source="ann.json",
                 attrs={"iscrowd": np.array([0])}, size=(64, 48))
    return [Record("a", "/data/a.jpg", label=1),
            Record("b", "b.jpg", target=box),
            Record("c", "t.parquet", row=4, fields=(("caption", "a cat"), ("score", 0.5),
                                                    ("emb", np.arange(4, dtype=np.float32)), ("raw", b"\x00\x01")))]


def test_annotation_digests_are_pinned():
    recs = _records()
    assert [record_digest(r) for r in recs] == list(record_digests(recs)) == GOLDEN_DIGESTS


def test_the_journal_fingerprint_is_pinned():
    recs = _records()
    settings = {"size": [32, 32], "resize": "pad", "shard_size": 4, "task": "detection", "kind": "coco"}
    assert fingerprint(recs, settings) == GOLDEN_PLAN
    assert fingerprint(recs, settings, record_digests(recs)) == GOLDEN_PLAN


def test_a_missing_inputs_fingerprint_is_pinned():
    assert inputs_of([Record("x", "/nonexistent/dsc-golden/x.jpg")]) == GOLDEN_MISSING


GOLDEN_DIGESTS = [0, 1185331285889485861, 5423975954460695561]
GOLDEN_PLAN = "ea41e5e98870295c0e411f342571e96493230612a5dc8f3c24ed2891c79b8c8c"
GOLDEN_MISSING = "0cf64711eb88f82c183219fe21ae2160efea20f9179977c842845b89ef471dac"
