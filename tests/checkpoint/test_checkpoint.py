"""`adloco_hf.checkpoint.folders`'s file handling: atomic folders and files, per-rank resume state, model folders."""

import json
import os

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from adloco_hf.checkpoint.folders import (
    load_rank_state,
    rank_state_path,
    save_model_folder,
    save_rank_state,
    state_dict_with,
)
from adloco_hf.common.files import atomic_directory, atomic_write_text, publish_files, replace_directory


def tree(root) -> dict[str, str]:
    """{relative path: text} of every file under root."""
    files = {}
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            path = os.path.join(dirpath, name)
            with open(path, encoding="utf-8") as f:
                files[os.path.relpath(path, root)] = f.read()
    return files


def write(path, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


# ---- atomic_directory ----
def test_atomic_directory_creates_a_new_folder(tmp_path):
    final = tmp_path / "deep" / "ckpt"
    with atomic_directory(str(final)) as tmp:
        assert os.path.dirname(tmp) == str(final.parent) and not final.exists()
        write(os.path.join(tmp, "sub", "a.txt"), "new")
    assert tree(final) == {os.path.join("sub", "a.txt"): "new"}
    assert os.listdir(final.parent) == ["ckpt"]


def test_atomic_directory_replaces_an_existing_folder(tmp_path):
    final = tmp_path / "ckpt"
    write(final / "old.txt", "old")
    write(final / "shared.txt", "old")
    with atomic_directory(str(final)) as tmp:
        assert tree(final) == {"old.txt": "old", "shared.txt": "old"}  # readers see the old folder until the end
        write(os.path.join(tmp, "shared.txt"), "new")
    assert tree(final) == {"shared.txt": "new"}  # replaced, not merged
    assert os.listdir(tmp_path) == ["ckpt"]  # neither the temporary nor the old folder is left


def test_atomic_directory_error_leaves_the_old_folder_untouched(tmp_path):
    final = tmp_path / "ckpt"
    write(final / "model.txt", "complete")
    with pytest.raises(RuntimeError, match="died while saving"), atomic_directory(str(final)) as tmp:
        write(os.path.join(tmp, "model.txt"), "half")
        raise RuntimeError("died while saving")
    assert tree(final) == {"model.txt": "complete"}
    assert os.listdir(tmp_path) == ["ckpt"]

    with pytest.raises(KeyboardInterrupt), atomic_directory(str(tmp_path / "fresh")):
        raise KeyboardInterrupt
    assert os.listdir(tmp_path) == ["ckpt"]


# ---- atomic_write_text ----
def test_atomic_write_text(tmp_path):
    path = tmp_path / "note.txt"
    atomic_write_text(str(path), "first\n")
    assert path.read_text(encoding="utf-8") == "first\n"
    atomic_write_text(str(path), "second: ∑ ✓")
    assert path.read_text(encoding="utf-8") == "second: ∑ ✓"
    atomic_write_text(str(path), "")
    assert path.read_text() == ""
    assert os.listdir(tmp_path) == ["note.txt"]


# ---- replace_directory ----
def test_replace_directory_moves_into_place(tmp_path):
    write(tmp_path / "tmp" / "a.txt", "mine")
    replace_directory(str(tmp_path / "tmp"), str(tmp_path / "final"))
    assert tree(tmp_path / "final") == {"a.txt": "mine"}
    assert not (tmp_path / "tmp").exists()


def test_replace_directory_keeps_a_folder_another_process_wrote_first(tmp_path):
    write(tmp_path / "final" / "a.txt", "theirs")
    write(tmp_path / "tmp" / "a.txt", "mine")
    replace_directory(str(tmp_path / "tmp"), str(tmp_path / "final"))
    assert tree(tmp_path / "final") == {"a.txt": "theirs"}


def test_replace_directory_raises_when_nothing_usable_is_there(tmp_path):
    write(tmp_path / "tmp" / "a.txt", "mine")
    (tmp_path / "final").write_text("a file, not a folder")
    with pytest.raises(OSError):
        replace_directory(str(tmp_path / "tmp"), str(tmp_path / "final"))
    with pytest.raises(OSError):
        replace_directory(str(tmp_path / "missing"), str(tmp_path / "elsewhere"))
    assert tree(tmp_path / "tmp") == {"a.txt": "mine"}


# ---- publish_files ----
def test_publish_files_moves_the_marker_last(tmp_path, monkeypatch):
    source, target = tmp_path / "tmp", tmp_path / "target"
    for name in ("a.bin", "z.bin", "DONE", "m.json"):
        write(source / name, f"new {name}")
    write(target / "a.bin", "old a.bin")
    write(target / "DONE", "old DONE")
    write(target / "keep.txt", "untouched")

    real_replace = os.replace
    marker_seen = []  # for each move: whether a marker was in the target just before it

    def watching_replace(src, dst):
        marker_seen.append((os.path.basename(src), os.path.exists(target / "DONE")))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", watching_replace)
    publish_files(str(source), str(target), last="DONE")
    monkeypatch.undo()

    # The old marker went first (never paired with new files), the new one came after every other file.
    assert [name for name, _ in marker_seen][-1] == "DONE"
    assert sorted(name for name, _ in marker_seen) == ["DONE", "a.bin", "m.json", "z.bin"]
    assert not any(seen for _, seen in marker_seen)
    assert tree(target) == {
        "a.bin": "new a.bin",
        "z.bin": "new z.bin",
        "m.json": "new m.json",
        "DONE": "new DONE",
        "keep.txt": "untouched",
    }
    assert os.listdir(source) == []


def test_publish_files_into_a_target_without_marker(tmp_path):
    write(tmp_path / "tmp" / "x", "1")
    write(tmp_path / "tmp" / "READY", "")
    os.makedirs(tmp_path / "target")
    publish_files(str(tmp_path / "tmp"), str(tmp_path / "target"), last="READY")
    assert tree(tmp_path / "target") == {"x": "1", "READY": ""}


# ---- per-rank resume state ----
def test_rank_state_round_trip(tmp_path):
    state = {
        "outer_step": 7,
        "instance": 2,
        "workers": [1, 2],
        "lr_factor": 0.5,
        "note": "resume",
        "nested": {"momentum": torch.arange(6, dtype=torch.float32).reshape(2, 3), "count": 3},
        "phi": torch.randn(4, dtype=torch.bfloat16),
    }
    path = save_rank_state(str(tmp_path), 3, state)
    assert path == rank_state_path(str(tmp_path), 3) == str(tmp_path / "adloco" / "rank-3.pt")
    assert os.listdir(tmp_path / "adloco") == ["rank-3.pt"]  # no temporary file left

    loaded = load_rank_state(str(tmp_path), 3)
    assert loaded.pop("version") == 1
    assert loaded.keys() == state.keys()
    for key in ("outer_step", "instance", "workers", "lr_factor", "note"):
        assert loaded[key] == state[key]
    assert loaded["nested"]["count"] == 3
    assert torch.equal(loaded["nested"]["momentum"], state["nested"]["momentum"])
    assert loaded["phi"].dtype == torch.bfloat16 and torch.equal(loaded["phi"], state["phi"])

    save_rank_state(str(tmp_path), 3, {"outer_step": 8})  # overwrites
    assert load_rank_state(str(tmp_path), 3)["outer_step"] == 8
    with pytest.raises(FileNotFoundError, match="rank-4.pt is missing"):
        load_rank_state(str(tmp_path), 4)


def test_rank_state_of_another_version_is_refused(tmp_path):
    path = rank_state_path(str(tmp_path), 0)
    os.makedirs(os.path.dirname(path))
    torch.save({"version": 2, "outer_step": 1}, path)
    with pytest.raises(ValueError, match="state version 2, expected 1"):
        load_rank_state(str(tmp_path), 0)
    torch.save({"outer_step": 1}, path)
    with pytest.raises(ValueError, match="state version None"):
        load_rank_state(str(tmp_path), 0)


# ---- model folders ----
def tiny_llama(seed: int = 0) -> LlamaForCausalLM:
    """A 2-layer Llama built from a config written here: nothing is downloaded."""
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def test_state_dict_with_replaces_casts_and_moves_to_cpu():
    model = tiny_llama().to(torch.bfloat16)
    name = "model.layers.0.mlp.up_proj.weight"
    shape = model.state_dict()[name].shape
    replacement = torch.linspace(-1, 1, shape.numel(), dtype=torch.float64).reshape(shape[::-1]).t()  # not contiguous
    state = state_dict_with(model, {name: replacement})

    assert state.keys() == model.state_dict().keys()
    assert state[name].dtype == torch.bfloat16 and state[name].is_contiguous()
    assert torch.equal(state[name], replacement.to(torch.bfloat16))
    for key, tensor in model.state_dict().items():
        assert state[key].device.type == "cpu" and state[key].dtype == tensor.dtype
        if key != name:
            assert torch.equal(state[key], tensor)
    assert not torch.equal(model.state_dict()[name], state[name])  # the model itself is not changed


def test_save_model_folder_is_loadable_with_equal_weights(tmp_path):
    model = tiny_llama(seed=0)
    other = tiny_llama(seed=1)
    # Save `model`'s architecture with the weights of `other` for one layer, as a merge does.
    replaced = {k: v for k, v in other.state_dict().items() if k.startswith("model.layers.1.")}
    state = state_dict_with(model, replaced)
    folder = tmp_path / "merged"
    write(folder / "stale.txt", "from an earlier save")

    returned = save_model_folder(
        str(folder),
        model,
        state_dict=dict(state),  # a copy: transformers' save_pretrained pops the entries it writes
        card="# tiny\n",
        extra_files={"adloco_summary.json": {"rounds": 3, "instances": [0, 1]}},
    )
    assert returned == str(folder)
    names = set(os.listdir(folder))
    assert {"config.json", "model.safetensors", "README.md", "adloco_summary.json"} <= names
    assert "stale.txt" not in names  # the folder was replaced, not added to
    assert [p for p in os.listdir(tmp_path) if p != "merged"] == []
    assert (folder / "README.md").read_text(encoding="utf-8") == "# tiny\n"
    assert json.loads((folder / "adloco_summary.json").read_text()) == {"rounds": 3, "instances": [0, 1]}

    loaded = LlamaForCausalLM.from_pretrained(str(folder))
    assert loaded.config.hidden_size == 32 and loaded.config.num_hidden_layers == 2
    loaded_state = loaded.state_dict()
    assert loaded_state.keys() == state.keys()
    for key, tensor in state.items():
        assert torch.equal(loaded_state[key], tensor), key
    q_proj = "model.layers.{}.self_attn.q_proj.weight"
    assert torch.equal(loaded_state[q_proj.format(1)], other.state_dict()[q_proj.format(1)])
    assert not torch.equal(loaded_state[q_proj.format(1)], model.state_dict()[q_proj.format(1)])
    assert torch.equal(loaded_state[q_proj.format(0)], model.state_dict()[q_proj.format(0)])


def test_save_model_folder_without_state_dict_saves_the_model(tmp_path):
    model = tiny_llama(seed=2)
    save_model_folder(str(tmp_path / "m"), model)
    assert "README.md" not in os.listdir(tmp_path / "m")
    loaded = LlamaForCausalLM.from_pretrained(str(tmp_path / "m"))
    for key, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], tensor), key
