// The models table: one <tbody> per model, built once and updated in place (focus, open log
// panels and running log streams survive every refresh).

import { AuthError, lines, postJSON, request, serverNow } from "./api.js";
import { bytes, duration, h, setText } from "./dom.js";

const COLUMNS = 10;
const LOG_LINES = 400;

function memoryItems(status) {
  const est = status.memory?.estimated_bytes || {};
  const act = status.memory?.actual_bytes || {};
  const keys = [...new Set([...Object.keys(est), ...Object.keys(act), ...(status.devices || [])])];
  return keys.map((k) => {
    const parts = [];
    if (est[k] !== undefined) parts.push(`est ${bytes(est[k])}`);
    if (act[k] !== undefined) parts.push(`actual ${bytes(act[k])}`);
    return h("li", {}, h("span", { class: "dev", text: k }), " ", parts.join(" · ") || "–");
  });
}

// keep_context: the saved KV-cache slots a resumed conversation will find (count, tokens, bytes).
// keep_conversations: the returning turns that found their state, those restored from disk, and
// the prefill tokens that saved; or why the tier turned itself off.
function savedContexts(c) {
  const kept = c.count ? `context kept: ${c.count} · ${c.tokens} tok · ${bytes(c.bytes)}` : "context kept: none yet";
  if (c.conversation_off) return `${kept}\nconversations: off (${c.conversation_off})`;
  if (c.conversation_hits === undefined) return kept;
  return `${kept}\nconversations: ${c.conversation_hits} found · ${c.conversation_restores} restored · ${c.conversation_prefill_saved} tok not recomputed`;
}

// The residency rules ([models.X] pinned / swap / evict_cost / default, [groups.*]) in a few words.
function rules(r) {
  const words = [];
  if (r.pinned) words.push("pinned");
  if (r.swap === "never") words.push("never swap");
  if (r.group) words.push(`group ${r.group}`);
  if (r.default) words.push("default");
  if (r.evict_cost !== undefined && r.evict_cost !== 1) words.push(`evict cost ${r.evict_cost}`);
  return words.join(" · ");
}

class ModelRow {
  constructor(name, table, onError) {
    this.name = name;
    this.onError = onError;
    this.logAbort = null;
    const cell = (label, ...c) => h("td", { "data-label": label }, ...c);
    this.nameEl = h("span", { class: "name", text: name });
    this.pathEl = h("span", { class: "path" });
    this.modalEl = h("span", { class: "modalities" }); // its kind, then what its projector takes
    this.servesEl = h("span", { class: "serves" }); // the requests it answers
    this.rulesEl = h("span", { class: "rules" });
    this.alsoEl = h("span", { class: "rules also" }); // its variants and adapters (X:Y), same child
    this.badge = h("span", { class: "badge" });
    this.since = h("span", { class: "since" });
    this.progress = h("progress", { max: "100", "aria-label": `${name} loading progress` });
    this.progressText = h("span", { class: "progress-text" });
    this.progressWrap = h("div", { class: "progress", hidden: true }, this.progress, this.progressText);
    this.mem = h("ul", { class: "mem" });
    this.pid = h("span");
    this.uptime = h("span");
    this.restarts = h("span");
    this.requests = h("span");
    this.tps = h("span", { class: "tps" });
    this.ttl = h("span");
    const button = (label, action, cls) =>
      h("button", { type: "button", class: cls, "data-action": action, onclick: () => this.act(action) }, label);
    this.buttons = {
      load: button("Load", "load"),
      unload: button("Unload", "unload", "ghost"),
      reload: button("Reload", "reload", "ghost"),
    };
    // Load, unload and reload need an admin key: a key without it is not offered them at all.
    this.buttonsEl = h("div", { class: "buttons", hidden: true }, Object.values(this.buttons));
    this.actionMsg = h("p", { class: "action-msg", role: "status" });
    this.failure = h("div", { class: "failure", hidden: true });
    this.logText = h("pre", { class: "log-text", tabindex: "0", "aria-label": `${name} log` });
    this.logDetails = h("details", { class: "log" }, h("summary", {}, "Log ", h("span", { class: "sr-only", text: name })), this.logText);
    this.logDetails.addEventListener("toggle", () => (this.logDetails.open ? this.follow() : this.unfollow()));
    this.body = h(
      "tbody",
      { class: "model", "data-model": name },
      h(
        "tr",
        { class: "main" },
        h("th", { scope: "row", "data-label": "Model" }, this.nameEl, this.pathEl, this.modalEl, this.servesEl, this.rulesEl, this.alsoEl),
        cell("State", this.badge, " ", this.since, this.progressWrap),
        cell("Devices · memory", this.mem),
        cell("PID · port", this.pid),
        cell("Uptime", this.uptime),
        cell("Restarts", this.restarts),
        cell("Requests", this.requests),
        cell("Tokens/s", this.tps),
        cell("TTL left", this.ttl),
        h("td", { class: "actions" }, this.buttonsEl, this.actionMsg),
      ),
      h("tr", { class: "detail" }, h("td", { colspan: String(COLUMNS) }, this.failure, this.logDetails)),
    );
    table.append(this.body);
  }

