// BlurBall in the reader's browser (Chapter 4): onnxruntime-web runs the book's own ONNX file on a fixed
// clip, compares the output with the reference stored with the book, and only then times it.
// Nothing heavy loads with the page: onnxruntime-web (about 14 MB) and the model are fetched on click.
// Every file sits beside this script (graphbook.browser_runtime.publish copies them); no network use
// beyond this site.
const HERE = new URL('./', import.meta.url);
const RUNTIME = { wasm: 'ort.wasm.min.mjs', webgpu: 'ort.webgpu.min.mjs' };
const loaded = {};
let manifestPromise = null;

class CheckFailed extends Error {}
class Stopped extends Error {}

// A tiny module that uses SIMD instructions (the probe of the wasm-feature-detect project):
// WebAssembly.validate says whether this browser's WebAssembly has 128-bit SIMD.
const SIMD_PROBE = new Uint8Array([0, 97, 115, 109, 1, 0, 0, 0, 1, 5, 1, 96, 0, 1, 123, 3, 2, 1, 0, 10, 10, 1, 8, 0,
  65, 0, 253, 15, 253, 98, 11]);

export function capabilities() {
  const wasm = typeof WebAssembly === 'object' && typeof WebAssembly.instantiate === 'function';
  let simd = false;
  try { simd = wasm && WebAssembly.validate(SIMD_PROBE); } catch (e) { simd = false; }
  const isolated = self.crossOriginIsolated === true;
  const cores = navigator.hardwareConcurrency || 1;
  return { wasm, simd, isolated, cores, threads: isolated ? Math.max(1, Math.min(4, cores)) : 1,
           webgpuApi: typeof navigator !== 'undefined' && 'gpu' in navigator };
}

export function manifest() {
  if (!manifestPromise) {
    manifestPromise = fetch(new URL('manifest.json', HERE)).then(r => {
      if (!r.ok) throw new CheckFailed(`the model list (manifest.json) did not load (HTTP ${r.status})`);
      return r.json();
    });
    manifestPromise.catch(() => { manifestPromise = null; });
  }
  return manifestPromise;
}

async function fetchBytes(name, what) {
  let response;
  try { response = await fetch(new URL(name, HERE)); } catch (e) {
    throw new CheckFailed(`the ${what} ${name} did not load (${e.message})`);
  }
  if (!response.ok) throw new CheckFailed(`the ${what} ${name} did not load (HTTP ${response.status})`);
  return new Uint8Array(await response.arrayBuffer());
}

async function runtime(ep, threads) {
  const file = RUNTIME[ep];
  if (!loaded[file]) {
    loaded[file] = import(new URL(file, HERE).href).then(ort => {
      ort.env.wasm.wasmPaths = HERE.href;   // the .wasm and its loader from this site, never a CDN
      ort.env.wasm.numThreads = threads;     // fixed once per page: the runtime starts its threads once
      ort.env.wasm.proxy = false;
      ort.env.logLevel = 'error';
      return ort;
    });
    loaded[file].catch(() => { delete loaded[file]; });
  }
  return loaded[file];
}

// The book's rule (graphbook.results.compare_to_reference): largest |difference| relative to
// max(1, largest |reference|) within the tolerance, and every frame's heatmap peak in the stored pixel.
export function compare(output, reference, entry, atol) {
  let diff = 0, scale = 0;
  if (output.length !== reference.length) {
    return { max_abs_diff: NaN, relative_diff: NaN, same_output: false, same_peak_frames: 0,
             peak_frames: entry.peaks.length, same_peaks: false,
             reason: `the output has ${output.length} values, the reference ${reference.length}` };
  }
  for (let i = 0; i < output.length; i++) {
    const d = Math.abs(output[i] - reference[i]);
    if (!(d <= diff)) diff = d;            // a NaN output makes diff NaN, which fails below
    const r = Math.abs(reference[i]);
    if (r > scale) scale = r;
  }
  const relative = diff / Math.max(1, scale);
  const [, frames, height, width] = entry.output_shape;
  let same = 0;
  for (let f = 0; f < frames; f++) {
    let best = -Infinity, at = 0;
    for (let j = 0, base = f * height * width; j < height * width; j++) {
      if (output[base + j] > best) { best = output[base + j]; at = j; }
    }
    const [row, col] = entry.peaks[f];
    if (Math.floor(at / width) === row && at % width === col) same++;
  }
  return { max_abs_diff: diff, relative_diff: relative, same_output: relative <= atol,
           same_peak_frames: same, peak_frames: frames, same_peaks: same === frames };
}

