"""The GGUF conversion cache: a conversion that fails part-way leaves neither a cache nor a temporary folder."""
import pytest
import transformers

from sazo_lite.llm import models


class _Saved:
    def __init__(self, fail: bool):
        self.fail, self.config = fail, type("Config", (), {})()
        self.hf_quantizer = None

    def save_pretrained(self, folder):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "model.safetensors").write_bytes(b"half")
        if self.fail:
            raise OSError("disk full")


@pytest.mark.parametrize("fail", [False, True])
def test_convert_gguf_is_all_or_nothing(tmp_path, monkeypatch, fail):
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: _Saved(fail))
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: _Saved(False))
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"")
    target = tmp_path / "cache"
    if fail:
        with pytest.raises(OSError, match="disk full"):
            models.convert_gguf(gguf, target)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["model.gguf"]
    else:
        assert models.convert_gguf(gguf, target) == target
        assert (target / "model.safetensors").read_bytes() == b"half"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "model.gguf"]
