from pathlib import Path

import pytest

from training.vocab import DEFAULT_PATH, vocab_tokens, write_vocab


def test_vocab_committed_file_matches_generator(tmp_path: Path) -> None:
    out = tmp_path / "vocab.txt"
    write_vocab(out)
    assert out.read_bytes() == DEFAULT_PATH.read_bytes()


def test_vocab_layout_and_coverage() -> None:
    tokens = list(vocab_tokens())
    assert len(tokens) == len(set(tokens))
    assert tokens[0] == "[PAD]"
    assert tokens[1:100] == [f"[unused{i}]" for i in range(1, 100)]
    assert tokens[100:104] == ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    present = set(tokens)
    assert all(chr(c) in present for c in range(0x4E00, 0xA000))
    for ch in "《》“”、，。！？；：（）·—…0９ａＺz":
        assert ch in present, ch
    assert "##ing" in present


def test_vocab_demo_models_carry_the_committed_vocab() -> None:
    from nlp.config import DEMO_MODEL_DIR, DEMO_NER_MODEL_DIR

    for directory in (DEMO_MODEL_DIR, DEMO_NER_MODEL_DIR):
        assert (directory / "vocab.txt").read_bytes() == DEFAULT_PATH.read_bytes()


def test_vocab_installed_without_a_vocab_folder_needs_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Installed from the wheel, `python -m training.vocab` wrote into site-packages/vocab/, which
    pip uninstall left behind: there, --out is required."""
    import training.vocab as vocab

    monkeypatch.setattr(vocab, "DEFAULT_PATH", tmp_path / "no-vocab-folder" / "vocab.txt")
    with pytest.raises(SystemExit) as exit_info:
        vocab.main([])
    assert exit_info.value.code == 2 and "--out" in capsys.readouterr().err
    vocab.main(["--out", str(tmp_path / "v.txt")])
    assert (tmp_path / "v.txt").is_file() and not (tmp_path / "no-vocab-folder").exists()