async function prepare(key, ep, threads, levels, say) {
  if (typeof WebAssembly !== 'object') throw new CheckFailed('this browser has no WebAssembly, so the model cannot run here');
  const m = await manifest();
  const entry = m.sizes[key];
  if (!entry) throw new CheckFailed(`the book has no ${key} model`);
  say(`Loading onnxruntime-web (${ep === 'webgpu' ? 'WebGPU build, about 27 MB' : 'WebAssembly, about 14 MB'}, once per page) ...`);
  let ort;
  try { ort = await runtime(ep, threads); } catch (e) {
    throw new CheckFailed(`onnxruntime-web did not load (${e.message})`);
  }
  say(`Loading the ${key} model (${(entry.model_bytes / 1e6).toFixed(1)} MB), its clip and its reference ...`);
  const [model, clipBytes, refBytes] = await Promise.all([
    fetchBytes(entry.model, 'model file'), fetchBytes(entry.clip, 'clip'), fetchBytes(entry.reference, 'reference')]);
  const clip = new Float32Array(clipBytes.buffer);
  const reference = new Float32Array(refBytes.buffer);
  const feeds = { [m.input_name]: new ort.Tensor('float32', clip, entry.input_shape) };
  const sessions = {}, checks = {};
  for (const level of levels) {
    say(`Checking the output at graph optimization level "${level}" ...`);
    let session;
    try {
      session = await ort.InferenceSession.create(model, { executionProviders: [ep], graphOptimizationLevel: level });
    } catch (e) { throw new CheckFailed(`the model did not load into onnxruntime-web (${e.message || e})`); }
    let output;
    try {
      const result = await session.run(feeds);
      output = result[session.outputNames[0]].data;
    } catch (e) { throw new CheckFailed(`a call failed (${e.message || e})`); }
    checks[level] = compare(output, reference, entry, m.atol);
    sessions[level] = session;
  }
  return { m, entry, ort, feeds, sessions, checks };
}

// One thread runs on the page's own thread, so a call blocks the page: yield to the browser between calls
// (outside the timed interval) so that the Stop button and the progress line stay alive.
const yieldToPage = () => new Promise(resolve => setTimeout(resolve, 0));

async function timeSessions(sessions, feeds, warmup, repeats, stopped, say) {
  const levels = Object.keys(sessions);
  for (const level of levels) {
    for (let i = 0; i < warmup; i++) {
      if (stopped()) throw new Stopped('stopped');
      await sessions[level].run(feeds);
      await yieldToPage();
    }
  }
  const samples = Object.fromEntries(levels.map(l => [l, []]));
  for (let i = 0; i < repeats; i++) {
    const order = i % 2 ? [...levels].reverse() : levels;   // alternate, as the book's harness does
    for (const level of order) {
      if (stopped()) throw new Stopped('stopped');
      const t0 = performance.now();
      await sessions[level].run(feeds);
      samples[level].push(performance.now() - t0);
      await yieldToPage();
    }
    say(`Timing: ${i + 1} of ${repeats} rounds done ...`);
  }
  const stats = {};
  for (const level of levels) {
    const s = [...samples[level]].sort((a, b) => a - b);
    const mid = s.length >> 1;
    stats[level] = { median_ms: s.length % 2 ? s[mid] : (s[mid - 1] + s[mid]) / 2, min_ms: s[0], max_ms: s[s.length - 1],
                     times_ms: samples[level] };   // the readings, so a recording can recompute the rest
  }
  return stats;
}

function passed(check) { return check.same_output && check.same_peaks; }

// The same check-then-time as the reader's button, for scripts (graphbook.browser_measure.browser_benchmark).
export async function benchmark({ size, level = 'all', threads = 1, warmup = 2, repeats = 5, ep = 'wasm' }) {
  const out = { size, level, threads: self.crossOriginIsolated ? threads : 1, error: null };
  let state;
  try {
    state = await prepare(size, ep, threads, [level], () => {});
    Object.assign(out, state.checks[level], { passed: passed(state.checks[level]) });
    if (out.passed) Object.assign(out, (await timeSessions(state.sessions, state.feeds, warmup, repeats, () => false, () => {}))[level]);
  } catch (e) { out.error = e.message || String(e); }
  if (state) for (const s of Object.values(state.sessions)) await s.release();
  return out;
}

function browserName() {
  const ua = navigator.userAgent;
  const brands = navigator.userAgentData && navigator.userAgentData.brands;
  const brand = brands && brands.find(b => !/Not.?A.?Brand/i.test(b.brand) && b.brand !== 'Chromium');
  if (brand) return `${brand.brand} ${brand.version}`;
  for (const [re, name] of [[/Edg\/([\d.]+)/, 'Edge'], [/Firefox\/([\d.]+)/, 'Firefox'], [/Chrom(?:e|ium)\/([\d.]+)/, 'Chromium'],
                            [/Version\/([\d.]+).*Safari/, 'Safari']]) {
    const hit = re.exec(ua);
    if (hit) return `${name} ${hit[1]}`;
  }
  return 'unknown browser';
}