  update(s, tps) {
    this.status = s;
    const busy = this.pending !== undefined;
    this.body.dataset.state = s.state;
    setText(this.badge, s.sleeping ? `${s.state} · sleeping` : s.state); // sleep_idle: the child freed its model
    this.badge.className = `badge state-${s.state}`;
    setText(this.pathEl, s.path ? s.path.split("/").pop() : "");
    this.pathEl.title = s.path || "";
    // Its kind as the service's backends table names it ("whisper · speech to text"), then the
    // input its projector takes (mmproj); then the requests it answers, as the service says.
    const modalities = s.modalities || [];
    setText(this.modalEl, [s.label, ...modalities].filter(Boolean).join(" · "));
    this.modalEl.title = modalities.length ? `takes ${modalities.join(" and ")} input (mmproj)` : "";
    setText(this.servesEl, s.serves?.length ? `answers ${s.serves.join(" · ")}` : "");
    this.servesEl.title = "the requests the gateway sends it: its variants and adapters answer the same";
    setText(this.rulesEl, rules(s.residency || {}));
    this.rulesEl.title = "residency rules: what placement may not unload, its group, the warm default";
    setText(this.alsoEl, [...(s.variants || []), ...(s.adapters || [])].map((n) => `also ${n}`).join(" · "));
    this.alsoEl.title = "its variants and LoRA adapters: served by this model's child";
    setText(this.since, s.since ? `for ${duration(Math.max(0, serverNow() - s.since))}` : "");
    this.updateProgress(s);
    const running = ["loading", "ready", "draining"].includes(s.state);
    this.mem.replaceChildren(...(running ? memoryItems(s) : [h("li", { text: "–" })]));
    setText(this.pid, s.pid ? `${s.pid} · ${s.port}` : "–");
    setText(this.uptime, duration(s.uptime));
    // Restarts, then the watchdog's stalls and the unloads that yielded memory to other programs.
    const notes = [s.stalls ? `${s.stalls} stalled` : "", s.pressure_evictions ? `${s.pressure_evictions} yielded` : ""];
    setText(this.restarts, [String(s.restarts), ...notes.filter(Boolean)].join(" · "));
    this.restarts.title = "restarts · children killed stalled (stall_timeout) · unloads for other programs (vram_reserve)";
    this.restarts.className = s.restarts > 0 || s.stalls > 0 ? "warn" : "";
    const limit = s.max_concurrency ? `/${s.max_concurrency}` : "";
    setText(this.requests, `${s.in_flight}${limit} running\n${s.waiting} queued${queuedByClass(s.queue)}`);
    const rate = tps?.tokens_per_second;
    // Speculative decoding (draft = …): the share of drafted tokens the model accepted.
    const drafted = tps?.draft_acceptance === undefined ? "" : `\ndraft ${Math.round(tps.draft_acceptance * 100)}% accepted`;
    setText(this.tps, (rate === null || rate === undefined ? "–" : rate.toFixed(1)) + drafted);
    this.tps.title = drafted ? `${tps.draft_accepted} of ${tps.draft_tokens} drafted tokens accepted` : "";
    const ttl = s.ttl ? (s.ttl_left === null ? `off (${duration(s.ttl)})` : duration(s.ttl_left)) : "no TTL";
    setText(this.ttl, s.keep_context ? `${ttl}\n${savedContexts(s.contexts || {})}` : ttl);
    this.updateFailure(s);
    const st = s.state;
    this.buttons.load.disabled = busy || !["unloaded", "stopped", "failed"].includes(st);
    this.buttons.unload.disabled = busy || !["loading", "ready"].includes(st);
    this.buttons.reload.disabled = busy || st !== "ready";
  }

