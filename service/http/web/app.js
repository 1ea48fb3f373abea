// disan-serve playground: plain JavaScript, no build step, no CDN. It calls the service's own
// API (the page is served by it, so requests are same-origin) and draws SVG heatmaps.
"use strict";

const ROOT = new URL("../", document.baseURI);  // the page lives at <root>/ui/
const MAX_SENTENCES = 8;                         // NLI runs every ordered pair: 8 -> 56 pairs
const MAX_DOCUMENTS = 64;                        // search ranks more lines than the heatmaps can show
const SVG = "http://www.w3.org/2000/svg";
const $ = (sel) => document.querySelector(sel);
const state = { info: null, texts: [], explanations: [], waits: 0 };

// ---- colours ----
const VIRIDIS = ["#440154", "#3b528b", "#21918c", "#5ec962", "#fde725"];
const DIVERGING = ["#2166ac", "#92c5de", "#f7f7f7", "#f4a582", "#b2182b"];
const NLI_COLOURS = { entailment: "#1a9850", neutral: "#8c8c8c", contradiction: "#d73027" };

function hexToRgb(hex) {
  const n = parseInt(hex.slice(1), 16);
  return [(n >> 16) & 255, (n >> 8) & 255, n & 255];
}

function mix(a, b, t) {
  const [x, y] = [hexToRgb(a), hexToRgb(b)];
  return `rgb(${x.map((v, i) => Math.round(v + (y[i] - v) * t)).join(",")})`;
}

function ramp(stops, t) {  // t in [0, 1] -> a colour along the stops
  const x = Math.min(1, Math.max(0, Number.isFinite(t) ? t : 0)) * (stops.length - 1);
  const i = Math.min(stops.length - 2, Math.floor(x));
  return mix(stops[i], stops[i + 1], x - i);
}

function isDark(rgb) {
  const [r, g, b] = rgb.match(/\d+/g).map(Number);
  return 0.299 * r + 0.587 * g + 0.114 * b < 140;
}

// ---- API ----
function apiKey() { return $("#api-key").value.trim(); }

async function call(method, path, body) {
  const headers = { "Content-Type": "application/json" };
  if (apiKey()) headers.Authorization = `Bearer ${apiKey()}`;
  const response = await fetch(new URL(path, ROOT), {
    method, headers, body: body === undefined ? undefined : JSON.stringify(body),
  });
  const data = await response.json().catch(() => ({}));
  if (!response.ok) {
    const message = data.error ? data.error.message : response.statusText;
    const error = new Error(`${path}: ${response.status} ${message}`);
    error.status = response.status;
    throw error;
  }
  return data;
}

function setStatus(text, kind) {
  const el = $("#status");
  el.textContent = text;
  el.className = kind || "";
}

