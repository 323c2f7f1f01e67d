"""The fused image path's promises about what it runs and where it writes: a fused batch in a
process worker is written into its shared-memory slot once (``uses_batch_allocator``); a
transform whose Block state the fused step would skip (hooks) keeps the exact path; a subclass
of a recognised dataset that replaces nothing the fused path replaces is fused (gluon-cv's
``ImageNet`` under the one-import swap), and one that does is not."""

from __future__ import annotations

import mxnet as mx
import numpy as np
import pytest
from mxnet.gluon.data.vision import transforms as T
from test_vision import W5_CHAIN
from test_vision_fidelity import MEAN, STD, pil_jpeg, smooth_image, write_rec

from shardloader import ShardedDataLoader, batchify, vision
from shardloader._engine.ipc import slots
from shardloader.vision._fused import FusedBatchify

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not vision.available(), reason="needs shardloader[vision]"),
]


chain = W5_CHAIN  # RandomResizedCrop(64), a flip, ToTensor, Normalize


@pytest.fixture(scope="module")
def rec(tmp_path_factory):
    images = [pil_jpeg(smooth_image(80, 100, s)) for s in range(16)]
    return write_rec(tmp_path_factory.mktemp("paths"), images)


# -- every byte written once ------------------------------------------------------------------


def test_the_fused_batchify_declares_the_batch_allocator(rec):
    from shardloader.recordio import ImageRecordDataset

    fusion = vision.fuse(ImageRecordDataset(rec).transform_first(chain()))
    assert fusion.path == "fused" and batchify.is_native(fusion.batchify_fn)
    # a capability, not a list of classes: any batchify function may declare it
    assert not batchify.is_native(lambda samples: samples)
    assert batchify.is_native(batchify.Tuple(fusion.batchify_fn, batchify.Stack()))


def test_a_fused_batch_in_a_process_worker_is_written_into_its_slot(
    rec, tmp_path, monkeypatch, no_leaks
):
    """The images of every batch the fork worker packs lie in its slot already: none is
    copied in (before, the float32 images were built in private memory and copied)."""
    from shardloader.recordio import ImageRecordDataset

    log = tmp_path / "placed"  # one line per array the forked worker packs
    place = slots.SlotRing._place

    def counting(self, slot, arr, kind):
        in_place = isinstance(arr, np.ndarray) and self._offset_in(slot, arr) is not None
        with open(log, "a") as f:
            f.write(f"{'in place' if in_place else 'copied'} {arr.shape}\n")
        return place(self, slot, arr, kind)

    monkeypatch.setattr(slots.SlotRing, "_place", counting)
    dataset = ImageRecordDataset(rec).transform_first(chain())
    with ShardedDataLoader(dataset, 4, num_workers=1, start_method="fork", seed=0) as loader:
        shapes = [tuple(data.shape) for data, label in loader]
        assert loader.stats()["image_path"] == "fused"
    assert shapes == [(4, 3, 64, 64)] * 4
    images = [line for line in log.read_text().splitlines() if "(4, 3, 64, 64)" in line]
    # (labels of 16 bytes are below the slot's alignment and copied, by design)
    assert images == ["in place (4, 3, 64, 64)"] * 4


# -- the user's code is never skipped ------------------------------------------------------------


@pytest.mark.parametrize("hook", ["register_forward_hook", "register_forward_pre_hook"])
def test_a_transform_with_hooks_takes_the_exact_path_and_its_hooks_run(rec, hook):
    """The hook runs as often as under Gluon's own DataLoader (once per image under 1.x;
    2.x runs a hybridized transform's hooks as it does), never 0 times."""
    from shardloader.recordio import ImageRecordDataset

    def run(loader_class, **kwargs):
        calls = []
        crop = T.RandomResizedCrop(32)
        getattr(crop, hook)(lambda block, *args: calls.append(type(block).__name__))
        chain = T.Compose([crop, T.ToTensor(), T.Normalize(MEAN, STD)])
        loader = loader_class(ImageRecordDataset(rec).transform_first(chain), 4, **kwargs)
        count = sum(len(data) for data, _ in loader)
        return loader, count, calls

    loader, count, calls = run(ShardedDataLoader, num_workers=0)
    why = loader.stats()["image_path"]
    loader.close()
    kind = "forward pre-hooks" if "pre" in hook else "forward hooks"
    assert (
        why == f"exact: transform RandomResizedCrop has {kind}, which the fused path would not run"
    )
    _, _, gluons = run(mx.gluon.data.DataLoader)
    assert count == 16 and calls and calls == gluons


