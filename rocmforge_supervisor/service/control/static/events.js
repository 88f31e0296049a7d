// The live event timeline: newest first, bounded.

import { clock, h } from "./dom.js";

const KEEP = 300;

// A save or restore: the whole action as forge waited for it (what the log says), then the
// child's own time for the file alone.
function took(ms, childMs) {
  const fmt = (x) => `${Number(x.toPrecision(3))} ms`;
  if (typeof ms !== "number") return typeof childMs === "number" ? fmt(childMs) : "–";
  return typeof childMs === "number" ? `${fmt(ms)} (llama-server: ${fmt(childMs)})` : fmt(ms);
}

function describe(ev) {
  const d = ev.data || {};
  switch (ev.kind) {
    case "state":
      return [ev.state, d.error || d.reason || (d.load_seconds ? `in ${d.load_seconds.toFixed(1)} s` : "")];
    case "crash":
      return ["crash", d.message || d.reason || ""];
    case "restart":
      return ["restart", `#${d.restarts} after ${d.backoff} s`];
    case "evict":
      return ["evicted", `for ${d.for_model}`];
    case "ttl":
      return ["ttl", `idle ${Math.round(d.idle_seconds)} s: unloading`];
    case "hang":
      return ["hang", `${d.failures} failed health checks`];
    case "stall":
      return ["stalled", `no progress for ${d.seconds} s with ${d.in_flight} request(s): restarting`];
    case "sleep":
      return [d.sleeping ? "sleeping" : "awake", d.sleeping ? "idle: the child freed its model (sleep_idle)" : "model reloaded"];
    case "pressure":
      return ["yielded", d.message || `memory on ${d.device}`];
    case "config":
      return ["config", Object.entries(d.changes || {}).filter(([, v]) => v.length).map(([k, v]) => `${k}: ${v.join(", ")}`).join("; ")];
    case "restart_required":
      return ["restart needed", d.message || (d.keys || []).join(", ")];
    case "context_saved":
      return ["context saved", `slot ${d.slot}: ${d.tokens} tokens in ${took(d.ms, d.save_ms)}`];
    case "context_restored":
      return ["context restored", `slot ${d.slot}: ${d.tokens} tokens in ${took(d.ms, d.restore_ms)}`];
    case "context_deleted":
      return ["context deleted", d.reason || ""];
    case "context_warning":
      return ["context warning", d.message || ""];
    case "ready":
      return ["ready", d.preloaded?.length ? `preloaded ${d.preloaded.join(", ")}` : "service ready"];
    default:
      return [ev.kind, JSON.stringify(d)];
  }
}

export class Timeline {
  constructor(list) {
    this.list = list;
    this.seen = new Set();
  }

  add(ev) {
    if (this.seen.has(ev.seq)) return; // never twice, whatever the stream repeats
    this.seen.add(ev.seq);
    const [what, detail] = describe(ev);
    const item = h(
      "li",
      { class: `event kind-${ev.kind} state-${ev.state || "none"}`, "data-kind": ev.kind, "data-model": ev.model },
      h("time", { datetime: new Date(ev.time * 1000).toISOString(), text: clock(ev.time) }),
      h("span", { class: "ev-model", text: ev.model === "*" ? "service" : ev.model }),
      h("span", { class: "badge", text: what }),
      h("span", { class: "ev-detail", text: detail || "" }),
    );
    // Keep seq order even when a replay arrives after live events.
    let before = null;
    for (const li of this.list.children) {
      if (Number(li.dataset.seq) < ev.seq) {
        before = li;
        break;
      }
    }
    item.dataset.seq = String(ev.seq);
    this.list.insertBefore(item, before);
    while (this.list.children.length > KEEP) this.list.lastElementChild.remove();
  }

  clear() {
    this.list.replaceChildren();
    this.seen.clear();
  }
}
