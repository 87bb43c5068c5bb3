// The built-in page: a chat over the OpenAI routes and a live view of /dashboard/state.
// Plain browser JavaScript, no build step. The API key (when the server has one) is asked for
// once, kept in localStorage and sent as `Authorization: Bearer ...`.
"use strict";

const $ = (id) => document.getElementById(id);
const KEY_STORE = "sglang-api-key";
let apiKey = localStorage.getItem(KEY_STORE) || "";
// Where the chat goes: this server, or the router of a PD deployment (launch_pd sets it).
const API_BASE = document.querySelector('meta[name="sglang-api-base"]').content || "";
let history = [];          // [{role, content}] of the conversation
let controller = null;     // AbortController of the running stream
const series = { running: [], waiting: [], kv: [], tps: [] };
const MAX_POINTS = 120;
let lastGen = null;        // {time, tokens} of the previous snapshot

function headers(json) {
  const h = json ? { "Content-Type": "application/json" } : {};
  if (apiKey) h["Authorization"] = "Bearer " + apiKey;
  return h;
}

function askKey() {
  const k = window.prompt("This server needs an API key (--api-key). Enter it:", apiKey);
  if (k === null) return false;
  apiKey = k.trim();
  localStorage.setItem(KEY_STORE, apiKey);
  return true;
}

let asking = null;          // the pending key prompt, shared by concurrent 401s

async function api(path, options = {}) {
  for (let attempt = 0; attempt < 3; attempt++) {
    const used = apiKey;
    const r = await fetch(path, { ...options, headers: headers(options.body !== undefined) });
    if (r.status !== 401 || attempt === 2) return r;
    if (apiKey !== used) continue;  // another call got a new key meanwhile: retry with it
    if (!asking) asking = Promise.resolve().then(askKey).finally(() => { asking = null; });
    if (!(await asking)) return r;
  }
}

function showError(text) {
  const e = $("error");
  e.textContent = text || "";
  e.hidden = !text;
}

// --- chat --------------------------------------------------------------------------------------
function addMessage(role, text) {
  const div = document.createElement("div");
  div.className = "msg " + role;
  const who = document.createElement("span");
  who.className = "who";
  who.textContent = role;
  const body = document.createElement("span");
  body.className = "body";
  body.textContent = text;
  div.append(who, body);
  $("messages").append(div);
  $("messages").scrollTop = $("messages").scrollHeight;
  return body;
}

async function loadModels() {
  const r = await api(API_BASE + "/v1/models");
  if (!r.ok) { showError("Could not list models: HTTP " + r.status); return; }
  const data = await r.json();
  const sel = $("model");
  sel.innerHTML = "";
  for (const m of data.data || []) {
    const o = document.createElement("option");
    o.value = o.textContent = m.id;
    sel.append(o);
  }
  $("model-name").textContent = sel.value;
}

async function send(text) {
  showError("");
  history.push({ role: "user", content: text });
  addMessage("user", text);
  const out = addMessage("assistant", "");
  const system = $("system").value.trim();
  const messages = (system ? [{ role: "system", content: system }] : []).concat(history);
  const body = {
    model: $("model").value || "default", messages, stream: true,
    temperature: parseFloat($("temperature").value), top_p: parseFloat($("top-p").value),
    max_tokens: parseInt($("max-tokens").value, 10), stream_options: { include_usage: true },
  };
  controller = new AbortController();
  $("send").disabled = true;
  $("stop").disabled = false;
  const start = performance.now();
  let first = null, pieces = 0, usage = null, text_out = "";
  try {
    const r = await api(API_BASE + "/v1/chat/completions", { method: "POST", body: JSON.stringify(body), signal: controller.signal });
    if (!r.ok) { showError("HTTP " + r.status + ": " + (await r.text())); return; }
    const reader = r.body.getReader();
    const decoder = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const event = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        if (!event.startsWith("data: ") || event === "data: [DONE]") continue;
        const chunk = JSON.parse(event.slice(6));
        if (chunk.error) { showError(chunk.error.message || JSON.stringify(chunk.error)); continue; }
        if (chunk.usage) usage = chunk.usage;
        for (const c of chunk.choices || []) {
          const d = (c.delta && c.delta.content) || "";
          if (d) {
            if (first === null) first = performance.now();
            text_out += d;
            pieces++;
            out.textContent = text_out;
            $("messages").scrollTop = $("messages").scrollHeight;
            const secs = (performance.now() - first) / 1000;
            if (secs > 0) $("speed").textContent = (pieces / secs).toFixed(1) + " tok/s";
          }
        }
      }
    }
  } catch (e) {
    if (e.name !== "AbortError") showError(String(e));
  } finally {
    controller = null;
    $("send").disabled = false;
    $("stop").disabled = true;
    history.push({ role: "assistant", content: text_out });
    const total = (performance.now() - start) / 1000;
    if (usage && first !== null) {
      const secs = Math.max((performance.now() - first) / 1000, 1e-3);
      $("speed").textContent = usage.completion_tokens + " tokens, " +
        (Math.max(usage.completion_tokens - 1, 0) / secs).toFixed(1) + " tok/s, TTFT " +
        ((first - start) / 1000).toFixed(2) + " s";
    } else if (first === null) {
      $("speed").textContent = "no tokens (" + total.toFixed(2) + " s)";
    }
  }
}

