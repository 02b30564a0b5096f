"""BlurBall in the reader's browser: onnxruntime-web's files, the checked clip, native figures (Chapter 4)."""
from __future__ import annotations

import contextlib
import hashlib
import html
import json
import shutil
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np
import onnx
import pandas as pd
import torch

from graphbook.config import SAME_OUTPUT_ATOL
from graphbook.measure import timing
from graphbook.model import blurball
from graphbook.paths import REPO_ROOT
from graphbook.record.cli import make_parser
from graphbook import checks
from graphbook.runtimes import onnx_utils

#: The sizes the page offers (height, width); the first is the default, the second is on request.
SIZES: dict[str, tuple[int, int]] = {"96x160": (96, 160), "288x512": (288, 512)}
DEFAULT_SIZE = "96x160"
#: Graph optimization levels the page compares (onnxruntime-web's names, which are also the book's).
LEVELS = ("disabled", "all")
#: A model file the page downloads may not be larger than this (bytes).
MAX_MODEL_BYTES = 8_000_000
#: Where the pinned onnxruntime-web is installed (package.json + package-lock.json, ``npm ci``).
WEB_PACKAGE_DIR = REPO_ROOT / "_ext" / "ortweb"
#: Where ``scripts/setup_web.sh`` writes the exported models, clips and references (not committed).
ASSETS_DIR = WEB_PACKAGE_DIR / "assets"
#: The page's own script (committed); copied with the rest of ``_ext/static`` by Sphinx.
WIDGET_JS = REPO_ROOT / "_ext" / "static" / "ortweb" / "widget.js"
#: The runtime files the WebAssembly provider loads (on click): loader, its worker glue, the binary.
RUNTIME_FILES = ("ort.wasm.min.mjs", "ort-wasm-simd-threaded.mjs", "ort-wasm-simd-threaded.wasm")
#: The WebGPU build, loaded only when the browser offers WebGPU and the reader picks it.
WEBGPU_FILES = ("ort.webgpu.min.mjs", "ort-wasm-simd-threaded.asyncify.mjs", "ort-wasm-simd-threaded.asyncify.wasm")
MANIFEST = "manifest.json"
#: The columns of the one CSV row a reader downloads (the results schema's names where they exist).
READER_COLUMNS = ("run_id", "date", "variant", "browser", "user_agent", "execution_provider", "threads",
                  "cross_origin_isolated", "hardware_concurrency", "onnxruntime_web", "height", "width",
                  "warmup", "repeats", "median_ms_disabled", "min_ms_disabled", "max_ms_disabled",
                  "median_ms_all", "min_ms_all", "max_ms_all", "max_abs_diff", "relative_diff", "same_output",
                  "same_peak_frames", "peak_frames", "same_peaks", "model_file", "model_sha256",
                  "native_median_ms_all", "native_threads", "native_cpu")


class BrowserAssetsError(RuntimeError):
    """The browser page's files are missing or do not match their manifest (Chapter 4)."""


def _parse_sizes(text: str | Iterable[str]) -> tuple[str, ...]:
    """Validated size keys from ``"96x160,288x512"`` or a list; ValueError names the known ones (Chapter 4)."""
    keys = [k.strip() for k in (text.split(",") if isinstance(text, str) else text)]
    bad = [k for k in keys if k not in SIZES]
    if not keys or bad:
        raise ValueError(f"unknown size(s) {bad or keys}: choose from {', '.join(SIZES)}")
    return tuple(dict.fromkeys(keys))


def onnxruntime_web_version(package_dir: Path = WEB_PACKAGE_DIR) -> str:
    """The onnxruntime-web version pinned in package-lock.json (Chapter 4)."""
    lock = json.loads((Path(package_dir) / "package-lock.json").read_text())
    return lock["packages"]["node_modules/onnxruntime-web"]["version"]


