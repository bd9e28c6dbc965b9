// The translation page: GET /v1/model for the language pair, POST /v1/translate for the
// translations, their n-best lists and cross-attention, drawn as one heatmap per line.
// Plain JavaScript, no framework, no build step; the server ships this file as it is.
// Paths are relative to the page, so that it also works behind a proxy under a prefix.
"use strict";

const $ = (id) => document.getElementById(id);
const form = $("form");
const source = $("source");
const button = $("translate");
const errorBox = $("error");
const statusBox = $("status");
const results = $("results");

let languages = { source: "", target: "" };
let busy = false;

// ---- talking to the API ------------------------------------------------------------------

// fetch + JSON; a 4xx/5xx answer becomes an Error carrying the server's own one-line message.
async function api(path, options = {}) {
  let response;
  try {
    response = await fetch(path, options);
  } catch (err) {
    throw new Error(`cannot reach the server (${err.message})`);
  }
  const text = await response.text();
  let body = null;
  try {
    body = JSON.parse(text);
  } catch {
    // not JSON: handled below
  }
  if (!response.ok) {
    throw new Error(errorMessage(body) || `HTTP ${response.status} ${response.statusText}: ${text.slice(0, 200)}`);
  }
  if (body === null) throw new Error(`the server's answer to ${path} is not JSON`);
  return body;
}

function errorMessage(body) {
  if (!body || typeof body !== "object") return "";
  if (typeof body.error === "string") return body.error;
  // FastAPI's own validation answer, should one get through: {"detail": [{"loc": [...], "msg": ...}]}
  if (typeof body.detail === "string") return body.detail;
  if (Array.isArray(body.detail)) {
    return body.detail.map((d) => `${(d.loc || []).join(".")}: ${d.msg}`).join("; ");
  }
  return "";
}

// ---- the model's description -------------------------------------------------------------

// The first of `paths` ("a.b") that is set in obj.
function pick(obj, ...paths) {
  for (const path of paths) {
    let v = obj;
    for (const key of path.split(".")) v = v == null ? undefined : v[key];
    if (v !== undefined && v !== null && v !== "") return v;
  }
  return undefined;
}

function languagePair(model) {
  const langs = pick(model, "languages", "langs");
  if (Array.isArray(langs) && langs.length === 2) return { source: langs[0], target: langs[1] };
  return {
    source: pick(model, "source", "source_lang", "source_language", "src_lang", "src",
      "languages.source", "languages.src", "language_pair.source") || "",
    target: pick(model, "target", "target_lang", "target_language", "trg_lang", "tgt_lang", "trg", "tgt",
      "languages.target", "languages.trg", "languages.tgt", "language_pair.target") || "",
  };
}

// "key: value" for every scalar in the description, nested keys joined with dots.
function flatten(obj, prefix = "", out = []) {
  for (const [key, value] of Object.entries(obj)) {
    const name = prefix ? `${prefix}.${key}` : key;
    if (value && typeof value === "object" && !Array.isArray(value)) flatten(value, name, out);
    else if (Array.isArray(value)) out.push([name, value.map((v) => (typeof v === "object" ? JSON.stringify(v) : v)).join(", ")]);
    else out.push([name, String(value)]);
  }
  return out;
}

async function loadModel() {
  try {
    const model = await api("v1/model");
    languages = languagePair(model);
    $("pair").textContent = languages.source || languages.target
      ? `${languages.source || "?"} → ${languages.target || "?"}`
      : "language pair unknown";
    if (languages.source) source.lang = languages.source;
    offerTargets(model);
    $("model-info").replaceChildren(summary(model), describe(model));
    useModelDefaults(model);
  } catch (err) {
    $("pair").textContent = "language pair unknown";
    showError(`could not read the model's description: ${err.message}`);
  }
}

// One line: the model's size, training step and validation BLEU, where the server says them.
function summary(model) {
  const args = pick(model, "model_args", "model") || {};
  const layers = [pick(args, "n_layers"), pick(args, "n_dec_layers", "n_layers")];
  const vocab = [pick(model, "vocabulary.source", "src_vocab_size"), pick(model, "vocabulary.target", "trg_vocab_size")];
  const bleu = pick(model, "validation.bleu", "val_bleu", "bleu");
  const parts = [
    pick(args, "d_model") && `d_model ${args.d_model}`,
    layers[0] && `${layers[0]}+${layers[1]} layers`,
    vocab[0] && `vocabulary ${vocab[0] === vocab[1] || !vocab[1] ? vocab[0] : `${vocab[0]}/${vocab[1]}`}`,
    pick(model, "step", "training_step") !== undefined && `step ${pick(model, "step", "training_step")}`,
    typeof bleu === "number" ? `validation BLEU ${bleu.toFixed(1)}` : "validation BLEU n/a",
  ];
  return el("span", { class: "summary" }, parts.filter(Boolean).join(" · "));
}

