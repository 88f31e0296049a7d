// The Activity view: the request log (/api/activity), newest first, filtered by model, key and
// status; a row opens the request and the reply when they were captured (captured bodies need an
// admin key: the service says so to any other, and the view shows what it said).

import { AuthError, getJSON } from "./api.js";
import { clock, h, setText } from "./dom.js";

const LIMIT = 50;

function ms(seconds) {
  return seconds === null || seconds === undefined ? "–" : `${Math.round(seconds * 1000)} ms`;
}

function tokens(r) {
  if (r.prompt_tokens === null && r.completion_tokens === null) return "–";
  return `${r.prompt_tokens ?? 0} → ${r.completion_tokens ?? 0}`;
}

function status(r) {
  let text = String(r.status);
  if (r.cancelled) text += " cancelled";
  if (r.error) text += ` ${r.error}`;
  return text;
}

export class ActivityView {
  constructor(root, onAuthError) {
    this.root = root;
    this.onAuthError = onAuthError;
    this.rows = root.querySelector("tbody");
    this.form = root.querySelector("form");
    this.note = root.querySelector(".activity-note");
    this.detail = root.querySelector(".activity-detail");
    this.shown = "";
    this.form.addEventListener("submit", (e) => e.preventDefault());
    this.form.addEventListener("input", () => this.refresh().catch(() => {}));
  }

  query() {
    const q = new URLSearchParams({ limit: String(LIMIT) });
    for (const name of ["model", "key", "status"]) {
      const value = this.form.elements[name].value.trim();
      if (value && (name !== "status" || /^[1-5][0-9][0-9]$/.test(value))) q.set(name, value); // "40": still typing
    }
    return q.toString();
  }

  async refresh() {
    const q = this.query();
    let data;
    try {
      data = await getJSON(`/api/activity?${q}`);
    } catch (err) {
      if (err instanceof AuthError) throw err;
      setText(this.note, `No activity: ${err.message}`);
      return;
    }
    setText(this.note, data.activity.length ? "" : "No requests yet (or none match the filters).");
    const shown = q + "|" + data.activity.map((r) => r.id).join(",");
    if (shown === this.shown) return; // unchanged: keep focus and selection
    this.shown = shown;
    this.rows.replaceChildren(...data.activity.map((r) => this.row(r)));
  }

  row(r) {
    const cell = (label, text) => h("td", { "data-label": label, text });
    const tr = h(
      "tr",
      {
        class: `req status-${Math.floor(r.status / 100)}xx`,
        "data-id": String(r.id),
        tabindex: "0",
        "aria-label": `request ${r.id}: ${r.route} ${r.model || ""} ${r.status}`,
        onclick: () => this.open(r.id),
        onkeydown: (e) => (e.key === "Enter" || e.key === " ") && (e.preventDefault(), this.open(r.id)),
      },
      cell("Time", clock(r.started)),
      cell("Route", r.route + (r.stream ? " (stream)" : "")),
      cell("Model", r.model || "–"),
      cell("Key", r.key || "–"),
      cell("Status", status(r)),
      cell("Tokens", tokens(r)),
      cell("TTFT", ms(r.ttft)),
      cell("Duration", ms(r.duration)),
    );
    return tr;
  }

  async open(id) {
    this.detail.hidden = false;
    this.detail.dataset.id = String(id);
    for (const tr of this.rows.children) tr.classList.toggle("selected", tr.dataset.id === String(id));
    this.detail.replaceChildren(h("p", { text: `Request ${id}…` }));
    // The detail sits below all the rows (up to 50): bring it into view, or the click seems to do nothing.
    this.detail.scrollIntoView({ block: "nearest" });
    let r;
    try {
      r = await getJSON(`/api/activity/${id}`);
    } catch (err) {
      if (err instanceof AuthError) return this.onAuthError();
      this.detail.replaceChildren(h("p", { class: "error", role: "alert", text: err.message }));
      return;
    }
    const facts = [
      `${r.method} ${r.route}`,
      r.model && `model ${r.model}`,
      r.key && `key ${r.key}`,
      `status ${status(r)}`,
      r.finish_reason && `finish ${r.finish_reason}`,
      r.tokens_per_second && `${r.tokens_per_second} tokens/s`,
      r.request_id && `id ${r.request_id}`,
    ].filter(Boolean);
    const body = (title, text, cls) =>
      h("div", { class: cls }, h("h3", { text: title }), h("pre", { tabindex: "0", text }));
    this.detail.replaceChildren(
      h("p", { class: "facts", text: facts.join(" · ") }),
      r.request_body === null && r.response_body === null
        ? h("p", { class: "not-captured", text: "Not captured (set capture = true in [server] or for the model)." })
        : h(
            "div",
            { class: "bodies" },
            body("Request", r.request_body ?? "", "request-body"),
            body("Reply", r.response_body ?? "", "response-body"),
          ),
    );
    this.detail.scrollIntoView({ block: "nearest" }); // taller now: its end in view too, as far as it fits
  }

  clear() {
    this.rows.replaceChildren();
    this.detail.hidden = true;
    this.detail.replaceChildren();
    this.shown = "";
  }
}
