"""Every item of the source article stays in the book: each is findable in its chapter's prose, as a phrase or as
the glue key of the figure the article quoted (read from data/seed or data/papers). Cutting a chapter cannot drop
one silently. `python tests/test_article_coverage.py` prints the coverage table."""
import json
import re

import pytest

from graphbook import paths

# (article section, item, chapter, patterns that must all match the chapter's Markdown)
ITEMS = [
    ("1", "the chef and the refrigerator", "01", [r"refrigerator", r"cook"]),
    ("1", "fusion: fetch once, do every step, store once", "01", [r"Operator fusion", r"storing the result once"]),
    ("1", "two kinds: folding constants and chaining kernels", "01", [r"Folding constants", r"Chaining kernels"]),
    ("1", "the BN-folding identity", "01", [r"W'_c = s_c W_c", r"b'_c = s_c"]),
    ("2", "BN folding: same result, no time saved (2.6 % and 0 %)", "02",
     [r"art_bn_folding_time_change_run1", r"art_bn_folding_time_change_run2"]),
    ("2", "the element-wise chain four times faster compiled", "02", [r"art_elementwise_chain_speedup_compiled"]),
    ("2", "first compile 5.4 s cold, 0.6 s cached", "02",
     [r"art_first_compile_without_cache", r"art_first_compile_with_cache"]),
    ("2", "manual in-place 7.4 ms, the limit of Python-level work", "02",
     [r"art_manual_inplace_chain_time", r"in-place"]),
    ("3", "TVM's four operator classes", "03", [r"injective", r"reduction", r"complex-out-fusable", r"opaque"]),
    ("3", "TVM: fusion alone 1.2-2x (Fig. 4), 1.6-3.8x end to end", "03", [r"tvm_fusion_low", r"tvm_e2e_low"]),
    ("3", "TorchDynamo captures bytecode and breaks the graph", "03", [r"bytecode", r"graph break"]),
    ("3", "capture overhead about 5 % (Table 2)", "03", [r"paper_capture_pct"]),
    ("3", "TorchInductor generates Triton (GPU) or C++ (CPU)", "03", [r"Triton", r"C\+\+"]),
    ("3", "62 TIMM models: 2.48x FP32, 2.77x FP16 (Table 3)", "03", [r"pt2_timm_fp32", r"pt2_timm_fp16"]),
    ("3", "the FP16 row covers fewer models", "03", [r"pt2_timm_fp16_models"]),
    ("3", "fusion and inlining off: 0.80x (Table 4)", "03", [r"t4_neither", r"inlining"]),
    ("3", "the unattributed 2.27x is not used", "03", [r"highlighted"]),
    ("4", "ONNX, a standard graph file other runtimes read", "04", [r"ONNX"]),
    ("4", "ONNX Runtime's basic, extended and layout levels, all on by default", "04",
     [r"[Bb]asic", r"[Ee]xtended", r"[Ll]ayout", r"default"]),
    ("4", "execution providers: CPU, CUDA, TensorRT, Core ML, WebGPU/WASM", "04",
     [r"execution provider", r"Core ML", r"WebGPU"]),
    ("4", "TensorRT: fuses layers, times kernel candidates, FP16/INT8, engines tied to one GPU", "04",
     [r"TensorRT", r"engine"]),
    ("4", "calibrators (entropy, min-max) deprecated in TensorRT 10.1 for explicit Q/DQ", "04",
     [r"entropy", r"min-max", r"10\.1"]),
    ("5", "BlurBall, three frames, 512x288, batch 1", "05", [r"BlurBall", r"288 x 512", r"batch 1"]),
    ("5", "the eager profile: 478 kernels, 72 convolutions, 71 batch norms", "05",
     [r"art_kernels", r"art_conv_kernels", r"art_bn_kernels"]),
    ("5", "the compiled kernels were not counted", "05", [r"did not count the compiled model's kernels"]),
    ("5", "FP16 and compile multiply (15.09 to 4.34 ms)", "05", [r"art_fp16_compile_over_fp32"]),
    ("5", "CUDA graphs add little (4.61 to 4.34 ms)", "05", [r"art_ro_over_default"]),
    ("5", "max-autotune 45 s, not faster; too few SMs", "05", [r"art_autotune_s", r"too few streaming multiprocessors"]),
    ("5", "channels-last helps FP16, slows FP32", "05", [r"art_cl_fp16", r"art_cl_fp32"]),
    ("5", "cuDNN benchmark made no difference", "05", [r"cuDNN benchmark"]),
    ("5", "'twice as fast' with the same weights and recipe", "05", [r"twice as fast"]),
    ("6", "the first call takes long; every batch size recompiles; warm up 1, 2 and 3", "06",
     [r"1, 2 and 3|1, 2, 3"]),
    ("6", "compile caches on disk (untested in the article)", "06", [r"cache"]),
    ("6", "check correctness separately: fused sums round differently", "06", [r"reorder|order"]),
    ("6", "ONNX Runtime and TensorRT were not measured in the article", "06", [r"TensorRT, which the article could not measure|not measured"]),
    ("6", "one GPU and one model; Transformers may differ", "05", [r"Transformers"]),
    ("7", "verify the ball on ground-truth frames and on the production GPU first", "07", [r"production GPU"]),
    ("7", "warm up batches at start-up; /healthz opens after warm-up", "07", [r"healthz", r"warm"]),
    ("7", "phones and browsers get ONNX", "04", [r"phone", r"browser"]),
]


def _prose(chapter: str) -> str:
    path = next((paths.REPO_ROOT / "chapters").glob(f"{chapter}_*.ipynb"))
    cells = json.loads(path.read_text())["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")


def missing(prose: str, patterns) -> list[str]:
    return [p for p in patterns if not re.search(p, prose)]


@pytest.mark.parametrize("section, item, chapter, patterns", ITEMS, ids=[i[1][:50] for i in ITEMS])
def test_the_article_item_is_in_its_chapter(section, item, chapter, patterns):
    assert not missing(_prose(chapter), patterns), f"Chapter {chapter} lost the article's {item!r}"


def test_the_check_fails_on_a_chapter_without_the_item():
    assert missing("The cook walks to the refrigerator.", [r"refrigerator", r"cook"]) == []
    assert missing("A chapter about something else.", [r"refrigerator"]) == [r"refrigerator"]


if __name__ == "__main__":
    print("| article section | item | chapter |\n|---|---|---|")
    for section, item, chapter, patterns in ITEMS:
        print(f"| {section} | {item} | {chapter}" + ("" if not missing(_prose(chapter), patterns) else " (MISSING)") + " |")
