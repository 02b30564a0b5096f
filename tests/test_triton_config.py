"""code/triton-models/blurball/config.pbtxt, checked as text (no Triton here): it mirrors the book's server (Chapter 7)
and uses the export's tensor names."""
import re

from graphbook import config
from graphbook.paths import REPO_ROOT
from graphbook.serving import batcher

CONFIG = REPO_ROOT / "code" / "triton-models" / "blurball" / "config.pbtxt"


def _text():
    return "\n".join(line.split("#", 1)[0] for line in CONFIG.read_text().splitlines())


def _value(key):
    found = re.findall(rf"\b{key}:\s*([^\s{{}}\]]+)", _text())
    assert len(found) == 1, f"{key} appears {len(found)} times"
    return found[0].strip('"')


def test_the_balanced_text_mirrors_the_book_server_and_the_articles_input_without_the_batch():
    assert int(_value("max_batch_size")) == max(config.BATCH_SIZES)
    assert int(_value("max_queue_delay_microseconds")) == int(batcher.DEFAULT_MAX_WAIT_MS * 1000)
    assert int(_value("max_queue_size")) == batcher.DEFAULT_MAX_QUEUE
    assert int(_value("default_timeout_microseconds")) == int(batcher.DEFAULT_QUEUE_TIMEOUT_S * 1e6)
    assert _value("timeout_action") == "REJECT"
    warmed = sorted(int(b) for b in re.findall(r"\bbatch_size:\s*(\d+)", _text()))
    assert warmed == sorted(config.BATCH_SIZES)
    threads = re.search(r'key: "intra_op_thread_count" value: \{ string_value: "(\d+)" \}', _text())
    assert threads and int(threads.group(1)) == 2  # the book's threads everywhere
    text = _text()
    for opening, closing in ("{}", "[]"):
        assert text.count(opening) == text.count(closing)
    dims = re.findall(r"dims:\s*\[\s*([\d,\s]+)\]", _text())
    assert dims[0].replace(" ", "") == "9,288,512" and dims[1].replace(" ", "") == "3,288,512"
    assert all(d.replace(" ", "") == "9,288,512" for d in dims[2:])  # every warm-up input


def test_tensor_names_are_those_of_the_export(blurball_dynamic_onnx):
    import onnxruntime as ort

    _, path = blurball_dynamic_onnx   # the book's dynamic-batch export; names do not depend on the weights
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = re.findall(r'name:\s*"([^"]+)"', _text())
    assert session.get_inputs()[0].name in names and session.get_outputs()[0].name in names


def test_no_folder_in_code_can_shadow_a_package():
    # The scripts run with code/ first on the import path, where a folder named like an optional package is a
    # namespace package that hides it (a code/triton folder broke torch's Triton probe): besides
    # graphbook, folders there have names Python cannot import.
    for folder in (REPO_ROOT / "code").iterdir():
        if folder.is_dir() and folder.name not in ("graphbook", "__pycache__"):
            assert not folder.name.isidentifier(), f"code/{folder.name} could shadow a package named {folder.name}"