// --- dashboard -----------------------------------------------------------------------------------
function fmtUsed(u) { return u ? u.used + " / " + u.total + " (" + Math.round(100 * u.used / u.total) + "%)" : "–"; }

function renderStats(s) {
  const rows = [
    ["running", s.num_running_reqs], ["waiting", s.num_waiting_reqs],
    ["grammar queue", s.num_grammar_queue_reqs], ["KV tokens", fmtUsed(s.kv_tokens)],
    ["host pool", fmtUsed(s.host_pool_tokens)], ["state slots", fmtUsed(s.mamba_slots)],
    ["host state slots", fmtUsed(s.mamba_host_slots)], ["cache hit rate", (100 * s.cache_hit_rate).toFixed(1) + "%"],
    ["requests", s.num_requests], ["generated tokens", s.generation_tokens],
    ["retractions", s.num_retractions + (s.retraction_backup ? " (" + s.retraction_backup + ")" : "")],
    ["recomputed tokens", s.num_recomputed_tokens],
  ];
  if (s.spec_accept_length != null) {  // a speculative server: tokens per verify step, drafts accepted
    rows.push(["spec accept length", s.spec_accept_length.toFixed(2)]);
    rows.push(["spec accept rate", s.spec_accept_rate == null ? "–" : (100 * s.spec_accept_rate).toFixed(1) + "%"]);
  }
  for (const [k, v] of Object.entries(s.pd_queues || {})) rows.push([k.replace(/^num_|_reqs$/g, "").replace(/_/g, " "), v]);
  const box = $("stats");
  for (const [k, v] of rows) {  // update in place: rows keep their elements between refreshes
    let d = box.querySelector('.stat[data-name="' + k + '"]');
    if (!d) {
      d = document.createElement("div");
      d.className = "stat";
      d.dataset.name = k;
      const a = document.createElement("span");
      a.textContent = k;
      d.append(a, document.createElement("b"));
      box.append(d);
    }
    d.querySelector("b").textContent = v;
  }
  $("mode").textContent = s.mode && s.mode !== "null" ? s.mode : "";
}

function push(arr, v) { arr.push(v); if (arr.length > MAX_POINTS) arr.shift(); }

function plot(canvas, lines, maxHint) {
  const ctx = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height;
  ctx.clearRect(0, 0, w, h);
  const max = Math.max(maxHint || 0, 1e-9, ...lines.flatMap((l) => l.data));
  ctx.fillStyle = "#6b7585";
  ctx.font = "10px sans-serif";
  ctx.fillText(max.toFixed(max < 10 ? 1 : 0), 2, 10);
  for (const l of lines) {
    ctx.strokeStyle = l.color;
    ctx.lineWidth = 1.5;
    ctx.beginPath();
    l.data.forEach((v, i) => {
      const x = (i / (MAX_POINTS - 1)) * w, y = h - 2 - (v / max) * (h - 14);
      if (i === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
    });
    ctx.stroke();
  }
}

async function refresh() {
  try {
    const r = await api("/dashboard/state");
    if (!r.ok) return;
    const s = await r.json();
    renderStats(s);
    push(series.running, s.num_running_reqs);
    push(series.waiting, s.num_waiting_reqs);
    push(series.kv, s.kv_tokens ? s.kv_tokens.used / s.kv_tokens.total : 0);
    if (lastGen) push(series.tps, Math.max(0, (s.generation_tokens - lastGen.tokens) / Math.max(s.time - lastGen.time, 1e-3)));
    lastGen = { time: s.time, tokens: s.generation_tokens };
    plot($("plot-reqs"), [{ data: series.running, color: "#2f6fde" }, { data: series.waiting, color: "#e07b00" }]);
    plot($("plot-kv"), [{ data: series.kv, color: "#188038" }], 1);
    plot($("plot-tps"), [{ data: series.tps, color: "#9334e6" }]);
  } catch (e) { /* the server restarts: try again next tick */ }
}

// --- wiring ------------------------------------------------------------------------------------
$("composer").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const text = $("prompt").value.trim();
  if (!text || controller) return;
  $("prompt").value = "";
  send(text);
});
$("prompt").addEventListener("keydown", (ev) => {
  if (ev.key === "Enter" && !ev.shiftKey) { ev.preventDefault(); $("composer").requestSubmit(); }
});
$("stop").addEventListener("click", () => { if (controller) controller.abort(); });
$("clear").addEventListener("click", () => { history = []; $("messages").innerHTML = ""; $("speed").textContent = ""; });
$("key-button").addEventListener("click", () => { if (askKey()) { loadModels(); refresh(); } });
$("model").addEventListener("change", () => { $("model-name").textContent = $("model").value; });

loadModels();
refresh();
setInterval(refresh, 1000);