function csvField(value) {
  const text = value === null || value === undefined || (typeof value === 'number' && !Number.isFinite(value)) ? '' : String(value);
  return /[",\n]/.test(text) ? `"${text.replace(/"/g, '""')}"` : text;
}

export function csvRow(columns, values) {
  return columns.join(',') + '\n' + columns.map(c => csvField(values[c])).join(',') + '\n';
}

function fmt(ms) { return ms >= 100 ? ms.toFixed(0) : ms.toFixed(1); }

function mount(root) {
  const q = sel => root.querySelector(sel);
  const status = q('.ortweb-status'), check = q('.ortweb-check'), results = q('.ortweb-results');
  const run = q('.ortweb-run'), stop = q('.ortweb-stop'), download = q('.ortweb-download');
  const native = JSON.parse(root.dataset.native || '{"figures": {}}');
  const caps = capabilities();
  let stopRequested = false, lastRow = null, columns = null;
  const say = text => { status.textContent = text; };
  const setCheck = (state, text) => { check.dataset.state = state; check.textContent = text; };

  q('.ortweb-env').textContent = !caps.wasm ? 'This browser has no WebAssembly, so the model cannot run here.'
    : !caps.simd ? 'This browser\'s WebAssembly has no SIMD, which onnxruntime-web 1.30 needs, so the model cannot run here.'
    : caps.isolated ? `WebAssembly with 128-bit SIMD, ${caps.threads} threads: this page is cross-origin isolated, so the browser allows WebAssembly threads.`
    : 'WebAssembly with 128-bit SIMD, one thread: this page is not cross-origin isolated (its server sends no COOP/COEP headers), so the browser allows no WebAssembly threads.';
  const gpuLine = q('.ortweb-webgpu');
  if (!caps.webgpuApi) {
    gpuLine.textContent = 'This browser offers no WebGPU (navigator.gpu is absent), so only the WebAssembly provider runs here.';
  } else {
    gpuLine.textContent = 'Asking the browser for a WebGPU adapter ...';
    navigator.gpu.requestAdapter().then(adapter => {
      if (!adapter) { gpuLine.textContent = 'This browser has the WebGPU interface but offers no GPU adapter, so only the WebAssembly provider runs here.'; return; }
      const option = document.createElement('option');
      option.value = 'webgpu'; option.textContent = 'WebGPU (loads a further 27 MB)';
      q('.ortweb-ep').appendChild(option);
      gpuLine.textContent = 'This browser offers WebGPU: pick it as the execution provider to run the same check and timing on the GPU.';
    }, () => { gpuLine.textContent = 'This browser refused a WebGPU adapter, so only the WebAssembly provider runs here.'; });
  }
  if (!caps.wasm || !caps.simd) { say('Nothing can run in this browser.'); return; }
  say('Ready. Nothing has been downloaded yet: the button loads onnxruntime-web and the model.');
  run.disabled = false;

  stop.addEventListener('click', () => { stopRequested = true; say('Stopping after the current call ...'); });
  download.addEventListener('click', () => {
    if (!lastRow) return;
    const blob = new Blob([csvRow(columns, lastRow)], { type: 'text/csv' });
    const a = document.createElement('a');
    a.href = URL.createObjectURL(blob);
    a.download = `browser-reader-${lastRow.date.slice(0, 10)}.csv`;   // kind browser-reader (graphbook.results)
    document.body.appendChild(a); a.click(); a.remove();
    setTimeout(() => URL.revokeObjectURL(a.href), 1000);
  });

  run.addEventListener('click', async () => {
    const key = q('.ortweb-size').value, ep = q('.ortweb-ep').value;
    const repeats = Math.max(3, Math.min(200, parseInt(q('.ortweb-repeats').value, 10) || 10));
    const warmup = 2;
    run.disabled = true; stop.disabled = false; download.disabled = true; stopRequested = false; lastRow = null;
    results.replaceChildren(); results.dataset.done = 'false';
    setCheck('running', 'Check: running ...');
    let state = null;
    try {
      state = await prepare(key, ep, caps.threads, ['disabled', 'all'], say);
      columns = state.m.columns;
      const c = state.checks;
      const worst = Math.max(c.disabled.max_abs_diff, c.all.max_abs_diff);
      const peaks = `${Math.min(c.disabled.same_peak_frames, c.all.same_peak_frames)}/${c.all.peak_frames}`;
      if (!passed(c.disabled) || !passed(c.all)) {
        const bad = Object.keys(c).filter(l => !passed(c[l])).join(' and ');
        throw new CheckFailed(`the output at level ${bad} differs from the stored reference: largest difference ` +
          `${Number.isNaN(worst) ? 'not a number' : worst.toExponential(1)} (tolerance ${state.m.atol}), heatmap peaks in the stored pixel in ${peaks} frames`);
      }
      setCheck('pass', `Check passed: the output at both levels is within the book's tolerance of the stored reference ` +
        `(largest difference ${worst.toExponential(1)}, tolerance ${state.m.atol}) and every heatmap peak is in its stored pixel (${peaks} frames).`);
      const stats = await timeSessions(state.sessions, state.feeds, warmup, repeats, () => stopRequested, say);
      const threads = caps.isolated ? caps.threads : 1;
      const mine = native.figures[key] || {};
      const table = document.createElement('table');
      table.className = 'ortweb-table';
      table.innerHTML = '<thead><tr><th>level</th><th>this browser, ms</th><th>native, ms</th><th>browser / native</th></tr></thead>';
      const body = document.createElement('tbody');
      for (const level of ['disabled', 'all']) {
        const s = stats[level], n = mine[level];
        const tr = document.createElement('tr');
        const cells = [level, `${fmt(s.median_ms)} (${fmt(s.min_ms)}-${fmt(s.max_ms)})`,
          n && n.median_ms ? `${fmt(n.median_ms)} (${fmt(n.min_ms)}-${fmt(n.max_ms)})` : 'not measured',
          n && n.median_ms ? `${(s.median_ms / n.median_ms).toFixed(1)}x` : 'not available'];
        for (const text of cells) { const td = document.createElement('td'); td.textContent = text; tr.appendChild(td); }
        body.appendChild(tr);
      }
      table.appendChild(body);
      const box = document.createElement('div');
      box.className = 'ortweb-scroll';
      box.appendChild(table);
      const note = document.createElement('p');
      const nativeThreads = mine.all ? mine.all.threads : null;
      note.textContent = `This browser: ${ep === 'webgpu' ? 'WebGPU' : 'WebAssembly'}, ${threads} thread${threads === 1 ? '' : 's'}, ` +
        `median of ${repeats} calls after ${warmup} warm-up calls per level (min-max in brackets). Native: ONNX Runtime on ` +
        `${native.machine}${nativeThreads ? `, ${nativeThreads} thread${nativeThreads === 1 ? '' : 's'}` : ''}, the same file and size.`;
      results.replaceChildren(box, note);
      results.dataset.done = 'true';
      const date = new Date().toISOString().replace(/\.\d+Z$/, '+00:00');
      lastRow = { run_id: `browser-${date}`, date, variant: `onnxruntime_web_${ep}`, browser: browserName(),
        user_agent: navigator.userAgent, execution_provider: ep, threads, cross_origin_isolated: caps.isolated,
        hardware_concurrency: caps.cores, onnxruntime_web: state.ort.env.versions ? state.ort.env.versions.web : '',
        height: state.entry.height, width: state.entry.width, warmup, repeats,
        median_ms_disabled: stats.disabled.median_ms, min_ms_disabled: stats.disabled.min_ms, max_ms_disabled: stats.disabled.max_ms,
        median_ms_all: stats.all.median_ms, min_ms_all: stats.all.min_ms, max_ms_all: stats.all.max_ms,
        max_abs_diff: worst, relative_diff: Math.max(c.disabled.relative_diff, c.all.relative_diff), same_output: true,
        same_peak_frames: Math.min(c.disabled.same_peak_frames, c.all.same_peak_frames), peak_frames: c.all.peak_frames,
        same_peaks: true, model_file: state.entry.model, model_sha256: state.entry.model_sha256,
        native_median_ms_all: mine.all ? mine.all.median_ms : null, native_threads: mine.all ? mine.all.threads : null,
        native_cpu: native.machine };
      download.disabled = false;
      say('Done. Run again, pick the other size, or download your result as one CSV row.');
    } catch (e) {
      if (e instanceof Stopped) {
        say('Stopped: no time is reported for an incomplete run.');
      } else if (e instanceof CheckFailed) {
        setCheck('fail', `Check failed: ${e.message}. The model is not timed.`);
        say('Stopped before timing: the check did not pass.');
      } else {
        setCheck('fail', `Check failed: a call failed (${e.message || e}). The model is not timed.`);
        say('Stopped: a call failed.');
      }
    } finally {
      if (state) for (const s of Object.values(state.sessions)) { try { await s.release(); } catch (e) { /* already gone */ } }
      run.disabled = false; stop.disabled = true;
    }
  });
}

for (const root of document.querySelectorAll('[data-ortweb-demo]')) mount(root);
