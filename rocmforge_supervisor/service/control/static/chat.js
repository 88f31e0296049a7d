// "Try it": stream a chat reply through the gateway and show time to first token and tokens/s.

import { AuthError, request, sse } from "./api.js";
import { h, setText } from "./dom.js";

export class Chat {
  constructor(onAuthError) {
    this.form = document.getElementById("chat-form");
    this.model = document.getElementById("chat-model");
    this.max = document.getElementById("chat-max");
    this.prompt = document.getElementById("chat-prompt");
    this.send = document.getElementById("chat-send");
    this.stop = document.getElementById("chat-stop");
    this.log = document.getElementById("chat-log");
    this.stats = document.getElementById("chat-stats");
    this.onAuthError = onAuthError;
    this.messages = [];
    this.abort = null;
    this.form.addEventListener("submit", (e) => {
      e.preventDefault();
      this.run();
    });
    this.prompt.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) {
        e.preventDefault();
        this.form.requestSubmit();
      }
    });
    this.stop.addEventListener("click", () => this.abort?.abort());
    document.getElementById("chat-clear").addEventListener("click", () => {
      this.abort?.abort();
      this.messages = [];
      this.log.replaceChildren();
      setText(this.stats, "");
    });
  }

  setModels(all) {
    // Every name a chat request can go to: the models whose status says they answer chat, each
    // with the variants and adapters its child serves under their own names (X:terse).
    const models = all.filter((m) => (m.serves || []).includes("chat"));
    const names = models.flatMap((m) => [m.name, ...(m.variants || []), ...(m.adapters || [])]);
    const current = [...this.model.options].map((o) => o.value);
    if (names.join("\n") === current.join("\n")) return;
    const chosen = this.model.value;
    this.model.replaceChildren(...names.map((n) => h("option", { value: n, text: n })));
    const ready = models.find((m) => m.state === "ready");
    this.model.value = names.includes(chosen) ? chosen : ready?.name || names[0] || "";
  }

  bubble(role, text) {
    const body = h("div", { class: "text", text });
    const li = h("li", { class: `msg ${role}` }, h("span", { class: "role", text: role }), body);
    this.log.append(li);
    li.scrollIntoView({ block: "nearest" });
    return body;
  }

  async run() {
    const text = this.prompt.value.trim();
    if (!text || this.abort) return;
    this.prompt.value = "";
    this.messages.push({ role: "user", content: text });
    this.bubble("user", text);
    const out = this.bubble("assistant", "");
    out.parentElement.classList.add("streaming");
    this.abort = new AbortController();
    this.send.disabled = true;
    this.stop.disabled = false;
    setText(this.stats, "waiting for the first token…");
    const t0 = performance.now();
    let tFirst = null;
    let chunks = 0;
    let usage = null;
    let timings = null;
    let reply = "";
    try {
      const r = await request("/v1/chat/completions", {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify({
          model: this.model.value,
          messages: this.messages,
          stream: true,
          stream_options: { include_usage: true },
          max_tokens: Number(this.max.value) || 128,
        }),
        signal: this.abort.signal,
      });
      for await (const ev of sse(r)) {
        if (ev.data === "[DONE]") break;
        const chunk = JSON.parse(ev.data);
        if (chunk.error) throw new Error(chunk.error.message || "the model failed");
        if (chunk.usage) usage = chunk.usage;
        if (chunk.timings) timings = chunk.timings;
        const piece = chunk.choices?.[0]?.delta?.content;
        if (piece) {
          if (tFirst === null) tFirst = performance.now();
          chunks += 1;
          reply += piece;
          out.textContent = reply;
          this.showStats(t0, tFirst, chunks, usage, timings, false);
        }
      }
      this.messages.push({ role: "assistant", content: reply });
      this.showStats(t0, tFirst, chunks, usage, timings, true);
    } catch (err) {
      if (err instanceof AuthError) this.onAuthError(err);
      const stopped = this.abort.signal.aborted;
      out.append(h("span", { class: "error", text: stopped ? " [stopped]" : ` [${err.message}]` }));
      if (!stopped) setText(this.stats, `failed: ${err.message}`);
      this.messages.pop();
    } finally {
      out.parentElement.classList.remove("streaming");
      this.abort = null;
      this.send.disabled = false;
      this.stop.disabled = true;
    }
  }

  showStats(t0, tFirst, chunks, usage, timings, done) {
    if (tFirst === null) {
      setText(this.stats, done ? "no tokens came back" : "waiting…");
      return;
    }
    const now = performance.now();
    const tokens = usage?.completion_tokens ?? chunks;
    // After the first token: (tokens − 1) more in the time since. The server's own figure wins when it sends one.
    const measured = tokens > 1 ? ((tokens - 1) * 1000) / Math.max(1, now - tFirst) : null;
    const rate = done && timings?.predicted_per_second ? timings.predicted_per_second : measured;
    const parts = [`TTFT ${Math.round(tFirst - t0)} ms`];
    if (rate) parts.push(`${rate.toFixed(1)} tokens/s`);
    parts.push(`${tokens} tokens${done ? "" : "…"}`);
    this.stats.dataset.done = done ? "1" : "0";
    setText(this.stats, parts.join(" · "));
  }
}