// Every scalar of the description, in a collapsed list.
function describe(model) {
  const details = el("details", {}, [el("summary", {}, "model details")]);
  const list = el("dl");
  for (const [key, value] of flatten(model)) list.append(el("dt", {}, key), el("dd", {}, value));
  details.append(list);
  return details;
}

// The beam input starts at the model's default beam and stops at the server's limit.
function useModelDefaults(model) {
  const beam = $("beam");
  const maxBeam = pick(model, "limits.max_beam");
  if (Number.isInteger(maxBeam)) {
    beam.max = maxBeam;
    $("nbest").max = maxBeam;
  }
  const defaultBeam = pick(model, "decode.beam_size");
  if (Number.isInteger(defaultBeam) && beam.value === beam.defaultValue) {
    beam.value = Number.isInteger(maxBeam) ? Math.min(defaultBeam, maxBeam) : defaultBeam;
  }
}

// ---- translating --------------------------------------------------------------------------

function readInt(input, name) {
  const value = Number(input.value);
  if (input.value.trim() === "" || !Number.isInteger(value)) {
    input.focus();
    throw new Error(`${name} must be a whole number, not "${input.value}"`);
  }
  return value;
}

// A multilingual model translates into the language chosen here (its "pairs" name several).
function offerTargets(model) {
  const targets = [...new Set((model.pairs || []).map((pair) => pair[1]))];
  if (targets.length < 2) return;
  const select = $("target");
  select.replaceChildren(...targets.map((code) => el("option", { value: code }, code)));
  $("target-choice").hidden = false;
  $("pair").textContent = `${languages.source || "?"} → ${targets.join(", ")}`;
  select.addEventListener("change", () => { languages.target = select.value; });
  languages.target = select.value;
}

async function translate() {
  if (busy) return;
  showError("");
  let request;
  try {
    const lines = source.value.replace(/\s+$/, "").split("\n");
    if (lines.every((line) => line.trim() === "")) throw new Error("type a sentence to translate");
    const beam = readInt($("beam"), "beam size");
    const nbest = Math.max(1, Math.min(readInt($("nbest"), "n-best"), beam));  // at most the beam
    request = { text: lines, beam, nbest, attention: true };
    if (!$("target-choice").hidden) request.target = $("target").value;
  } catch (err) {
    showError(err.message);
    return;
  }
  setBusy(true, `translating ${plural(request.text.length, "line")}…`);
  const start = performance.now();
  try {
    const answer = await api("v1/translate", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(request),
    });
    if (!Array.isArray(answer.translations)) throw new Error("the server's answer has no translations");
    render(request.text, answer.translations);
    const ms = Math.round(performance.now() - start);
    setBusy(false, `translated ${plural(request.text.length, "line")} in ${ms} ms (beam ${request.beam})`);
  } catch (err) {
    setBusy(false, "");
    showError(err.message);
  }
}

function render(lines, translations) {
  results.replaceChildren();
  translations.forEach((t, i) => {
    const card = el("article", { class: "result", "aria-label": `line ${i + 1}` });
    if (!(lines[i] ?? "").trim()) {  // empty in, empty out
      card.append(el("p", { class: "source" }, "(empty line)"));
      results.append(card);
      return;
    }
    card.append(el("p", { class: "source", lang: languages.source || null }, lines[i] ?? ""));
    card.append(el("p", { class: "translation", lang: languages.target || null }, t.text || "\u00a0"));
    if (typeof t.score === "number") card.append(el("p", { class: "score" }, `score ${t.score.toFixed(4)}`));
    if (Array.isArray(t.nbest) && t.nbest.length > 0) {
      const list = el("ol", { class: "nbest", "aria-label": "n-best list" });
      for (const hyp of t.nbest) {
        list.append(el("li", {}, [
          el("span", { lang: languages.target || null }, hyp.text),
          el("span", { class: "score" }, typeof hyp.score === "number" ? hyp.score.toFixed(4) : ""),
        ]));
      }
      card.append(el("details", { open: "" }, [el("summary", {}, `n-best list (${t.nbest.length})`), list]));
    }
    const att = t.attention;
    if (att && Array.isArray(att.weights) && att.weights.length > 0 && att.weights[0].length > 0) {
      card.append(heatmap(att));
    }
    results.append(card);
  });
}

// ---- the heatmap --------------------------------------------------------------------------

// matplotlib's viridis at 9 evenly spaced points, interpolated in between.
const VIRIDIS = ["#440154", "#482878", "#3e4989", "#31688e", "#26828e", "#1f9e89", "#35b779", "#6ece58", "#fde725"]
  .map((hex) => [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16)));

function color(x) {
  const t = Math.min(1, Math.max(0, x)) * (VIRIDIS.length - 1);
  const i = Math.min(Math.floor(t), VIRIDIS.length - 2);
  const f = t - i;
  const [r, g, b] = VIRIDIS[i].map((c, k) => Math.round(c + f * (VIRIDIS[i + 1][k] - c)));
  return `rgb(${r},${g},${b})`;
}