def test_hooks_on_the_compose_and_instance_methods_keep_the_exact_path(rec):
    from shardloader.recordio import ImageRecordDataset

    chain = T.Compose([T.Resize(32), T.ToTensor()])
    chain.register_forward_hook(lambda *args: None)
    fusion = vision.fuse(ImageRecordDataset(rec).transform_first(chain))
    assert (
        fusion.reason == "transform Compose has forward hooks, which the fused path would not run"
    )
    flip = T.RandomFlipLeftRight()
    flip.forward = lambda x: x  # the user's own forward on one instance
    fusion = vision.fuse(ImageRecordDataset(rec).transform_first(T.Compose([T.Resize(32), flip])))
    assert fusion.reason == "transform RandomFlipLeftRight has its own forward set on the instance"


# -- subclasses of the recognised datasets ------------------------------------------------------


def _subclass(base, **methods):
    def __init__(self, *args, **kwargs):
        base.__init__(self, *args, **kwargs)
        self.note = "only sets attributes"

    return type(f"My{base.__name__}", (base,), {"__init__": __init__, **methods})


def _bases():
    from shardloader.recordio import ImageRecordDataset

    return {
        "ImageRecordDataset": ImageRecordDataset,
        "gluon ImageRecordDataset": mx.gluon.data.vision.ImageRecordDataset,
    }


@pytest.mark.parametrize("key", ["ImageRecordDataset", "gluon ImageRecordDataset"])
def test_a_subclass_that_replaces_nothing_is_fused_and_one_that_does_is_not(rec, key):
    from shardloader.vision import _sources

    base = _bases()[key]
    fusion = vision.fuse(_subclass(base)(rec).transform_first(chain()))
    assert (fusion.path, fusion.reason) == ("fused", None)
    for name in _sources.REPLACED[key]:  # every method the table names, one at a time
        method = getattr(base, name)
        sub = _subclass(base, **{name: lambda self, *a, _m=method: _m(self, *a)})
        fusion = vision.fuse(sub(rec).transform_first(chain()))
        assert fusion.reason == (
            f"the dataset (My{base.__name__}) is a subclass of {base.__name__} that overrides "
            f"My{base.__name__}.{name}, which the fused path replaces"
        )


@pytest.fixture(scope="module")
def imagenet_root(tmp_path_factory):
    """gluon-cv's ImageNet layout: root/train/<class>/<image>.jpg."""
    root = tmp_path_factory.mktemp("imagenet")
    for c in range(3):
        folder = root / "train" / f"n0{c}"
        folder.mkdir(parents=True)
        for i in range(4):
            (folder / f"{i}.jpg").write_bytes(pil_jpeg(smooth_image(44 + 4 * c, 52, 10 * c + i)))
    return str(root)


def test_gluoncvs_imagenet_is_fused_under_the_one_import_swap(imagenet_root, no_leaks):
    """gluon-cv's ``ImageNet`` (an ImageFolderDataset subclass that only sets ``root`` and
    ``flag``) with its validation chain: fused, with the exact path's batches."""
    ImageNet = pytest.importorskip("gluoncv.data.imagenet.classification").ImageNet
    from shardloader import ShardedDataLoader as DataLoader  # the one-import swap

    val = T.Compose([T.Resize(40, keep_ratio=True), T.CenterCrop(32), T.ToTensor(),
                     T.Normalize(MEAN, STD)])  # fmt: skip
    dataset = ImageNet(imagenet_root, train=True).transform_first(val)
    out = {}
    for fuse in (True, False):
        with DataLoader(dataset, 4, num_workers=2, fuse_transforms=fuse) as loader:
            out[fuse] = [(d.asnumpy(), y.asnumpy()) for d, y in loader]
            out[fuse, "path"] = loader.stats()["image_path"]
    assert out[True, "path"] == "fused"
    assert out[False, "path"] == "exact: fuse_transforms=False"
    for (a, ya), (b, yb) in zip(out[True], out[False]):
        np.testing.assert_array_equal(ya, yb)
        np.testing.assert_allclose(a, b, atol=1.01 / 255 / min(STD))


def test_a_gluoncv_style_subclass_overriding_getitem_keeps_the_exact_path(imagenet_root):
    base = mx.gluon.data.vision.ImageFolderDataset
    sub = _subclass(base, __getitem__=lambda self, idx: base.__getitem__(self, idx))
    dataset = sub(imagenet_root + "/train").transform_first(chain())
    with ShardedDataLoader(dataset, 4) as loader:
        assert loader.stats()["image_path"] == (
            "exact: the dataset (MyImageFolderDataset) is a subclass of ImageFolderDataset "
            "that overrides MyImageFolderDataset.__getitem__, which the fused path replaces"
        )


