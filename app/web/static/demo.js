// spo-service demo page: calls POST /v1/extract like any client and shows what it answers.
// Offsets in the API count Unicode code points; JavaScript strings count UTF-16 units, so the text is
// handled as an array of code points (Array.from) everywhere an offset is used.
"use strict";

const $ = (id) => document.getElementById(id);
const COLOURS = 8;
const TOKEN_KEY = "spo-token";

function typeClass(type) {
  let h = 0;
  for (const ch of type) h = (h * 31 + ch.codePointAt(0)) >>> 0;
  return "t" + (h % COLOURS);
}

function el(tag, props = {}, children = []) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else node.setAttribute(k, v);
  }
  for (const child of children) node.append(child);
  return node;
}

function describe(e) {
  return `${e.type} ${e.text} [${e.start}, ${e.end})`;
}

async function loadModel() {
  const name = $("model-name");
  try {
    const res = await fetch("/readyz", { headers: { Accept: "application/json" } });
    if (res.ok) {
      const doc = await res.json();
      const m = doc.model;
      name.textContent = `${m.name} v${m.version} (${m.task})`;
      return;
    }
    name.textContent = "loading…";
  } catch (err) {
    name.textContent = "unreachable";
  }
  setTimeout(loadModel, 3000);
}

function showError(problem, status) {
  const box = $("error");
  box.replaceChildren();
  const title = problem.title || `HTTP ${status}`;
  box.append(el("strong", { text: `${title} (${status})` }));
  if (problem.detail) box.append(el("span", { text: problem.detail }));
  const facts = [];
  if (problem.code) facts.push(`code ${problem.code}`);
  if (problem.field) facts.push(`field ${problem.field}`);
  if (problem.request_id) facts.push(`request id ${problem.request_id}`);
  if (facts.length) box.append(el("br"), el("code", { text: facts.join(" · ") }));
  box.hidden = false;
  if (status === 401) {
    $("token-box").open = true;
    $("token").focus();
  }
}

// The text as runs of code points, each with the entities covering it; a run covered by several
// (nested or overlapping) entities takes the colour of the shortest and lists all of them.
function segments(chars, entities) {
  const cuts = new Set([0, chars.length]);
  for (const e of entities) { cuts.add(e.start); cuts.add(e.end); }
  const points = [...cuts].filter((p) => p >= 0 && p <= chars.length).sort((a, b) => a - b);
  const out = [];
  for (let i = 0; i + 1 < points.length; i++) {
    const [a, b] = [points[i], points[i + 1]];
    const covering = entities
      .filter((e) => e.start <= a && b <= e.end)
      .sort((x, y) => (x.end - x.start) - (y.end - y.start));
    out.push({ text: chars.slice(a, b).join(""), covering, end: b });
  }
  return out;
}

function renderText(text, entities) {
  const chars = Array.from(text);
  const target = $("annotated");
  target.replaceChildren();
  for (const seg of segments(chars, entities)) {
    if (!seg.covering.length) { target.append(seg.text); continue; }
    const main = seg.covering[0];
    const label = seg.covering.map(describe).join("; ");
    const mark = el("mark", {
      class: typeClass(main.type), title: label, "aria-label": label, tabindex: "0",
      "data-type": main.type, "data-start": String(main.start), "data-end": String(main.end),
    }, [seg.text]);
    // The type tag follows the last run of an entity, so each entity is labelled once: every
    // entity ending here (two types on one span get a tag each).
    for (const e of seg.covering) {
      if (e.end === seg.end) mark.append(el("span", { class: "tag", "aria-hidden": "true", text: e.type }));
    }
    const show = () => { $("focus-info").textContent = label; };
    mark.addEventListener("mouseenter", show);
    mark.addEventListener("focus", show);
    target.append(mark);
  }
  const legend = $("legend");
  legend.replaceChildren();
  const types = [...new Set(entities.map((e) => e.type))];
  for (const t of types) legend.append(el("span", { class: typeClass(t), text: t }));
  if (!entities.length) legend.append(el("span", { text: "No entity found." }));
}

function spanCell(span) {
  return el("td", {}, [
    el("mark", { class: typeClass(span.type), title: describe(span), text: span.text }),
    " ",
    el("small", { text: `${span.type} [${span.start}, ${span.end})` }),
  ]);
}

function renderTriples(triples) {
  const body = $("triples").querySelector("tbody");
  body.replaceChildren();
  for (const t of triples) {
    body.append(el("tr", { class: "triple" }, [
      spanCell(t.subject), el("td", { text: t.predicate }), spanCell(t.object),
    ]));
  }
  $("triples").hidden = !triples.length;
  $("no-triples").hidden = triples.length > 0;
}

// Each extraction's number: an answer that comes back after a newer request was sent is dropped,
// so a slow answer never overwrites the result of the text now in the box.
let latest = 0;

async function extract(event) {
  if (event) event.preventDefault();
  const mine = ++latest;
  const text = $("text").value;
  const token = $("token").value.trim();
  sessionStorage.setItem(TOKEN_KEY, token);
  const headers = { "Content-Type": "application/json", Accept: "application/json" };
  if (token) headers.Authorization = `Bearer ${token}`;
  $("extract").disabled = true;
  $("busy").hidden = false;
  $("error").hidden = true;
  const started = performance.now();
  try {
    const res = await fetch("/v1/extract", {
      method: "POST", headers, body: JSON.stringify({ text }),
    });
    const type = res.headers.get("Content-Type") || "";
    const doc = type.includes("json") ? await res.json() : { detail: await res.text() };
    if (mine !== latest) return;
    if (!res.ok) {
      showError(doc, res.status);
      $("result").hidden = true;
      return;
    }
    const result = doc.results[0];
    renderText(text, result.entities);
    renderTriples(result.triples);
    // An entity model (task "entities") has no triples to show.
    $("triples-section").hidden = doc.model.task === "entities";
    const ms = Math.round(performance.now() - started);
    $("meta").textContent =
      `${doc.model.name} v${doc.model.version} · ${result.entities.length} entities, ` +
      `${result.triples.length} triples · ${ms} ms · request id ${res.headers.get("X-Request-ID") || "-"}`;
    $("result").hidden = false;
  } catch (err) {
    if (mine !== latest) return;
    showError({ title: "Network error", detail: String(err) }, 0);
    $("result").hidden = true;
  } finally {
    if (mine === latest) {
      $("extract").disabled = false;
      $("busy").hidden = true;
    }
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("token").value = sessionStorage.getItem(TOKEN_KEY) || "";
  $("form").addEventListener("submit", extract);
  $("text").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) extract(e);
  });
  for (const button of $("examples").querySelectorAll("button")) {
    button.addEventListener("click", () => {
      $("text").value = button.textContent;
      extract();
    });
  }
  loadModel();
});
