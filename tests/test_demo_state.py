"""The demo's checkpoint keeps every file it reads, writes and deletes inside its folder."""

from __future__ import annotations

import json
import os
import re

import pytest

from shardloader.tools.demo_state import Checkpoint, CheckpointCorrupt, CheckpointMismatch

pytestmark = pytest.mark.timeout(30)

CONFIG = {"seed": 0, "batch_size": 4}


class FakeNet:
    """Writes and reads parameter files as MXNet's Block would, by path."""

    def __init__(self, value=b"params") -> None:
        self.value = value
        self.loaded = None

    def save_parameters(self, path):
        with open(path, "wb") as f:
            f.write(self.value)

    def load_parameters(self, path, ctx=None):
        with open(path, "rb") as f:
            self.loaded = f.read()


class FakeTrainer(FakeNet):
    save_states = FakeNet.save_parameters

    def load_states(self, path):
        self.load_parameters(path)


class FakeLoader:
    def __init__(self, epoch=0, consumed=0) -> None:
        self.position = {"epoch": epoch, "consumed": consumed}
        self.loaded = None

    def state_dict(self):
        return dict(self.position)

    def load_state_dict(self, state):
        self.loaded = state


def save(checkpoint, epoch, consumed):
    checkpoint.save(FakeNet(), FakeTrainer(b"states"), FakeLoader(epoch, consumed))


def test_save_and_load_round_trip_and_old_files_go(tmp_path):
    checkpoint = Checkpoint(str(tmp_path / "ckpt"), CONFIG)
    save(checkpoint, 0, 3)
    save(checkpoint, 1, 2)
    assert sorted(os.listdir(tmp_path / "ckpt")) == [
        "model-e1-b2.params",
        "state.json",
        "trainer-e1-b2.states",
    ]
    net, trainer, loader = FakeNet(), FakeTrainer(), FakeLoader()
    state = checkpoint.load(net, trainer, loader, ctx=[])
    assert state["loader"] == {"epoch": 1, "consumed": 2} == loader.loaded
    assert (net.loaded, trainer.loaded) == (b"params", b"states")


def tamper(checkpoint_dir, **files):
    path = checkpoint_dir / "state.json"
    state = json.loads(path.read_text())
    state["files"].update(files)
    path.write_text(json.dumps(state))


@pytest.mark.parametrize(
    "kind, name",
    [
        ("params", "ABSOLUTE"),
        ("params", "../outside.params"),
        ("trainer", "../outside"),
        ("trainer", "sub/trainer-e0-b1.states"),
        ("params", "state.json"),
        ("params", ""),
        ("trainer", 7),
        ("params", "model-e0-b1.params\x00"),
    ],
)
def test_names_outside_the_folder_are_refused_and_nothing_is_deleted(tmp_path, kind, name):
    folder = tmp_path / "ckpt"
    outside = tmp_path / "outside"
    outside.write_bytes(b"keep me")
    (tmp_path / "outside.params").write_bytes(b"keep me too")
    if name == "ABSOLUTE":
        name = str(outside)
    checkpoint = Checkpoint(str(folder), CONFIG)
    save(checkpoint, 0, 1)
    tamper(folder, **{kind: name})
    before = sorted(os.listdir(folder))

    pattern = re.escape(f"{folder / 'state.json'}: its {kind} file {name!r} is not a checkpoint")
    with pytest.raises(CheckpointCorrupt, match=pattern):
        checkpoint.load(FakeNet(), FakeTrainer(), FakeLoader(), ctx=[])
    with pytest.raises(CheckpointCorrupt, match=pattern):
        save(checkpoint, 0, 2)  # the save that used to delete the file it named

    assert outside.read_bytes() == b"keep me"
    assert (tmp_path / "outside.params").read_bytes() == b"keep me too"
    assert sorted(os.listdir(folder)) == before  # nothing written, nothing deleted
    assert issubclass(CheckpointCorrupt, CheckpointMismatch)  # the CLI reports it cleanly


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", "cannot be read"),
        ("[1, 2]", "holds a list, not an object"),
        (
            json.dumps({"version": 2, "config": CONFIG, "files": {"params": "model-e0-b1.params"}}),
            "'files' must map",
        ),
    ],
)
def test_a_damaged_state_file_is_named(tmp_path, content, message):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "state.json").write_text(content)
    checkpoint = Checkpoint(str(folder), CONFIG)
    with pytest.raises(CheckpointCorrupt, match=re.escape(message)) as error:
        checkpoint.load(FakeNet(), FakeTrainer(), FakeLoader(), ctx=[])
    assert str(folder / "state.json") in str(error.value)
    assert f"delete {folder} to start over" in str(error.value)


def test_the_state_file_is_not_written_through_a_planted_symlink(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("precious")
    os.symlink(victim, folder / f"state.json.{os.getpid()}.tmp")  # the old predictable name
    checkpoint = Checkpoint(str(folder), CONFIG)
    save(checkpoint, 0, 1)
    assert victim.read_text() == "precious"
    assert json.loads((folder / "state.json").read_text())["loader"]["consumed"] == 1