# -- OpenCV's threads in the workers --------------------------------------------------------------


class _ReportThreads(FusedBatchify):
    """The fused batchify function, which also gives ``cv2.getNumThreads()`` in the process
    that made the batch, read after the fused step ran there."""

    def __call__(self, samples):
        import cv2

        images = super().__call__(samples)[0]
        return images, np.full(len(samples), cv2.getNumThreads(), np.int32)


@pytest.fixture
def cv2_threads():
    """OpenCV set to 3 threads in this process (not 1, whatever the cores), restored after."""
    import cv2

    before = cv2.getNumThreads()
    cv2.setNumThreads(3)
    yield cv2
    cv2.setNumThreads(before)


def _threads_seen(rec, **options):
    from shardloader.recordio import ImageRecordDataset

    fusion = vision.fuse(ImageRecordDataset(rec).transform_first(chain()))
    assert fusion.path == "fused"
    fused = fusion.batchify_fn
    with ShardedDataLoader(
        fusion.dataset,
        4,
        batchify_fn=_ReportThreads(fused.pipeline, fused.rest_batchify),
        seed=0,
        **options,
    ) as loader:
        seen = {int(t) for _, threads in loader for t in np.asarray(threads)}
    return seen


_FORKED_PROGRAM = """
import sys, cv2, numpy as np
from mxnet.gluon.data.vision import transforms as T
from shardloader import ShardedDataLoader, vision
from shardloader.recordio import ImageRecordDataset
from shardloader.vision._fused import FusedBatchify

class Report(FusedBatchify):
    def __call__(self, samples):
        images = super().__call__(samples)[0]
        return images, np.full(len(samples), cv2.getNumThreads(), np.int32)

cv2.setNumThreads(3)
chain = T.Compose([T.RandomResizedCrop(64), T.RandomFlipLeftRight(), T.ToTensor()])
fusion = vision.fuse(ImageRecordDataset(sys.argv[1]).transform_first(chain))
fused = fusion.batchify_fn
report = Report(fused.pipeline, fused.rest_batchify)
with ShardedDataLoader(fusion.dataset, 4, batchify_fn=report, num_workers=2) as loader:
    seen = {int(t) for _, threads in loader for t in np.asarray(threads)}
print(sorted(seen), cv2.getNumThreads())
"""


def test_a_forked_worker_runs_opencv_on_one_thread_and_the_users_process_keeps_its_own(rec):
    """A training process that has not run OpenCV itself, as a fresh program: before, each
    fork worker kept OpenCV's pool (here the 3 threads the program set), so with other work
    on the machine the cores were oversubscribed."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _FORKED_PROGRAM, rec], capture_output=True, text=True, timeout=90
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[-2] == "[1] 3"


def test_a_forkserver_worker_runs_opencv_on_one_thread(rec, cv2_threads, no_leaks):
    assert _threads_seen(rec, num_workers=2, start_method="forkserver") == {1}
    assert cv2_threads.getNumThreads() == 3


def test_a_worker_forked_after_opencvs_pool_ran_here_gets_one_thread_from_the_parent(
    rec, cv2_threads, no_leaks
):
    """OpenCV's pool threads are not forked: ``cv2.setNumThreads`` in a worker forked once this
    process's pool had run waited for them forever. So the parent sets its own pool to one
    thread just before it forks a worker, and back just after: the worker gets one thread
    and never touches the pool, and this process keeps its 3, fork after fork."""
    import time

    for _ in range(2):
        cv2_threads.resize(np.zeros((2000, 2000), np.uint8), (1000, 1000))  # the pool runs here
        time.sleep(0.2)  # and its threads go idle
        assert _threads_seen(rec, num_workers=2, start_method="fork") == {1}
        assert cv2_threads.getNumThreads() == 3


def test_shardloader_cv2_threads_sets_the_workers_pool(rec, cv2_threads, monkeypatch, no_leaks):
    from shardloader.vision import _codecs

    # spawn: a fresh process with this environment, whatever OpenCV has run in this one
    monkeypatch.setenv("SHARDLOADER_CV2_THREADS", "5")  # not OpenCV's default (the cores)
    assert _threads_seen(rec, num_workers=1, start_method="spawn") == {5}
    for value, threads in (("", 1), (" 0 ", 0), ("4", 4), ("keep", None), ("KEEP", None)):
        monkeypatch.setenv("SHARDLOADER_CV2_THREADS", value)
        assert _codecs.worker_threads() == threads
    for value in ("many", "-1", "1.5"):
        monkeypatch.setenv("SHARDLOADER_CV2_THREADS", value)
        with pytest.raises(ValueError, match=f"SHARDLOADER_CV2_THREADS must be .*got '{value}'"):
            _codecs.worker_threads()


@pytest.mark.timeout(120)
def test_loaders_starting_fork_workers_at_once_leave_the_users_count(rec, cv2_threads, no_leaks):
    """A train and a val loader may start their workers at the same moment, each from its own
    thread: every worker gets one thread, and the parent's count comes back whatever order
    the forks interleave in (the first in saves it, the last out restores it)."""
    import threading

    seen, errors = [], []

    def start():
        try:
            seen.append(_threads_seen(rec, num_workers=2, start_method="fork"))
        except BaseException as exc:  # reported below, on the test's thread
            errors.append(exc)

    for _ in range(3):
        threads = [threading.Thread(target=start) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors and not any(t.is_alive() for t in threads)
        assert cv2_threads.getNumThreads() == 3
    assert seen == [{1}] * 9


@pytest.mark.timeout(60)
def test_a_bad_shardloader_cv2_threads_reaches_the_user_from_a_forked_worker(
    rec, cv2_threads, monkeypatch, no_leaks
):
    """The fork handler cannot raise into ``Process.start()``: it leaves the pool alone, and
    the worker raises the variable's error with its batch, where the user sees it."""
    monkeypatch.setenv("SHARDLOADER_CV2_THREADS", "many")
    with pytest.raises(ValueError, match="SHARDLOADER_CV2_THREADS must be .*got 'many'"):
        _threads_seen(rec, num_workers=1, start_method="fork")
    assert cv2_threads.getNumThreads() == 3