const CELL = 20;          // px per piece
const FONT = "12px system-ui, sans-serif";

// A <figure> with a <canvas>: source pieces on x (labels below, read bottom-up), target pieces
// on y, colour = attention weight (0 .. the matrix's largest), a colour bar on the right.
function heatmap({ source: src, target: trg, weights }) {
  const rows = weights.length;
  const cols = weights[0].length;
  const max = weights.reduce((m, row) => row.reduce((a, w) => Math.max(a, w), m), 1e-9);
  const canvas = el("canvas", {
    class: "heatmap", role: "img", "data-rows": rows, "data-cols": cols,
    "aria-label": `cross-attention heatmap: ${rows} target pieces (rows) by ${cols} source pieces (columns)`,
  });
  // Fallback content for screen readers: the source piece each target piece attends to most.
  canvas.append(el("ul", {}, weights.map((row, y) => {
    const x = row.reduce((best, w, i) => (w > row[best] ? i : best), 0);
    return el("li", {}, `${trg[y] ?? y} ← ${src[x] ?? x} (${row[x].toFixed(2)})`);
  })));

  const ctx = canvas.getContext("2d");
  ctx.font = FONT;
  const widest = (labels) => Math.max(0, ...labels.map((s) => ctx.measureText(String(s)).width));
  const left = Math.ceil(widest(trg)) + 10;
  const top = 8;
  const gridW = cols * CELL;
  const gridH = rows * CELL;
  const barX = left + gridW + 14;
  const width = barX + 12 + 8 + Math.ceil(ctx.measureText(max.toFixed(2)).width) + 4;
  const height = top + gridH + Math.ceil(widest(src)) + 12;

  const scale = window.devicePixelRatio || 1;  // sharp on high-density screens
  canvas.width = Math.ceil(width * scale);
  canvas.height = Math.ceil(height * scale);
  canvas.style.width = `${width}px`;
  canvas.style.height = `${height}px`;
  ctx.scale(scale, scale);
  ctx.font = FONT;

  weights.forEach((row, y) => row.forEach((w, x) => {
    ctx.fillStyle = color(w / max);
    ctx.fillRect(left + x * CELL, top + y * CELL, CELL, CELL);
  }));

  ctx.fillStyle = "#222";
  ctx.textBaseline = "middle";
  ctx.textAlign = "right";
  trg.forEach((piece, y) => ctx.fillText(piece, left - 6, top + y * CELL + CELL / 2));
  src.forEach((piece, x) => {  // rotated a quarter turn: read from bottom to top
    ctx.save();
    ctx.translate(left + x * CELL + CELL / 2, top + gridH + 6);
    ctx.rotate(-Math.PI / 2);
    ctx.fillText(piece, 0, 0);
    ctx.restore();
  });

  for (let y = 0; y < gridH; y++) {  // colour bar: max at the top, 0 at the bottom
    ctx.fillStyle = color(1 - y / gridH);
    ctx.fillRect(barX, top + y, 12, 1);
  }
  ctx.fillStyle = "#222";
  ctx.textAlign = "left";
  ctx.fillText(max.toFixed(2), barX + 16, top + 6);
  ctx.fillText("0", barX + 16, top + gridH - 6);

  // Pointing at a cell names its pair and weight.
  const probe = el("p", { class: "probe", "aria-hidden": "true" }, "\u00a0");
  canvas.addEventListener("mousemove", (event) => {
    const box = canvas.getBoundingClientRect();
    const x = Math.floor((event.clientX - box.left - left) / CELL);
    const y = Math.floor((event.clientY - box.top - top) / CELL);
    probe.textContent = x >= 0 && x < cols && y >= 0 && y < rows
      ? `${trg[y]} ← ${src[x]}: ${weights[y][x].toFixed(3)}`
      : "\u00a0";
  });

  return el("figure", { class: "attention" }, [
    el("div", { class: "scroll" }, [canvas]),
    el("figcaption", {}, "Cross-attention (mean of heads and layers): target pieces down, source pieces across; point at a cell for its weight."),
    probe,
  ]);
}

// ---- small helpers ------------------------------------------------------------------------

// el("p", {class: "x"}, "text" | [children]); attributes with a null value are left out.
function el(tag, attrs = {}, children = []) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) if (value !== null) node.setAttribute(key, value);
  node.append(...(Array.isArray(children) ? children : [children]));
  return node;
}

function plural(n, word) {
  return `${n} ${word}${n === 1 ? "" : "s"}`;
}

function showError(message) {
  errorBox.textContent = message ? `Error: ${message}` : "";
  errorBox.hidden = !message;
}

function setBusy(on, message) {
  busy = on;
  button.disabled = on;
  results.setAttribute("aria-busy", String(on));
  statusBox.textContent = message;
}

form.addEventListener("submit", (event) => {
  event.preventDefault();
  translate();
});
document.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
    event.preventDefault();
    translate();
  }
});
loadModel();