  updateProgress(s) {
    const loading = s.state === "loading";
    this.progressWrap.hidden = !loading;
    if (!loading) return;
    const elapsed = Math.max(0, serverNow() - s.since);
    if (s.load_seconds) {
      this.progress.value = Math.min(95, (100 * elapsed) / s.load_seconds);
      setText(this.progressText, `${duration(elapsed)} of ~${duration(s.load_seconds)} (last load)`);
    } else {
      this.progress.removeAttribute("value"); // indeterminate: no earlier load to compare with
      setText(this.progressText, `${duration(elapsed)}`);
    }
    const last = (s.log_last || [])[0];
    if (last) this.progressText.title = last;
  }

  updateFailure(s) {
    const failed = s.state === "failed" || (s.last_error && s.state !== "ready");
    this.failure.hidden = !failed;
    if (!failed) return;
    const lines = s.last_stderr || [];
    const key = `${s.last_error}\n${lines.join("\n")}`;
    if (this.failureKey === key) return;
    this.failureKey = key;
    this.failure.replaceChildren(
      h("p", { class: "error" }, h("strong", {}, s.failure_kind ? `${s.failure_kind}: ` : "failed: "), s.last_error || ""),
      lines.length ? h("pre", { class: "stderr", tabindex: "0", "aria-label": `${this.name} last stderr lines` }, lines.join("\n")) : null,
    );
  }

  async act(action) {
    this.pending = action;
    setText(this.actionMsg, `${action}…`);
    this.update(this.status || { state: "unloaded" });
    const path = `/api/models/${encodeURIComponent(this.name)}`;
    try {
      if (action === "reload") {
        await postJSON(`${path}/unload`);
        await postJSON(`${path}/load`);
      } else {
        await postJSON(`${path}/${action}`);
      }
      setText(this.actionMsg, "");
    } catch (err) {
      if (err instanceof AuthError) this.onError(err);
      setText(this.actionMsg, `${action} failed: ${err.message}`);
      this.actionMsg.className = "action-msg error";
    } finally {
      this.pending = undefined;
      this.update(this.status);
    }
  }

  async follow() {
    this.unfollow();
    const abort = new AbortController();
    this.logAbort = abort;
    this.logText.textContent = "";
    const kept = [];
    try {
      const r = await request(`/api/models/${encodeURIComponent(this.name)}/logs?follow=1&tail=100`, {
        signal: abort.signal,
      });
      for await (const line of lines(r)) {
        kept.push(line);
        if (kept.length > LOG_LINES) kept.splice(0, kept.length - LOG_LINES);
        const atEnd = this.logText.scrollTop + this.logText.clientHeight >= this.logText.scrollHeight - 24;
        this.logText.textContent = kept.join("\n");
        if (atEnd) this.logText.scrollTop = this.logText.scrollHeight;
      }
    } catch (err) {
      if (abort.signal.aborted) return;
      if (err instanceof AuthError) this.onError(err);
      else this.logText.textContent += `\n[log stream ended: ${err.message}]`;
    }
  }

  unfollow() {
    if (this.logAbort) this.logAbort.abort();
    this.logAbort = null;
  }

  remove() {
    this.unfollow();
    this.body.remove();
  }
}

export class ModelsTable {
  constructor(table, onError) {
    this.table = table;
    this.onError = onError;
    this.rows = new Map();
    this.tps = {};
  }

  /** ``admin``: whether the page's key may load and unload (the control API says so). */
  render(models, admin) {
    const seen = new Set();
    for (const s of models) {
      seen.add(s.name);
      let row = this.rows.get(s.name);
      if (!row) {
        row = new ModelRow(s.name, this.table, this.onError);
        this.rows.set(s.name, row);
      }
      row.buttonsEl.hidden = !admin;
      row.update(s, this.tps[s.name]);
    }
    for (const [name, row] of this.rows) {
      if (!seen.has(name)) {
        row.remove();
        this.rows.delete(name);
      }
    }
  }

  setThroughput(tps) {
    this.tps = tps;
    for (const [name, row] of this.rows) if (row.status) row.update(row.status, tps[name]);
  }

  clear() {
    for (const row of this.rows.values()) row.remove();
    this.rows.clear();
  }
}

// The queue per priority class (interactive, batch, background), where any but interactive waits.
function queuedByClass(q) {
  const w = (q && q.waiting) || {};
  if (!w.batch && !w.background) return "";
  return ` (${["interactive", "batch", "background"].map((c) => `${w[c] || 0} ${c}`).join(", ")})`;
}