def _sha256(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def export_browser_assets(out_dir: str | Path = ASSETS_DIR, sizes: Sequence[str] = tuple(SIZES), *,
                          build_model: Callable | None = None, force: bool = False) -> dict:
    """Export the page's models, clips and references into ``out_dir``; return the manifest (Chapter 4)."""
    out = Path(out_dir)
    sizes = _parse_sizes(sizes)
    builder = build_model or blurball.build_blurball
    depends_on = [torch.__version__, getattr(builder, "__qualname__", repr(builder)),  # and the export's code:
                  *(Path(f).read_text() for f in (blurball.__file__, onnx_utils.__file__, __file__))]
    stamp = hashlib.sha256("\n".join(depends_on).encode()).hexdigest()[:16]
    manifest_path = out / MANIFEST
    if manifest_path.exists() and not force:
        old = json.loads(manifest_path.read_text())
        if old.get("stamp") == stamp and set(sizes) <= set(old.get("sizes", {})):
            with contextlib.suppress(BrowserAssetsError):  # a file was removed or changed: export again
                check_assets(out, sizes)
                return old
    out.mkdir(parents=True, exist_ok=True)
    model = builder()
    manifest = {"stamp": stamp, "atol": SAME_OUTPUT_ATOL, "input_name": None,
                "columns": list(READER_COLUMNS), "levels": list(LEVELS), "default_size": sizes[0], "sizes": {}}
    for key in sizes:
        height, width = SIZES[key]
        x = blurball.example_input(height=height, width=width)
        with torch.no_grad():
            reference = model(x)
        model_path = onnx_utils.export_onnx(model, x, out / f"blurball_{key}.onnx", external_data=False)
        n_bytes = model_path.stat().st_size
        if n_bytes > MAX_MODEL_BYTES:
            raise BrowserAssetsError(f"{model_path.name} is {n_bytes / 1e6:.1f} MB, over the page's "
                                     f"{MAX_MODEL_BYTES / 1e6:.0f} MB limit")
        clip, ref = out / f"clip_{key}.bin", out / f"reference_{key}.bin"
        clip.write_bytes(x.numpy().astype("<f4").tobytes())
        ref.write_bytes(reference.numpy().astype("<f4").tobytes())

        graph = onnx.load(str(model_path), load_external_data=False).graph
        manifest["input_name"] = graph.input[0].name
        manifest["sizes"][key] = {
            "height": height, "width": width, "model": model_path.name, "model_bytes": n_bytes,
            "model_sha256": _sha256(model_path), "clip": clip.name, "input_shape": list(x.shape),
            "reference": ref.name, "output_shape": list(reference.shape), "reference_sha256": _sha256(ref),
            "peaks": blurball.heatmap_peaks(reference).reshape(-1, 2).tolist(),
            "peak_margin": blurball.peak_margin(reference)}
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def load_manifest(assets_dir: str | Path = ASSETS_DIR) -> dict:
    """The manifest written by :func:`export_browser_assets`; BrowserAssetsError says how to make it (Chapter 4)."""
    path = Path(assets_dir) / MANIFEST
    if not path.exists():
        raise BrowserAssetsError(f"{path} is missing: run `bash scripts/setup_web.sh` to export the page's models")
    return json.loads(path.read_text())


def check_assets(assets_dir: str | Path = ASSETS_DIR, sizes: Sequence[str] | None = None) -> dict:
    """The manifest, after checking that every file it names exists with its recorded size and sum (Chapter 4)."""
    assets_dir = Path(assets_dir)
    manifest = load_manifest(assets_dir)
    for key in sizes or manifest["sizes"]:
        entry = manifest["sizes"].get(key)
        if entry is None:
            raise BrowserAssetsError(f"{assets_dir / MANIFEST} has no {key} model: run scripts/setup_web.sh")
        for name, digest in ((entry["model"], entry["model_sha256"]), (entry["reference"], entry["reference_sha256"])):
            path = assets_dir / name
            if not path.exists() or _sha256(path) != digest:
                raise BrowserAssetsError(f"{path} is missing or differs from its manifest: run scripts/setup_web.sh")
        if not (assets_dir / entry["clip"]).exists():
            raise BrowserAssetsError(f"{assets_dir / entry['clip']} is missing: run scripts/setup_web.sh")
    return manifest


def _read_tensor(path: str | Path, shape: Sequence[int]) -> np.ndarray:
    """A float32 little-endian file as an array of ``shape`` (Chapter 4)."""
    return np.fromfile(path, dtype="<f4").reshape(tuple(shape))


def runtime_dir(package_dir: Path = WEB_PACKAGE_DIR) -> Path:
    """onnxruntime-web's ``dist/`` as installed by ``npm ci``; BrowserAssetsError when absent (Chapter 4)."""
    dist = Path(package_dir) / "node_modules" / "onnxruntime-web" / "dist"
    if not (dist / RUNTIME_FILES[0]).exists():
        raise BrowserAssetsError(f"onnxruntime-web is not installed in {package_dir}: run `bash scripts/setup_web.sh`")
    return dist


def publish(dest: str | Path, assets_dir: str | Path = ASSETS_DIR, *, webgpu: bool = True,
            widget: bool = False) -> list[Path]:
    """Copy only what the page needs into ``dest``: runtime files, models, clips, references (Chapter 4)."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    manifest = check_assets(assets_dir)
    dist = runtime_dir()
    names = [(dist, n) for n in RUNTIME_FILES + (WEBGPU_FILES if webgpu else ())]
    for entry in manifest["sizes"].values():
        names += [(Path(assets_dir), entry[k]) for k in ("model", "clip", "reference")]
    names.append((Path(assets_dir), MANIFEST))
    if widget:
        names.append((WIDGET_JS.parent, WIDGET_JS.name))
    copied = []
    for folder, name in names:
        target = dest / name
        if not target.exists() or target.stat().st_size != (folder / name).stat().st_size \
                or target.stat().st_mtime < (folder / name).stat().st_mtime:
            shutil.copy2(folder / name, target)
        copied.append(target)
    return copied


# ---- Native ONNX Runtime on the same files
def compare(output, assets_dir: str | Path, key: str) -> dict:
    """An output against the stored reference of size ``key``: the book's one rule (Chapter 4)."""
    manifest = load_manifest(assets_dir)
    entry = manifest["sizes"][key]
    reference = _read_tensor(Path(assets_dir) / entry["reference"], entry["output_shape"])
    verdict = checks.compare_to_reference(np.asarray(output), reference, atol=manifest["atol"])

    peaks = blurball.heatmap_peaks(torch.from_numpy(np.asarray(output))).reshape(-1, 2).tolist()
    verdict["same_peaks"] = bool(verdict.get("same_peaks", True) and peaks == entry["peaks"])
    verdict["passed"] = bool(verdict["same_output"] and verdict["same_peaks"])
    return verdict


def check_native(assets_dir: str | Path, key: str, *, level: str = "all", threads: int = 1, warmup: int = 2,
                 repeats: int = 10) -> tuple[dict, dict]:
    """Native ONNX Runtime on the page's file of size ``key``: the check, then its times if it passed (Chapter 4)."""
    entry = load_manifest(assets_dir)["sizes"][key]
    clip = _read_tensor(Path(assets_dir) / entry["clip"], entry["input_shape"])
    session = onnx_utils.make_session(Path(assets_dir) / entry["model"], level=level, threads=threads)
    check = compare(onnx_utils.run_session(session, clip), assets_dir, key)
    if not check["passed"]:
        return check, {}
    feed = {session.get_inputs()[0].name: clip}
    return check, timing.time_cpu(lambda: session.run(None, feed), warmup=warmup, repeats=repeats).as_dict()


def native_figures(assets_dir: str | Path = ASSETS_DIR, *, sizes: Sequence[str] = tuple(SIZES),
                   levels: Sequence[str] = LEVELS, threads: int = 1, warmup: int = 2,
                   repeats: Mapping[str, int] | int = 10):
    """Native ONNX Runtime on the page's files: one row per size and level, checked first (Chapter 4)."""
    manifest = check_assets(assets_dir, sizes)
    rows = []
    for key in sizes:
        entry = manifest["sizes"][key]
        n = repeats[key] if isinstance(repeats, Mapping) else int(repeats)
        for level in levels:
            check, timed = check_native(assets_dir, key, level=level, threads=threads, warmup=warmup, repeats=n)
            rows.append({"size": key, "height": entry["height"], "width": entry["width"], "level": level,
                         "threads": threads, "max_abs_diff": check["max_abs_diff"], "passed": check["passed"],
                         **{k: timed.get(k, float("nan")) for k in ("median_ms", "min_ms", "max_ms")},
                         "repeats": timed.get("repeats", 0)})
    return pd.DataFrame(rows)


def _simd_width_bits(features: Mapping) -> int | None:
    """The widest float vector register of a CPU from :func:`graphbook.measure.environment.cpu_features` (Chapter 4)."""
    return next((bits for flag, bits in (("avx512f", 512), ("avx2", 256), ("neon", 128)) if features.get(flag)), None)


def simd_sentence(features: Mapping) -> str:
    """One clause comparing a CPU's vector width with WebAssembly's 128 bits, from its features (Chapter 4)."""
    width = _simd_width_bits(features)
    if width is None:
        return f"the book cannot tell this CPU's vector width ({features.get('isa', 'unknown')})"
    if width == 128:
        return f"this CPU ({features.get('isa')}) has 128-bit registers too, so the width is no handicap here"
    return (f"this CPU ({features.get('isa')}) has {width}-bit registers, {width // 32} float32 values per "
            f"instruction, {width // 128} times WebAssembly's")


def widget_html(native, *, machine: str, assets_url: str = "../_static/ortweb/") -> str:
    """The page's panel: buttons, status, and the build machine's native figures embedded (Chapter 4)."""
    figures: dict = {}
    for row in native.to_dict("records"):
        ok = row["passed"] and row["median_ms"] == row["median_ms"]
        figures.setdefault(row["size"], {})[row["level"]] = {
            **{k: round(float(row[k]), 2) if ok else None for k in ("median_ms", "min_ms", "max_ms")},
            "threads": int(row["threads"])}
    data = html.escape(json.dumps({"machine": machine, "figures": figures}), quote=True)
    options = "".join(f'<option value="{k}"{" selected" if k == DEFAULT_SIZE else ""}>{k[:k.index("x")]} x '
                      f'{k[k.index("x") + 1:]}{" (default)" if k == DEFAULT_SIZE else " (slower: on request)"}</option>'
                      for k in SIZES)
    return (f'<div class="ortweb-demo" data-ortweb-demo data-assets="{assets_url}" data-native="{data}">\n'
            '<p class="ortweb-status" role="status">The in-browser run needs the built book\'s page with '
            'JavaScript on; nothing has been loaded yet.</p>\n'
            f'<label>Input size <select class="ortweb-size">{options}</select></label>\n'
            '<label>Execution provider <select class="ortweb-ep"><option value="wasm" selected>WebAssembly '
            '(SIMD)</option></select></label>\n'
            '<label>Timed calls <input class="ortweb-repeats" type="number" min="3" max="200" value="10"></label>\n'
            '<div class="ortweb-buttons"><button type="button" class="ortweb-run" disabled>Check, then time'
            '</button> <button type="button" class="ortweb-stop" disabled>Stop</button> '
            '<button type="button" class="ortweb-download" disabled>Download my result (CSV)</button></div>\n'
            '<p class="ortweb-env"></p><p class="ortweb-webgpu"></p>\n'
            '<p class="ortweb-check" data-state="not-run">Check: not run yet.</p>\n'
            '<div class="ortweb-results"></div>\n</div>')


def main(argv=None) -> int:
    """``python -m graphbook.runtimes.browser_runtime [--force] [--out DIR]``: export the page's assets (Chapter 4)."""
    parser = make_parser("graphbook.runtimes.browser_runtime", "export the browser page's models, clips and references",
                         results_dir=False)
    parser.add_argument("--out", type=Path, default=ASSETS_DIR, help="folder for the assets (default %(default)s)")
    parser.add_argument("--force", action="store_true", help="export again even if the files are current")
    args = parser.parse_args(argv)
    manifest = export_browser_assets(args.out, force=args.force)
    for key, entry in manifest["sizes"].items():
        print(f"{key}: {entry['model']} {entry['model_bytes'] / 1e6:.2f} MB (limit {MAX_MODEL_BYTES / 1e6:.0f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