def test_thread_workers_and_no_workers_leave_opencv_as_the_user_set_it(rec, cv2_threads):
    """``cv2.setNumThreads`` is process-wide: in thread workers it would be the user's."""
    assert _threads_seen(rec, num_workers=2, thread_pool=True) == {3}
    assert _threads_seen(rec, num_workers=0) == {3}
    assert cv2_threads.getNumThreads() == 3


# -- the Step contract ----------------------------------------------------------------------------


def _gluon_samples():
    """One instance of every Gluon transform ``recognise._RECOGNISED`` builds a step for."""
    found = [
        T.Resize(8),
        T.CenterCrop(8),
        T.RandomResizedCrop(8),
        T.RandomFlipLeftRight(),
        T.RandomFlipTopBottom(),
    ]
    optional = {
        "CropResize": (0, 0, 4, 4),
        "RandomBrightness": (0.1,),
        "RandomContrast": (0.1,),
        "RandomSaturation": (0.1,),
        "RandomLighting": (0.1,),
        "RandomColorJitter": (0.1, 0.1, 0.1),
    }
    found += [getattr(T, name)(*args) for name, args in optional.items() if hasattr(T, name)]
    return found


def _step_classes():
    """Every class below ``StepBase``, and the class of every step ``_RECOGNISED`` builds."""
    from shardloader.vision import _color, _ops, recognise  # noqa: F401 - define the steps
    from shardloader.vision._step import StepBase

    classes, todo = set(), [StepBase]
    while todo:
        for sub in todo.pop().__subclasses__():
            classes.add(sub)
            todo.append(sub)
    built = {type(recognise._RECOGNISED[type(t)](t, 1)) for t in _gluon_samples()}
    return classes | built


def test_every_recognised_transform_has_a_sample_here():
    from shardloader.vision import recognise

    assert {type(t) for t in _gluon_samples()} == set(recognise._RECOGNISED)


@pytest.mark.parametrize("cls", sorted(_step_classes(), key=lambda c: c.__name__))
def test_every_image_step_keeps_the_step_contract(cls):
    """Each member of ``_step.Step``: a bool attribute, or a method taking as many positional
    parameters as the protocol's (the pipeline passes them by position); a new step that
    misses one, or takes other arguments, fails here."""
    import inspect

    from shardloader.vision._step import Step

    for name in Step.__annotations__:
        assert isinstance(getattr(cls, name, None), bool), f"{cls.__name__}.{name}"
    methods = [n for n, v in vars(Step).items() if inspect.isfunction(v) and n[0] != "_"]
    assert {"draw", "size", "apply", "write_flip", "decode_floor", "apply_reduced"} <= set(methods)
    for name in methods:
        method = getattr(cls, name, None)
        assert callable(method), f"{cls.__name__} has no {name}()"
        want = list(inspect.signature(getattr(Step, name)).parameters)
        got = list(inspect.signature(method).parameters)
        assert len(got) == len(want), f"{cls.__name__}.{name}{tuple(got)}: Step says {tuple(want)}"
        assert getattr(Step, name) is not method, f"{cls.__name__}.{name} is the protocol's stub"