// ---- drawing ----
function el(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

function clip(label, n) { return label.length > n ? `${label.slice(0, n - 1)}…` : label; }

/**
 * An SVG heatmap into `container`: values[i][j] (null = no cell), row and column labels.
 * opts.colour(v, i, j) -> fill; opts.text(v, i, j) -> text in the cell ('' for none);
 * opts.title(v, i, j) -> tooltip.
 */
function heatmap(container, values, rowLabels, colLabels, opts) {
  const rows = values.length;
  const cols = colLabels.length;
  const cell = opts.cell || Math.max(8, Math.min(34, Math.floor(620 / Math.max(cols, 1))));
  const font = Math.max(8, Math.min(13, cell * 0.45));
  const left = 10 + font * 0.62 * Math.max(1, ...rowLabels.map((l) => l.length));
  const top = 10 + font * 0.5 * Math.max(1, ...colLabels.map((l) => l.length));
  const svg = el("svg", {
    width: Math.ceil(left + cols * cell + 4), height: Math.ceil(top + rows * cell + 4),
    role: "img", "aria-label": opts.label || "heatmap",
  });
  rowLabels.forEach((label, i) => svg.append(el("text", {
    x: left - 6, y: top + i * cell + cell / 2, "text-anchor": "end", "dominant-baseline": "middle",
    "font-size": font, class: "label",
  }, label)));
  colLabels.forEach((label, j) => {
    const x = left + j * cell + cell / 2;
    svg.append(el("text", {
      x, y: top - 6, transform: `rotate(-55 ${x} ${top - 6})`, "font-size": font, class: "label",
    }, label));
  });
  values.forEach((row, i) => row.forEach((v, j) => {
    const x = left + j * cell;
    const y = top + i * cell;
    if (v === null || v === undefined) {
      svg.append(el("rect", { x, y, width: cell - 1, height: cell - 1, class: "empty" }));
      return;
    }
    const fill = opts.colour(v, i, j);
    const rect = el("rect", { x, y, width: cell - 1, height: cell - 1, fill, class: "cell",
                              "data-value": typeof v === "number" ? v.toFixed(6) : String(v) });
    rect.append(el("title", {}, opts.title ? opts.title(v, i, j) : String(v)));
    svg.append(rect);
    const text = opts.text ? opts.text(v, i, j) : "";
    if (text && cell >= 22) {
      svg.append(el("text", {
        x: x + (cell - 1) / 2, y: y + (cell - 1) / 2, "text-anchor": "middle",
        "dominant-baseline": "central", "font-size": Math.min(11, font), "pointer-events": "none",
        fill: isDark(fill) ? "#fff" : "#111",
      }, text));
    }
  }));
  container.replaceChildren(svg);
}

function drawSimilarity(matrix, texts) {
  const labels = texts.map((t, i) => `${i + 1}. ${clip(t, 34)}`);
  heatmap($("#similarity"), matrix, labels, texts.map((_, i) => String(i + 1)), {
    cell: 44, label: "cosine similarity matrix",
    colour: (v) => ramp(DIVERGING, (v + 1) / 2),
    text: (v) => v.toFixed(2),
    title: (v, i, j) => `cos(${i + 1}, ${j + 1}) = ${v.toFixed(4)}`,
  });
}

function drawNli(results, texts) {
  const n = texts.length;
  const grid = Array.from({ length: n }, () => Array(n).fill(null));
  let k = 0;
  for (let i = 0; i < n; i += 1) {
    for (let j = 0; j < n; j += 1) {
      if (i !== j) grid[i][j] = results[k++];
    }
  }
  const labels = texts.map((t, i) => `${i + 1}. ${clip(t, 34)}`);
  heatmap($("#nli"), grid, labels, texts.map((_, i) => String(i + 1)), {
    cell: 44, label: "NLI labels of every ordered pair",
    colour: (p) => mix("#ffffff", NLI_COLOURS[p.label] || "#8c8c8c", 0.25 + 0.75 * p.scores[p.label]),
    text: (p) => p.label.slice(0, 1).toUpperCase(),
    title: (p, i, j) => `premise ${i + 1}, hypothesis ${j + 1}: ${p.label} ` +
      `(${Object.entries(p.scores).map(([l, s]) => `${l} ${s.toFixed(3)}`).join(", ")})`,
  });
}

function drawSentiment(results, texts) {
  const body = $("#sentiment tbody");
  body.replaceChildren();
  results.forEach((r, i) => {
    const tr = document.createElement("tr");
    const p = r.scores[r.label];
    for (const value of [texts[i], r.label, r.polarity]) {
      const td = document.createElement("td");
      td.textContent = value;
      tr.append(td);
    }
    const td = document.createElement("td");
    const bar = document.createElement("span");
    bar.className = `bar ${r.polarity}`;
    bar.style.width = `${Math.round(100 * p)}px`;
    td.append(bar, document.createTextNode(` ${p.toFixed(3)}`));
    tr.append(td);
    body.append(tr);
  });
}

function drawExplanation(index) {
  const ex = state.explanations[index];
  if (!ex) return;
  const tokens = ex.tokens;
  const maxWeight = Math.max(...ex.token_weights, 1e-9);
  heatmap($("#token-weights"), [ex.token_weights, ex.gate_fw, ex.gate_bw],
    ["token weight", "gate forward", "gate backward"], tokens, {
      label: "token weights and fusion gates",
      // weights are scaled to the sentence's largest; gates are in [0, 1]
      colour: (v, i) => ramp(VIRIDIS, i === 0 ? v / maxWeight : v),
      text: (v) => v.toFixed(2),
      title: (v, i, j) => `${["token weight", "gate forward", "gate backward"][i]} of "${tokens[j]}": ${v.toFixed(4)}`,
    });
  for (const [id, matrix] of [["#attention-fw", ex.attention_fw], ["#attention-bw", ex.attention_bw]]) {
    // Each row is one token's attention (it sums to 1 over the tokens it may see); a row is
    // scaled to its own largest weight, so what each token attends to most stands out even in
    // rows that spread their weight thinly.
    const peaks = matrix.map((row) => Math.max(...row, 1e-9));
    heatmap($(id), matrix, tokens, tokens, {
      label: id.slice(1), colour: (v, i) => ramp(VIRIDIS, v / peaks[i]),
      title: (v, i, j) => `"${tokens[i]}" -> "${tokens[j]}": ${v.toFixed(4)}`,
    });
  }
}

function drawSearch(ranked, docs) {
  const list = $("#search-results");
  list.replaceChildren(...ranked.map((r) => {
    const li = document.createElement("li");
    li.dataset.index = String(r.index);
    li.dataset.score = r.score.toFixed(6);
    const score = document.createElement("span");
    score.className = "score";
    score.textContent = r.score.toFixed(4);
    li.append(score, document.createTextNode(` ${docs[r.index]}`));
    return li;
  }));
}

// ---- the flow ----
function lines(limit) {
  return $("#sentences").value.split("\n").map((s) => s.trim()).filter(Boolean).slice(0, limit);
}

// The server's own caps (GET /info limits): a request past them is a 413, so the page sends no more.
function textLimit() {
  const limits = state.info && state.info.limits;
  return (limits && limits.max_texts_per_request) || Infinity;
}

function sentenceLimit() {  // NLI sends every ordered pair: n (n - 1) pairs; sentiment explains n texts
  const limits = (state.info && state.info.limits) || {};
  const explained = state.info && state.info.explain ? limits.max_explain_texts || Infinity : Infinity;
  const cap = Math.min(textLimit(), explained);
  let n = MAX_SENTENCES;
  while (n > 1 && (n > cap || n * (n - 1) > cap)) n -= 1;
  return n;
}

function documentLimit() { return Math.min(MAX_DOCUMENTS, textLimit()); }

function limitNote(analysed) {  // "" unless the server's caps left typed lines out
  const typed = lines(Infinity).length;
  const parts = [];
  if (analysed && sentenceLimit() < MAX_SENTENCES && typed > sentenceLimit()) {
    parts.push(`the first ${sentenceLimit()} sentences analysed`);
  }
  if (documentLimit() < MAX_DOCUMENTS && typed > documentLimit()) {
    parts.push(`the first ${documentLimit()} lines ranked`);
  }
  return parts.length ? ` · this server takes ${textLimit()} texts a request: ${parts.join(", ")}` : "";
}

function sentences() { return lines(sentenceLimit()); }

// Sentiment labels, with their heatmaps when the server explains them. Explaining is capped by
// tokens (GET /info limits.max_explain_tokens), which the page cannot count: past the cap the
// server answers 413, and the labels are asked for again without the heatmaps.
async function sentiment(texts, explain) {
  const ask = (withHeatmaps) => call("POST", "sentiment", { texts, truncate: true, explain: withHeatmaps });
  if (!explain) return { answer: await ask(false), explained: false };
  try {
    return { answer: await ask(true), explained: true };
  } catch (error) {
    if (error.status !== 413) throw error;
    return { answer: await ask(false), explained: false };
  }
}

function explainNote(skipped) {  // "" unless the heatmaps were left out for the server's token cap
  if (!skipped) return "";
  const cap = state.info && state.info.limits && state.info.limits.max_explain_tokens;
  return ` · no heatmaps: this server explains at most ${cap} tokens a request`;
}

function hybridWeight() {
  return $("#hybrid-control").hidden ? 0 : Number($("#hybrid").value);
}

async function search() {
  const query = $("#query").value.trim();
  if (!state.info) state.info = await call("GET", "info");
  const docs = lines(documentLimit());
  if (!query || !docs.length) {
    $("#search-results").replaceChildren();
    return;
  }
  const body = { query, texts: docs, truncate: true };
  const weight = hybridWeight();
  if (weight > 0) body.hybrid = weight;  // sent only when asked: a bundle without a table answers 424
  drawSearch(await call("POST", "rerank", body), docs);
}

async function searchOnly() {
  setStatus("searching…");
  try {
    await search();
    setStatus(`search done${limitNote(false)}`, "ok");
  } catch (error) {
    setStatus(error.message, "error");
  }
}

async function run() {
  if (!lines(1).length) {
    setStatus("type at least one sentence", "error");
    return;
  }
  document.body.dataset.state = "running";
  setStatus("running…");
  const started = performance.now();
  try {
    if (!state.info) state.info = await call("GET", "info");
    const texts = sentences();
    $("#model").textContent = `${state.info.model} · ${state.info.dim}-d · ${state.info.provider}`;
    const pairs = [];
    texts.forEach((p, i) => texts.forEach((h, j) => { if (i !== j) pairs.push({ premise: p, hypothesis: h }); }));
    const explain = Boolean(state.info.explain);
    $("#hybrid-control").hidden = !(state.info.sparse && state.info.sparse.served);
    const [sim, nli, senti] = await Promise.all([
      call("POST", "similarity", { texts, truncate: true }),
      pairs.length ? call("POST", "nli", { pairs, truncate: true }) : Promise.resolve({ results: [] }),
      sentiment(texts, explain),
    ]);
    state.texts = texts;
    drawSimilarity(sim.matrix, texts);
    drawNli(nli.results, texts);
    drawSentiment(senti.answer.results, texts);
    state.explanations = senti.answer.results.map((r) => r.explanation);
    const pick = $("#explain-pick");
    pick.replaceChildren(...texts.map((t, i) => new Option(`${i + 1}. ${clip(t, 60)}`, String(i))));
    $("#explain").hidden = !senti.explained;
    if (senti.explained) drawExplanation(0);
    await search();
    const notes = `${limitNote(true)}${explainNote(explain && !senti.explained)}`;
    setStatus(`done in ${Math.round(performance.now() - started)} ms${notes}`, "ok");
    document.body.dataset.state = "done";
  } catch (error) {
    if (error.status === 503 && state.waits < 120) {  // loading / warming up: try again shortly
      state.waits += 1;
      state.info = null;
      setStatus("the model is loading…");
      setTimeout(run, 1000);
      return;
    }
    if (error.status === 401 || error.status === 403) state.info = null;
    setStatus(error.status === 401 ? "this server needs an API key: enter it above" : error.message, "error");
    document.body.dataset.state = "error";
  }
}

$("#run").addEventListener("click", run);
$("#search-run").addEventListener("click", searchOnly);
$("#query").addEventListener("keydown", (e) => { if (e.key === "Enter") searchOnly(); });
$("#hybrid").addEventListener("input", (e) => { $("#hybrid-value").value = e.target.value; });
$("#hybrid").addEventListener("change", searchOnly);
$("#explain-pick").addEventListener("change", (e) => drawExplanation(Number(e.target.value)));
$("#sentences").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) run();
});
$("#api-key").value = sessionStorage.getItem("disan-api-key") || "";
$("#api-key").addEventListener("change", () => {
  sessionStorage.setItem("disan-api-key", apiKey());
  state.info = null;
});
run();
